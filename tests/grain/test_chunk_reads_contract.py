"""A source's items and its chunk reads are two contracts: the pipelines read chunks
through ``source.chunk_reads`` only, and a wrapper of another source's items gets the
inner source's chunk reads (one chunk load per epoch) from ``WrappedSource`` alone."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch
from xpatch import Forecast
from xpatch.grain.base import Source, WrappedSource
from xpatch.grain.readahead import ChunkReads

grain = pytest.importorskip("grain")

#: The members of the chunk-read contract, as the Protocol declares them.
CONTRACT = [
    name
    for name in vars(ChunkReads)
    if not name.startswith("_") and callable(vars(ChunkReads)[name])
]


def chunked_field() -> xr.DataArray:
    """24 x 24 in 8 x 8 chunks: 9 chunks, 6 x 6 patches at stride 4 straddle them."""
    values = np.arange(24 * 24, dtype="float64").reshape(24, 24)
    return xr.DataArray(values, dims=("y", "x")).chunk(8)


class Negated(WrappedSource):
    """A wrapper that says only how to build its items and what identifies them."""

    def __getitem__(self, index: int) -> dict:
        item = self.inner[index]
        return {**item, "data": -item["data"]}

    def make_fingerprint(self) -> str:
        return ("negated" + self.inner.fingerprint)[:16]


class ItemsOnly(Source):
    """A source with no chunk-read member of its own: only ``chunk_reads`` hands them."""

    def __init__(self, inner: Source) -> None:
        self.reads = inner
        self._fingerprint = None

    def __len__(self) -> int:
        return len(self.reads)

    def __getitem__(self, index: int) -> dict:
        return self.reads[index]

    @property
    def chunk_reads(self) -> Source:
        return self.reads

    @property
    def patcher(self):
        return self.reads.patcher

    @property
    def variables(self):
        return self.reads.variables

    def make_fingerprint(self) -> str:
        return self.reads.fingerprint


def test_the_contract_names_the_members_the_pipelines_use():
    assert sorted(CONTRACT) == sorted(
        [
            "chunk_grids",
            "chunk_of_patch",
            "fetch_chunk_bytes",
            "fetch_depth",
            "read_ahead",
            "release",
            "set_sweep_direction",
            "shuffle_groups",
            "sweep_settings",
            "touched_chunks",
        ]
    )


def test_a_wrapper_of_getitem_and_fingerprint_alone_reads_each_chunk_once_per_epoch():
    field = chunked_field()
    inner = field.patch(y=6, x=6, stride=4).to_grain()
    src = Negated(inner)
    assert src.chunk_reads is inner
    assert len(src) == len(inner) == 36
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=7)
    seen = []
    for item in dataset.to_iter_dataset(grain.ReadOptions(num_threads=2)):
        i = int(item["index"])
        seen.append(i)
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], -field.values[y : y + 6, x : x + 6])
    assert sorted(seen) == list(range(len(src)))
    assert seen != sorted(seen)
    # Straddling patches at stride 4 over 8-cell chunks: each of the 9 chunks read once.
    assert src.chunk_count == 9
    assert src.cache_stats().loads == 9
    # The same order as the inner source's: the order is the chunk reads'.
    np.testing.assert_array_equal(
        src.chunk_shuffled_order(seed=7), inner.chunk_shuffled_order(seed=7)
    )


def test_the_pipelines_ask_chunk_reads_not_the_item_source():
    inner = chunked_field().patch(y=6, x=6, stride=4).to_grain()
    src = ItemsOnly(inner)
    assert not any(hasattr(src, name) for name in CONTRACT)
    for order in ("sweep", "chunk"):
        inner.clear_cache()
        dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1, order=order)
        served = sorted(int(item["index"]) for item in dataset)
        assert served == list(range(len(src)))
        assert inner.cache_stats().loads == 9, order  # the inner source read each chunk once
    assert src.anchor_chunks_per_batch(np.arange(len(src)), batch_size=5) >= 1


def test_a_wrapper_pickles_with_its_inner_reads_and_fingerprint():
    src = Negated(chunked_field().patch(y=6, x=6, stride=4).to_grain())
    fingerprint = src.fingerprint
    copy = pickle.loads(pickle.dumps(src))
    assert copy.chunk_reads is copy.inner
    assert copy.fingerprint == fingerprint
    np.testing.assert_array_equal(copy[3]["data"], src[3]["data"])


def test_sources_that_read_their_own_chunks_are_their_own_chunk_reads():
    da = chunked_field()
    patch_source = da.patch(y=6, x=6, stride=4).to_grain()
    scene_source = xpatch.patch_scenes({"a": da, "b": da + 1}, y=6, x=6).to_grain()
    for src in (patch_source, scene_source):
        assert src.chunk_reads is src
        for name in CONTRACT:
            assert callable(getattr(src.chunk_reads, name)), (type(src).__name__, name)


def test_the_read_ahead_of_a_forecast_source_is_handed_its_inner_patch_source(monkeypatch):
    import xpatch.grain.datasets as datasets

    times = pd.date_range("2021-01-01", periods=12, freq="6h")
    values = np.arange(12 * 8 * 8, dtype="float32").reshape(12, 8, 8)
    data = xr.DataArray(values, dims=("time", "y", "x"), coords={"time": times}).chunk(
        {"time": 4, "y": 4, "x": 4}
    )
    src = data.patch(time=Forecast(inputs=["-6h", "0h"], targets=["6h"]), y=4, x=4).to_grain()
    handed = []

    class Recording(datasets.SweepReads):
        def __init__(self, chunk_reads, *args, **kwargs):
            handed.append(chunk_reads)
            super().__init__(chunk_reads, *args, **kwargs)

    monkeypatch.setattr(datasets, "SweepReads", Recording)
    served = sorted(int(item["index"]) for item in src.chunk_shuffle(seed=2))
    assert served == list(range(len(src)))
    assert len(handed) == 1
    assert handed[0] is src.inner is src.chunk_reads
    assert type(handed[0]) is xpatch.grain.PatchSource
    assert src.cache_stats().loads == src.chunk_count
