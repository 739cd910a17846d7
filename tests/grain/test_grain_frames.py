"""Chunk frames: a chunk-shuffled epoch reads each chunk once, and every item stays exact."""

from __future__ import annotations

import threading

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from xpatch.core.chunk_cache import ChunkCache, FrameKey
from xpatch.core.chunk_frames import FrameLayout, covering_slab
from xpatch.core.plan import ChunkGrid

grain = pytest.importorskip("grain")


def scene(n: int = 96, chunk: int = 32, bands: int = 3) -> tuple[np.ndarray, xr.DataArray]:
    values = np.random.default_rng(1).normal(size=(bands, n, n)).astype("float32")
    lazy = xr.DataArray(
        dsa.from_array(values, chunks=(bands, chunk, chunk)), dims=("band", "y", "x")
    )
    return values, lazy


def reference_items(values: np.ndarray, **options) -> dict[tuple, np.ndarray]:
    """Every patch cut from the numpy array by the same layout (no cache), by anchor."""
    src = xr.DataArray(values, dims=("band", "y", "x")).patch(**options).to_grain()
    return {tuple(src[i]["anchor"].tolist()): src[i]["data"] for i in range(len(src))}


def assert_exact(item: dict, expected: dict) -> None:
    np.testing.assert_array_equal(item["data"], expected[tuple(item["anchor"].tolist())])


def test_a_chunk_shuffled_epoch_reads_each_chunk_once_when_the_frames_fit():
    values, lazy = scene()
    options = {"y": 8, "x": 8, "stride": 6}
    chunk_bytes = 3 * 32 * 32 * 4
    src = lazy.patch(**options).to_grain(cache_bytes=5 * chunk_bytes)
    assert (src.touched_chunks()[:, 1] >= 0).sum() > 0  # patches straddle chunk borders
    assert src.shuffle_groups().ndim == 2
    dataset = src.chunk_shuffle(seed=5, order="chunk")
    expected = reference_items(values, **options)
    for position in range(len(dataset)):
        assert_exact(dataset[position], expected)
    assert src.cache_stats().loads == src.chunk_count == 9
    # Frames keep serving the exact values in the next epoch too.
    for position in range(len(dataset), 2 * len(dataset)):
        assert_exact(dataset[position], expected)


def test_without_room_for_the_frames_the_shuffle_groups_by_anchor_chunk():
    _, lazy = scene()
    src = lazy.patch(y=8, x=8, stride=6).to_grain(cache_bytes=2 * 3 * 32 * 32 * 4)
    np.testing.assert_array_equal(src.shuffle_groups(), src.chunk_of_patch())
    src.chunk_shuffle(seed=0, order="chunk")
    assert src.cache_stats().loads == 0  # building the shuffle reads nothing


def test_patches_that_never_cross_a_border_keep_the_anchor_order():
    _, lazy = scene()
    src = lazy.patch(y=8, x=8, stride=8).to_grain()
    np.testing.assert_array_equal(src.shuffle_groups(), src.chunk_of_patch())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(20, 48),
    chunk=st.integers(6, 20),
    size=st.integers(2, 10),
    stride=st.integers(1, 10),
    cache_chunks=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    threaded=st.booleans(),
)
def test_property_every_chunk_shuffled_item_equals_the_direct_cut(
    n, chunk, size, stride, cache_chunks, seed, threaded
):
    values, lazy = scene(n, chunk, bands=2)
    options = {"y": size, "x": size, "stride": min(stride, size)}
    src = lazy.patch(**options).to_grain(cache_bytes=cache_chunks * 2 * chunk * chunk * 4)
    floor = src.memory_report().floor_bytes
    if src.memory_report().below_floor:  # refused before any read; the floor is accepted
        with pytest.raises(xpatch.OptionError, match=f"cache_bytes >= {floor}"):
            src.chunk_shuffle(seed=seed)
        src = lazy.patch(**options).to_grain(cache_bytes=floor)
    dataset = src.chunk_shuffle(seed=seed)
    expected = reference_items(values, **options)
    if threaded:  # Grain's 16 read threads share the cache
        items = list(dataset.to_iter_dataset())
    else:
        items = [dataset[i] for i in range(len(dataset))]
    assert sorted(int(item["index"]) for item in items) == list(range(len(src)))
    for item in items:
        assert_exact(item, expected)
    # With frames on, a plain pass in patch order is exact too.
    for i in range(len(src)):
        assert_exact(src[i], expected)


