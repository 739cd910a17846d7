"""A chunk-shuffled epoch over a periodic dim reads the seam's chunks about once.

A patch across the seam (or a halo before the start) reads the chunks at the other
end; the chunk ids the sweep plans with say so (``ChunkGrid.touched_ids(pad_modes=...)``),
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
    loads_per_chunk = []
    for _ in range(3):
        src = p.to_grain(cache_bytes=12 * 64 * 128 * 4)  # 12 of the 32 chunks
        # No reads ahead and no Grain threads: the count measures the sweep's plan. The
        # order in which a patch's chunks land in the cache still varies from run to run
        # (one epoch in 15 reads two or three chunks more), hence the best of three.
        pipeline = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1, read_ahead=0)
        seen = {int(item["index"]): item["data"] for item in pipeline}
        assert sorted(seen) == list(range(len(p)))
        for i in (0, len(p) - 1, len(p) // 2):  # the seam's patches among them
            np.testing.assert_array_equal(seen[i], p[i].values)
        loads_per_chunk.append(src.cache_stats().loads / src.chunk_count)
    # Without the wrapped chunk ids (0ca868c^) 1.125-1.28 loads per chunk in every run;
    # with them 1.00-1.06 in most (15 runs each).
    assert min(loads_per_chunk) <= 1.07, loads_per_chunk


def test_touched_ids_wrap_only_where_asked():
    grid = ChunkGrid.from_chunks([(4, 4), (4, 4, 4)])
    anchors = np.array([[6, 10], [-2, -2]])
    # y ends (the cells past it are padding); x wraps to its first chunk.
    assert grid.touched_ids(anchors, [4, 4], pad_modes=["constant", "wrap"]).tolist() == [
        [5, 3],
        [2, 0],
    ]
    assert grid.touched_ids(anchors, [4, 4]).tolist() == [[5], [0]]
    # A window longer than a turn lists each chunk once.
    (row,) = grid.touched_ids(np.array([[0, -6]]), [1, 24], pad_modes=["constant", "wrap"]).tolist()
    assert sorted(c for c in row if c >= 0) == [0, 1, 2]
