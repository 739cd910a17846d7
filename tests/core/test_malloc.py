"""glibc's allocator settings: applied once per process, never over the user's own."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only"
)

PROBE = """
import xarray as xr, numpy as np, xpatch
from xpatch.core import malloc
calls = []
libc = malloc._libc()
real = libc.mallopt
class Spy:
    def __getattr__(self, name):
        return getattr(libc, name)
    def mallopt(self, parameter, value):
        calls.append((parameter, value))
        return real(parameter, value)
malloc._libc.cache_clear()
malloc._libc = lambda: Spy()
da = xr.DataArray(np.zeros((64, 64), "float32"), dims=("y", "x")).chunk(16)
src = da.patch(y=8, x=8).to_grain(cache_bytes=2**20)
da.patch(y=8, x=8).to_grain(cache_bytes=2**20)  # a second source: already applied
print(calls)
"""


MALLOC_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def probe(env: dict[str, str]) -> list[tuple[int, int]]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


def test_a_grain_source_sets_the_allocator_once_before_its_threads_start():
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}
    calls = probe(env)
    from xpatch.core.malloc import HEAP_BLOCKS, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD

    # The arenas were bounded when xpatch was imported, before the spy.
    assert calls == [
        (M_MMAP_THRESHOLD, HEAP_BLOCKS),
        (M_TRIM_THRESHOLD, HEAP_BLOCKS),  # the budget (1 MiB) is less: glibc's ceiling
    ]


def test_the_users_malloc_variables_win():
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}
    assert probe({**env, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "1"}) == []
    assert arenas_after_eight_threads({**env, "MALLOC_ARENA_MAX": "8"}) > 2


#: Eight threads alive at once, each allocating (numpy's buffers come from malloc):
#: without a limit each takes an arena of its own. Prints how many heaps glibc has.
THREADS = """
import ctypes, re, tempfile, threading
import numpy as np
import xpatch

held = []
barrier = threading.Barrier(8)
def work():
    held.append(np.ones(50_000))
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    handle = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, handle)
    libc.fclose(handle)
    print(len(re.findall("<heap nr=", open(out.name).read())))
"""


def arenas_after_eight_threads(env: dict[str, str]) -> int:
    run = subprocess.run(
        [sys.executable, "-c", THREADS], env=env, capture_output=True, text=True, check=True
    )
    return int(run.stdout.strip().splitlines()[-1])


def test_threads_started_after_import_share_one_heap_per_four_cores():
    # A store's threads (obstore's, zarr's event loop) start when the data is opened,
    # after ``import xpatch``: the bound must already hold (it is fixed for good once
    # more than eight heaps exist).
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}
    assert arenas_after_eight_threads(env) <= max(len(os.sched_getaffinity(0)) // 4, 1)