def test_frame_layout_measures_each_border_and_slabs_cover_the_straddling_pieces():
    grid = ChunkGrid.from_chunks([(10, 10, 10)])
    layout = FrameLayout.measure(grid, np.array([[0], [7], [17], [26]]), [4])
    assert layout.low == ((0, 1, 1),) and layout.high == ((3, 3, 0),)
    slabs = layout.slabs(grid, (1,))
    assert slabs == [(slice(10, 11),), (slice(17, 20),)]
    frame = [(slab, {}) for slab in slabs]
    assert covering_slab(frame, (slice(10, 11),))[0] == (slice(10, 11),)  # patch at 7
    assert covering_slab(frame, (slice(17, 20),))[0] == (slice(17, 20),)  # patch at 17
    assert covering_slab(frame, (slice(12, 16),)) is None  # inside: needs the chunk


def test_cache_evicts_chunks_before_frames_and_serves_from_a_frame():
    shrunk = []

    def shrink(key, value):
        shrunk.append(key)
        return [np.zeros(2, np.uint8)]  # 2 bytes stand in for a 10-byte chunk

    cache = ChunkCache(max_bytes=25, shrink=shrink)
    for key in "abc":
        cache.get(key, lambda: np.zeros(10, np.uint8))
    assert shrunk == ["a"]  # 30 bytes > 25: the oldest chunk became its frame
    cache.get("d", lambda: np.zeros(10, np.uint8))
    assert shrunk == ["a", "b"]  # the next chunk goes, not a's frame
    whole, served = cache.get_or_frame("a", lambda frame: "from frame", lambda: 1 / 0)
    assert (whole, served) == (False, "from frame")
    whole, value = cache.get_or_frame("a", lambda frame: None, lambda: np.ones(10, np.uint8))
    assert whole and value.sum() == 10  # the frame could not serve: the chunk is loaded
    assert cache.stats().loads == 5
    assert FrameKey("a") not in cache._entries  # the chunk replaced its frame


def test_a_frame_is_cut_outside_the_lock_and_a_chunk_reloaded_meanwhile_is_kept_whole():
    reloaded = []

    def shrink(key, value):
        # Another thread drops and reloads the chunk while its frame is cut.
        other = threading.Thread(
            target=lambda: (
                cache.release(key),
                reloaded.append(cache.get(key, lambda: np.ones(10, np.uint8))),
            )
        )
        other.start()
        other.join(timeout=5)
        return [value[:2].copy()]

    cache = ChunkCache(max_bytes=100, shrink=shrink)
    cache.get("a", lambda: np.zeros(10, np.uint8))
    cache.release("a", keep_frame=True)
    assert len(reloaded) == 1  # the other thread was not held by the cut
    assert FrameKey("a") not in cache._entries  # the frame of the old chunk is not kept
    assert cache.get("a", lambda: 1 / 0) is reloaded[0]
    assert cache.stats().cached_bytes == 10


def test_the_fingerprint_names_the_grouping_so_a_checkpoint_cannot_change_order():
    _, lazy = scene()
    chunk_bytes = 3 * 32 * 32 * 4
    frames = lazy.patch(y=8, x=8, stride=6).to_grain(cache_bytes=5 * chunk_bytes)
    anchors = lazy.patch(y=8, x=8, stride=6).to_grain(cache_bytes=2 * chunk_bytes)
    assert frames.shuffle_groups().ndim == 2 and anchors.shuffle_groups().ndim == 1
    assert frames.fingerprint != anchors.fingerprint
    roomy = lazy.patch(y=8, x=8, stride=6).to_grain(cache_bytes=9 * chunk_bytes)
    assert roomy.fingerprint == frames.fingerprint  # the same order


def test_a_failing_shrink_neither_hangs_waiters_nor_fails_the_load():
    import threading
    import time

    def shrink(key, value):
        raise MemoryError("no room for the frame")

    cache = ChunkCache(max_bytes=100, shrink=shrink)
    cache.get("a", lambda: np.zeros(60, np.uint8))
    started = threading.Event()

    def slow_load():
        started.set()
        time.sleep(0.2)
        return np.ones(60, np.uint8)

    results = {}
    first = threading.Thread(target=lambda: results.setdefault(1, cache.get("b", slow_load)))
    first.start()
    started.wait()
    second = threading.Thread(target=lambda: results.setdefault(2, cache.get("b", lambda: 1 / 0)))
    second.start()
    first.join(5)
    second.join(5)
    assert not first.is_alive() and not second.is_alive()
    assert results[1].sum() == results[2].sum() == 60
    assert cache.stats().loads == 2 and cache.stats().cached_bytes == 60  # "a" went whole
