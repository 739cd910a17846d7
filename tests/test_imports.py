"""What ``import xpatch`` and training on a zarr opened without dask leave unimported.

``dask.array`` (which pulls in scipy) costs a process about 20 MiB; a zarr opened
without dask chunks is read by its own chunks, so training on it never needs it.
Each check runs in a fresh interpreter: the test process has imported everything.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

SHAPE = (2, 20, 24)

# The data the child reads back: the same numbers it builds to compare against.
DATA = f"""
import numpy as np

t = np.arange({np.prod(SHAPE)}, dtype="float32").reshape({SHAPE})
m = (np.arange({np.prod(SHAPE[1:])}) % 997).astype("int16").reshape({SHAPE[1:]})
"""

# Opens the zarr without dask chunks and builds the patcher and its Grain source.
OPEN = """
import sys

import xarray as xr
import xpatch

assert "dask.array" not in sys.modules, "import xpatch imported dask.array"
assert "scipy" not in sys.modules, "import xpatch imported scipy"
data = xr.open_zarr(sys.argv[1], chunks=None)
src = data.patch(y=6, x=6, stride=4).to_grain()


def check_item(item, index):
    y, x = (int(a) for a in item["anchor"])
    assert int(item["index"]) == index
    assert np.array_equal(item["t"], t[:, y : y + 6, x : x + 6]), (index, y, x)
    assert np.array_equal(item["m"], m[y : y + 6, x : x + 6]), (index, y, x)
"""

NOT_IMPORTED = """
assert "dask.array" not in sys.modules, "the no-dask Grain path imported dask.array"
assert "scipy" not in sys.modules, "the no-dask Grain path imported scipy"
print("ok")
"""


def run_child(code: str, zarr_path: Path) -> None:
    """Run ``code`` in a fresh interpreter with the zarr's path as its argument."""
    script = textwrap.dedent(DATA) + textwrap.dedent(OPEN) + textwrap.dedent(code)
    script += textwrap.dedent(NOT_IMPORTED)
    done = subprocess.run(
        [sys.executable, "-c", script, str(zarr_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok"), done.stdout


@pytest.fixture
def zarr_path(tmp_path: Path) -> Path:
    """A small zarr whose chunks some patches lie inside and others straddle.

    Written here, not in the child: xarray imports dask.array (when installed)
    whenever it builds a variable from a numpy array.
    """
    t = np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE)
    m = (np.arange(np.prod(SHAPE[1:])) % 997).astype("int16").reshape(SHAPE[1:])
    data = xr.Dataset({"t": (("band", "y", "x"), t), "m": (("y", "x"), m)})
    path = tmp_path / "data.zarr"
    data.to_zarr(path, encoding={"t": {"chunks": (1, 8, 8)}, "m": {"chunks": (8, 8)}})
    return path


def test_items_and_batches_without_dask_array(zarr_path: Path) -> None:
    run_child(
        """
        from xpatch.grain import BatchSource

        assert len(src) == 30
        for i in range(len(src)):
            check_item(src[i], i)
        batches = BatchSource(src, 4, seed=0)
        served = []
        for k in range(len(batches)):
            batch = batches[k]
            for row, index in enumerate(batch["index"].tolist()):
                check_item({key: value[row] for key, value in batch.items()}, index)
                served.append(index)
        assert sorted(served) == list(range(len(src))), served
        """,
        zarr_path,
    )


def test_grain_datasets_without_dask_array(zarr_path: Path) -> None:
    pytest.importorskip("grain")
    run_child(
        """
        import grain
        from xpatch.grain import BatchSource

        def served(dataset):
            indices = []
            for batch in dataset:
                for row, index in enumerate(batch["index"].tolist()):
                    check_item({key: value[row] for key, value in batch.items()}, index)
                    indices.append(index)
            assert sorted(indices) == list(range(len(src))), indices

        served(BatchSource(src, 4, seed=1).dataset())
        served(grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1).batch(16))
        """,
        zarr_path,
    )
