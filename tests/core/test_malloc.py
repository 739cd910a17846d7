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
    from xpatch.core.malloc import HEAP_BLOCKS, M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD

    assert calls == [
        (M_ARENA_MAX, max(len(os.sched_getaffinity(0)), 2)),
        (M_MMAP_THRESHOLD, HEAP_BLOCKS),
        (M_TRIM_THRESHOLD, HEAP_BLOCKS),  # the budget (1 MiB) is less: glibc's ceiling
    ]


def test_the_users_malloc_variables_win():
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}
    from xpatch.core.malloc import M_ARENA_MAX

    assert probe({**env, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "1"}) == [
        (M_ARENA_MAX, max(len(os.sched_getaffinity(0)), 2))
    ]
    assert probe({**env, **dict.fromkeys(MALLOC_VARIABLES, "8")}) == []
