"""Read windows that start before an axis and end past it, with one pad mode per axis.

A halo's window starts before the array; a patch of ``boundary="pad"`` or one
running past a periodic seam ends past it. The core reads such windows from the
array itself (no padded copy), and every reader agrees with ``numpy.pad`` of the
whole array, on both sides, per axis.
"""

from __future__ import annotations

import tracemalloc

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch  # noqa: F401
from xpatch.core.extract import extract_dask, extract_numpy
from xpatch.core.padding import source_indices
from xpatch.core.plan import ChunkGrid, Plan

MODES = ("constant", "edge", "wrap", "reflect", "symmetric")


def padded_reference(array, widths, modes, fill):
    """np.pad of the whole array, one axis after the other (each in its own mode)."""
    for axis, (width, mode) in enumerate(zip(widths, modes)):
        pad = [(0, 0)] * array.ndim
        pad[axis] = width
        kwargs = {"constant_values": fill} if mode == "constant" else {}
        array = np.pad(array, pad, mode=mode, **kwargs)
    return array


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 7),
    before=st.integers(0, 7),
    after=st.integers(0, 7),
    mode=st.sampled_from(MODES),
)
def test_source_indices_equal_numpy_pad_on_both_sides(n, before, after, mode):
    kwargs = {"constant_values": -1} if mode == "constant" else {}
    expected = np.pad(np.arange(n), (before, after), mode=mode, **kwargs)
    assert source_indices(-before, n + after, n, mode).tolist() == expected.tolist()


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(2, 9), st.integers(2, 9)),
    size=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    halo=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    modes=st.tuples(st.sampled_from(MODES), st.sampled_from(MODES)),
    chunks=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    data=st.data(),
)
def test_windows_outside_the_array_equal_numpy_pad_of_the_whole(
    shape, size, halo, modes, chunks, data
):
    halo = tuple(min(h, n) for h, n in zip(halo, shape))
    array = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    count = data.draw(st.integers(1, 6))
    starts = [
        data.draw(st.lists(st.integers(-h, n - 1), min_size=count, max_size=count))
        for h, n in zip(halo, shape)
    ]
    anchors = np.array(starts).T
    # The reference: the whole array padded wide enough, windows sliced out of it.
    widths = [(h, s + n) for h, s, n in zip(halo, size, shape)]
    reference = padded_reference(array, widths, modes, -7.0)
    expected = np.stack(
        [
            reference[y + halo[0] : y + halo[0] + size[0], x + halo[1] : x + halo[1] + size[1]]
            for y, x in anchors
        ]
    )
    eager = extract_numpy(array, [0, 1], anchors, size, -7.0, modes)
    np.testing.assert_array_equal(eager, expected)
    lazy_input = da.from_array(array, chunks=chunks)
    plan = Plan.compile(anchors, ChunkGrid.from_chunks(lazy_input.chunks), size, keep_order=True)
    lazy = extract_dask(lazy_input, [0, 1], plan, -7.0, modes)
    np.testing.assert_array_equal(lazy.compute(), expected)
    assert array.tolist() == np.arange(np.prod(shape)).reshape(shape).tolist()  # untouched


@pytest.mark.parametrize(
    ("options", "grown"),
    [
        ({"halo": 2, "boundary": "pad", "pad_mode": "reflect"}, 68),
        ({"halo": {"x": 3}}, 70),
        ({"boundary": {"x": "periodic"}}, 64),
        ({"boundary": {"x": "periodic"}, "halo": 2}, 68),
    ],
    ids=["halo-reflect", "halo-constant", "periodic", "periodic-halo"],
)
def test_a_window_past_the_edge_reads_the_array_not_a_padded_copy(options, grown):
    # 32 MiB in memory: a padded copy of it (the way halos and seams were read before)
    # would allocate as much again for one patch.
    field = xr.DataArray(np.random.default_rng(0).random((2048, 2048)), dims=("y", "x"))
    tracemalloc.start()
    p = field.patch(y=64, x=64, stride=48, **options)
    first, last = p[0], p[len(p) - 1]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB to lay and read two patches of 32 MiB"
    assert first.sizes["x"] == last.sizes["x"] == grown


@pytest.mark.parametrize("anchor", [-2, 4])
def test_a_window_wholly_outside_a_constant_axis_is_all_fill(anchor):
    array = np.arange(16.0).reshape(4, 4)
    anchors = np.array([[anchor, 1]])
    expected = np.full((1, 2, 2), -7.0)
    np.testing.assert_array_equal(extract_numpy(array, [0, 1], anchors, [2, 2], -7.0), expected)
    lazy = da.from_array(array, chunks=1)
    plan = Plan.compile(anchors, ChunkGrid.from_chunks(lazy.chunks), [2, 2], keep_order=True)
    np.testing.assert_array_equal(extract_dask(lazy, [0, 1], plan, -7.0).compute(), expected)
