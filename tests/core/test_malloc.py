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
src = da.patch(y=8, x=8).to_grain()
da.patch(y=8, x=8).to_grain()  # a second source: already applied
print(calls)
"""


def probe(env: dict[str, str]) -> list[tuple[int, int]]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


def test_a_grain_source_bounds_the_arenas_once_before_its_threads_start():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    calls = probe(env)
    from xpatch.core.malloc import M_ARENA_MAX

    assert calls == [(M_ARENA_MAX, max(len(os.sched_getaffinity(0)), 2))]


def test_the_users_malloc_arena_max_wins():
    assert probe({**os.environ, "MALLOC_ARENA_MAX": "8"}) == []
