"""A chunk-shuffled epoch over a periodic dim reads the seam's chunks about once.

A patch across the seam (or a halo before the start) reads the chunks at the other
end; the chunk ids the sweep plans with say so (``ChunkGrid.touched_ids(wraps=...)``),
so the sweep holds them for the patches that wrap instead of reading them again.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from xpatch.core.plan import ChunkGrid

grain = pytest.importorskip("grain")


@pytest.mark.parametrize(
    "options",
    [{"boundary": {"x": "periodic"}}, {"boundary": {"x": "periodic"}, "halo": 8}],
    ids=["periodic", "periodic-halo"],
)
def test_an_epoch_across_the_seam_reads_each_chunk_about_once(options):
    values = np.random.default_rng(0).random((256, 1024)).astype("float32")
    field = xr.DataArray(values, dims=("y", "x")).chunk({"y": 64, "x": 128})
    p = field.patch(y=64, x=96, stride=48, **options)
    src = p.to_grain(cache_bytes=12 * 64 * 128 * 4)  # 12 of the 32 chunks
    # One reading thread and no reads ahead: the count measures the sweep's plan, not
    # how Grain's threads happened to interleave with the cache.
    pipeline = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1, read_ahead=0)
    seen = {}
    for item in pipeline:
        seen[int(item["index"])] = item["data"]
    assert sorted(seen) == list(range(len(p)))
    for i in (0, len(p) - 1, len(p) // 2):  # the seam's patches among them
        np.testing.assert_array_equal(seen[i], p[i].values)
    # Without the wrapped chunk ids (0ca868c^): 1.125-1.28 loads per chunk; with them
    # 1.00-1.06 (three runs each, on a busy machine too).
    assert src.cache_stats().loads / src.chunk_count <= 1.10


def test_touched_ids_wrap_only_where_asked():
    grid = ChunkGrid.from_chunks([(4, 4), (4, 4, 4)])
    anchors = np.array([[6, 10], [-2, -2]])
    # y ends (the cells past it are padding); x wraps to its first chunk.
    assert grid.touched_ids(anchors, [4, 4], wraps=[False, True]).tolist() == [[5, 3], [2, 0]]
    assert grid.touched_ids(anchors, [4, 4]).tolist() == [[5], [0]]
    # A window longer than a turn lists each chunk once.
    (row,) = grid.touched_ids(np.array([[0, -6]]), [1, 24], wraps=[False, True]).tolist()
    assert sorted(c for c in row if c >= 0) == [0, 1, 2]
