"""GDAL's block cache is bounded for reads through on_grid, unless the user chose its size.

GDAL's cache is one per process (5 % of the RAM by default) and fills with every block
read: one epoch over a 4 x 10980² scene with its labels peaked at 1.8 GiB with it
(``benchmarks/bench_grid_memory.py``). on_grid lowers it to 64 MiB when it builds,
and each warp task does in the process it runs in (a worker that only unpickled the
graph, checked in a fresh process: the cache is process-wide); ``GDAL_CACHEMAX`` in
the environment or in an active ``rasterio.Env`` wins.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import rasterio
import rioxarray  # noqa: F401  (registers .rio)

import xpatch
from tests.conftest import forbid_compute
from tests.grid.test_on_grid import make_labels, make_scene
from xpatch.grid import warp
from xpatch.grid.warp import GDAL_CACHE_BYTES, bound_gdal_cache

WORKER = """
import pickle, sys, rasterio
before = rasterio.env.get_gdal_config("GDAL_CACHEMAX")
with open(sys.argv[1], "rb") as f:
    pickle.load(f).compute(scheduler="synchronous")
print(before, rasterio.env.get_gdal_config("GDAL_CACHEMAX"))
"""


def test_a_process_that_only_computes_on_grids_graph_lowers_gdals_cache(tmp_path):
    path = tmp_path / "graph.pkl"
    path.write_bytes(pickle.dumps(xpatch.on_grid(make_scene(), labels=make_labels()).labels.data))
    environ = {k: v for k, v in os.environ.items() if k != "GDAL_CACHEMAX"}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(path)], capture_output=True, text=True, env=environ
    )
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert before > GDAL_CACHE_BYTES  # GDAL's default: 5 % of the RAM
    assert after == GDAL_CACHE_BYTES


def test_building_bounds_it_before_any_read(monkeypatch):
    calls = []
    monkeypatch.setattr(warp, "bound_gdal_cache", lambda: calls.append(1))
    with forbid_compute():
        xpatch.on_grid(make_scene(), labels=make_labels())
    assert calls == [1]


def test_gdal_cachemax_in_the_environment_or_in_rasterio_env_is_kept(monkeypatch):
    with rasterio.Env(GDAL_CACHEMAX=512 * 2**20):
        assert bound_gdal_cache() is False
        xpatch.on_grid(make_scene(), labels=make_labels()).labels.compute()
        assert rasterio.env.get_gdal_config("GDAL_CACHEMAX") == 512 * 2**20
    monkeypatch.setenv("GDAL_CACHEMAX", "300")
    assert bound_gdal_cache() is False
