"""``src.fetch_ahead(n)``: stored bytes fetched beyond the reads ahead, decoded within the room.

From a store that keeps each read waiting, the bytes of the chunks next in the
sweep's order are fetched on threads of their own and decoded into the cache only
when the reads ahead reach them. Every case is checked exact against the stored
values, with each chunk loaded once and nothing evicted, and nothing fetched is
left behind at the end of the epoch. The default, ``"auto"``, sends as many as the
store answers without queueing them (up to ``AUTO_FETCH_CHUNKS``): many to a store
that only keeps reads waiting, few to one that serves them one at a time.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.grain.test_sweep import (
    check_batch,
    check_items,
    count_reads_ahead,
    slow_batches,
    slow_items_source,
)
from xpatch.grain.readahead import (
    FEW_QUEUED,
    MANY_QUEUED,
    LateReads,
    due_in_first_use_order,
    max_reads,
)
from xpatch.grain.reader import AUTO_FETCH_CHUNKS
from xpatch.grain.store_wait import RoundTrips
from xpatch.grain.zarr_chunks import ChunkReadError

FETCHED = 8


def stored_chunks(source):
    """The direct chunk reader of the source's one variable."""
    (plan,) = source.reader.plans
    return plan.stored


def test_batches_fetch_bytes_beyond_the_room_and_decode_only_within_it(tmp_path):
    batches, values, store = slow_batches(tmp_path, 0.03)
    source = batches.source
    source.fetch_ahead(FETCHED)
    _, ahead = source.chunk_reads.sweep_settings(batches.mix, None)
    assert ahead > 1
    sent = count_reads_ahead(source)
    for k in range(len(batches)):
        check_batch(batches, k, values)
    late = batches._tracking().late
    assert late.fetching and late.most == FETCHED
    # Decoded reads stay within the room; the store answers more at once: the fetches.
    assert 1 < sent["most"] <= ahead + 1
    assert store.most > ahead + 1
    stats = batches.cache_stats()
    assert stats.loads == source.chunk_count and stats.evictions == 0
    assert stored_chunks(source).fetched_count() == 0  # each taken by its read, or forgotten


def test_items_sweep_fetches_bytes_ahead_exactly(tmp_path):
    src, values, store = slow_items_source(tmp_path, 0.03, seed=4)
    src.fetch_ahead(FETCHED)
    ahead = 3
    sent = count_reads_ahead(src)
    dataset = src.chunk_shuffle(seed=2, read_ahead=ahead)
    check_items(dataset, values)
    assert dataset._reading()._late.most == FETCHED
    assert sent["most"] <= ahead + 1 < store.most
    stats = src.cache_stats()
    assert stats.loads == src.chunk_count and stats.evictions == 0
    assert stored_chunks(src).fetched_count() == 0


def test_a_local_folder_fetches_nothing_ahead(tmp_path):
    values = np.arange(2 * 64 * 64, dtype="uint16").reshape(2, 64, 64)
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    src = xr.open_zarr(tmp_path / "s.zarr", consolidated=False)["v"].patch(y=8, x=8).to_grain()
    src.fetch_ahead(FETCHED)
    assert src.chunk_reads.fetch_depth() == 0  # read without a wait: decoded as read
    report = src.memory_report()
    assert report.fetched_chunks == 0 and report.fetched_bytes == 0


def test_the_memory_report_states_the_bytes_fetched_ahead(tmp_path):
    batches, _, _ = slow_batches(tmp_path, 0.0, fetch_ahead=0)
    source = batches.source
    before = source.memory_report()
    assert before.fetched_chunks == 0
    source.fetch_ahead(FETCHED)
    report = source.memory_report()
    assert report.fetched_chunks == FETCHED
    assert report.fetched_bytes == FETCHED * report.chunk_bytes > 0
    assert report.total_bytes == before.total_bytes + report.fetched_bytes
    assert "bytes fetched ahead" in str(report)


def latency_source(tmp_path, seconds: float):
    """A source over a 16-chunk zarr behind zarr's ``LatencyStore`` (it pickles); its values."""
    from zarr.storage import LocalStore
    from zarr.testing.store import LatencyStore

    values = np.arange(2 * 64 * 64, dtype="uint16").reshape(2, 64, 64)
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    store = LatencyStore(LocalStore(tmp_path / "s.zarr", read_only=True), get_latency=seconds)
    return xr.open_zarr(store, consolidated=False)["v"].patch(y=16, x=16).to_grain(), values


def test_fetch_ahead_travels_to_worker_processes_and_fetches_stay_in_each(tmp_path):
    source, _ = latency_source(tmp_path, 0.0)
    source.fetch_ahead(FETCHED)
    stored = stored_chunks(source)
    stored.fetch_ahead((slice(None), slice(0, 32), slice(0, 32)))
    assert stored.fetched_count() == 4
    copy = pickle.loads(pickle.dumps(source))
    assert copy.reader.fetch_ahead_chunks == FETCHED
    assert stored_chunks(copy).fetched_count() == 0  # fetches are the process's own
    np.testing.assert_array_equal(copy[0]["data"], source[0]["data"])


def test_forgotten_fetches_are_dropped_and_a_read_takes_its_fetched_bytes(tmp_path):
    batches, values, _ = slow_batches(tmp_path, 0.02)
    stored = stored_chunks(batches.source)
    first = (slice(None), slice(0, 16), slice(0, 16))
    second = (slice(None), slice(0, 16), slice(16, 32))
    stored.fetch_ahead(first)
    stored.fetch_ahead(second)
    stored.fetch_ahead(first)  # fetched already: not again
    assert stored.fetched_count() == 2
    stored.forget(second)
    assert stored.fetched_count() == 1
    np.testing.assert_array_equal(stored[first], values[:, 0:16, 0:16])
    assert stored.fetched_count() == 0


@pytest.mark.parametrize("failing", ["once", "always"])
def test_a_failed_fetch_ahead_is_fetched_again_by_its_read_which_names_the_chunk(tmp_path, failing):
    from zarr.storage import LocalStore
    from zarr.testing.store import LatencyStore

    values = np.arange(2 * 64 * 64, dtype="uint16").reshape(2, 64, 64)
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    # Counted in a file: the reader reads through a copy of the store (pickled by value).
    marks = tmp_path / "failed"
    marks.write_text("")

    class Flaky(LatencyStore):
        async def get(self, key, *args, **kwargs):
            if key.endswith("v/c/0/1/1") and (failing == "always" or not marks.read_text()):
                with marks.open("a") as out:
                    out.write("x")
                raise OSError("connection reset")
            return await super().get(key, *args, **kwargs)

    store = Flaky(LocalStore(tmp_path / "s.zarr", read_only=True), get_latency=0.0)
    src = xr.open_zarr(store, consolidated=False)["v"].patch(y=16, x=16).to_grain()
    stored = stored_chunks(src)
    index = (slice(None), slice(16, 32), slice(16, 32))
    stored.fetch_ahead(index)
    if failing == "once":
        np.testing.assert_array_equal(stored[index], values[:, 16:32, 16:32])
        assert marks.read_text() == "x"
    else:
        with pytest.raises(ChunkReadError, match=r"c/0/1/1.*connection reset"):
            stored[index]
        assert len(marks.read_text()) >= 2  # fetched ahead, then again by the read
    assert stored.fetched_count() == 0


def test_fetch_ahead_refuses_what_is_not_a_count():
    da_ = xr.DataArray(np.zeros((32, 32), "float32"), dims=("y", "x")).chunk(16)
    src = da_.patch(y=8, x=8).to_grain()
    for bad in (-1, 2.5, True, "8", "fast", None):
        with pytest.raises(xpatch.OptionError, match=r"fetch_ahead\(chunks=.*int >= 0.*\"auto\""):
            src.fetch_ahead(bad)
    src.fetch_ahead("auto")
    assert src.reader.fetch_ahead_chunks == "auto"


@settings(max_examples=200, deadline=None)
@given(
    ahead=st.integers(0, 12),
    fetching=st.integers(0, 16),
    count=st.integers(0, 16),
    current=st.integers(0, 40),
    sent=st.tuples(st.integers(0, 40), st.integers(0, 40)),
    total=st.integers(0, 40),
)
def test_reads_stay_within_the_room_and_fetches_within_their_bound_beyond_it(
    ahead, fetching, count, current, sent, total
):
    late = LateReads(ahead, loads=8, fetching=fetching)
    assert late.fetching == (fetching > 0)
    late.count = min(count, late.most)
    order = np.arange(total) * 3  # chunk ids in first-use order
    due, fetches, (next_read, next_fetch) = due_in_first_use_order(order, current, sent, late)
    room = min(current + ahead, total)
    beyond = min(current + ahead + late.count, total)
    read_stop = room if late.fetching else beyond
    # Reads go out from the first not sent to the room (or beyond it without fetches).
    assert due.tolist() == order[sent[0] : read_stop].tolist()
    assert next_read == max(sent[0], read_stop)
    # Fetches cover what is beyond the reads sent, up to the bound; never a chunk read.
    assert fetches.tolist() == order[max(sent[1], next_read) : beyond].tolist()
    assert not set(fetches.tolist()) & set(order[:next_read].tolist())
    if not late.fetching:
        assert not len(fetches)
    assert next_fetch >= next_read


def test_scenes_fetch_ahead_in_every_scene_and_read_each_exactly(tmp_path):
    from zarr.storage import LocalStore
    from zarr.testing.store import LatencyStore

    arrays, stored = [], []
    for k in range(2):
        values = np.random.default_rng(k).integers(0, 4000, (2, 64, 48)).astype("uint16")
        path = tmp_path / f"scene{k}.zarr"
        xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
            path, encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
        )
        store = LatencyStore(LocalStore(path, read_only=True), get_latency=0.01)
        arrays.append(xr.open_zarr(store, consolidated=False)["v"])
        stored.append(values)
    sp = xpatch.patch_scenes(arrays, y=8, x=8, stride=8)
    src = sp.to_grain(cache_bytes=10 * 2 * 16 * 16 * 2, weights=False)
    src.fetch_ahead(FETCHED)
    assert src.chunk_reads.fetch_depth() == FETCHED
    dataset = src.chunk_shuffle(seed=3, read_ahead=2)
    seen = set()
    for i in range(len(dataset)):
        item = dataset[i]
        y, x = item["anchor"].tolist()
        scene = int(item["scene"])
        np.testing.assert_array_equal(item["data"], stored[scene][:, y : y + 8, x : x + 8])
        seen.add(int(item["index"]))
    assert seen == set(range(len(src)))
    assert src.cache_stats().loads == src.chunk_count


def test_auto_is_the_default_and_the_report_states_its_ceiling(tmp_path):
    source, _ = latency_source(tmp_path, 0.0)
    assert source.reader.fetch_ahead_chunks == "auto"
    report = source.memory_report()
    assert report.fetched_chunks == AUTO_FETCH_CHUNKS
    assert report.fetched_bytes == AUTO_FETCH_CHUNKS * report.chunk_bytes
    copy = pickle.loads(pickle.dumps(source))
    assert copy.reader.fetch_ahead_chunks == "auto"
    assert copy.fetch_round_trips().landed == 0  # each process times its own fetches
    np.testing.assert_array_equal(copy[0]["data"], source[0]["data"])
    assert copy.fetch_round_trips().landed > 0
    source.fetch_ahead(0)
    assert source.memory_report().fetched_chunks == 0
    assert source.fetch_round_trips() is None


def test_a_datasets_variables_share_their_round_trips(tmp_path):
    from zarr.storage import LocalStore
    from zarr.testing.store import LatencyStore

    values = np.arange(64 * 64, dtype="uint16").reshape(64, 64)
    ds = xr.Dataset({"a": (("y", "x"), values), "b": (("y", "x"), values + 1)})
    ds.to_zarr(
        tmp_path / "s.zarr", encoding={v: {"chunks": (16, 16)} for v in ds}, consolidated=False
    )
    store = LatencyStore(LocalStore(tmp_path / "s.zarr", read_only=True), get_latency=0.0)
    src = xr.open_zarr(store, consolidated=False).patch(y=16, x=16).to_grain()
    trips = src.fetch_round_trips()
    assert trips is not None
    assert [plan.stored.round_trips for plan in src.reader.plans] == [trips, trips]
    # A chunk is two fetches side by side: what queues is counted in chunks.
    assert trips.fetches_per_chunk == 2
    for _ in range(8):
        trips.timed(out=4, seconds=0.02)
        trips.timed(out=4, seconds=0.08)
    assert trips.queued() == pytest.approx(trips._queued / 2)
    copy = pickle.loads(pickle.dumps(src))
    copied = [plan.stored.round_trips for plan in copy.reader.plans]
    assert copied[0] is copied[1] is copy.fetch_round_trips() and copied[0] is not trips
    assert copied[0].fetches_per_chunk == 2 and copied[0].queued() is None


@pytest.mark.parametrize("consumer", ["batches", "items"])
def test_auto_fetches_up_to_its_ceiling_from_a_store_that_only_keeps_reads_waiting(
    tmp_path, consumer
):
    if consumer == "batches":
        batches, values, store = slow_batches(tmp_path, 0.03, fetch_ahead="auto")
        source = batches.source
        for k in range(len(batches)):
            check_batch(batches, k, values)
        late = batches._tracking().late
        ahead = batches._tracking().ahead
    else:
        source, values, store = slow_items_source(tmp_path, 0.03, seed=4, fetch_ahead="auto")
        ahead = 3
        dataset = source.chunk_shuffle(seed=2, read_ahead=ahead)
        check_items(dataset, values)
        late = dataset._reading()._late
    assert late.fetching and late.most == AUTO_FETCH_CHUNKS
    # Each 30 ms fetch takes as long with more out: none queue, so more went out.
    assert late.count > AUTO_FETCH_CHUNKS // 2
    assert store.most > ahead + 1
    stats = source.cache_stats()
    assert stats.loads == source.chunk_count and stats.evictions == 0
    assert stored_chunks(source).fetched_count() == 0


def one_at_a_time_store(path, seconds: float):
    """A zarr store over ``path`` that serves one read at a time, ``seconds`` each (a busy server).

    Its class counts the reads out at once (``most``).
    """
    import asyncio

    from zarr.storage import LocalStore
    from zarr.testing.store import LatencyStore

    class OneAtATime(LatencyStore):
        in_flight = most = 0
        serving: asyncio.Lock | None = None

        async def get(self, *args, **kwargs):
            cls = type(self)
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
            if cls.serving is None:
                cls.serving = asyncio.Lock()  # on zarr's one event loop
            try:
                async with cls.serving:
                    return await super().get(*args, **kwargs)
            finally:
                cls.in_flight -= 1

    return OneAtATime(LocalStore(path, read_only=True), get_latency=seconds)


def test_auto_sends_few_fetches_to_a_store_that_serves_one_at_a_time(tmp_path):
    values = np.random.default_rng(6).integers(0, 4000, (2, 128, 128)).astype("uint16")
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    store = one_at_a_time_store(tmp_path / "s.zarr", 0.005)
    src = xr.open_zarr(store, consolidated=False)["v"].patch(y=8, x=8, stride=8)
    src = src.to_grain(cache_bytes=24 * 2 * 16 * 16 * 2)
    counts = []
    follow = LateReads._follow_round_trips

    def recorded(late):
        follow(late)
        counts.append(late.count)

    from xpatch.grain import BatchSource

    batches = BatchSource(src, 4, seed=2)
    LateReads._follow_round_trips = recorded
    try:
        for k in range(len(batches)):
            check_batch(batches, k, values)
    finally:
        LateReads._follow_round_trips = follow
    late = batches._tracking().late
    assert late.fetching and late.most == AUTO_FETCH_CHUNKS
    # Fetches out queue behind each other: the count never climbs far, and falls back.
    assert counts and max(counts) <= AUTO_FETCH_CHUNKS // 2
    assert late.count <= 2
    stats = src.cache_stats()
    assert stats.loads == src.chunk_count and stats.evictions == 0


@settings(max_examples=200, deadline=None)
@given(
    most=st.integers(1, 16),
    ahead=st.integers(0, 8),
    fetches=st.lists(
        st.tuples(
            st.integers(1, 20),
            st.floats(0.001, 0.1),
            st.none() | st.floats(0.001, 0.05),
            st.integers(1, 3),
        ),
        max_size=40,
    ),
)
def test_the_auto_count_moves_once_per_fetch_landed_and_stays_within_its_ceiling(
    most, ahead, fetches
):
    trips = RoundTrips()
    late = LateReads(ahead=ahead, loads=8, fetching=most, round_trips=trips)
    assert late.count == 0  # grown from none: nothing is held before a fetch lands
    for out, seconds, decode, looks in fetches:
        before = late.count
        trips.timed(out, seconds)
        if decode is not None:
            trips.decoded(decode)
        for _ in range(looks):  # more looks than fetches landed move nothing more
            late.stops(0, 100)
        queued, needed = trips.queued(), trips.needed(max_reads(), ahead)
        ceiling = most if needed is None else min(most, needed)
        assert 0 <= late.count <= most and trips.depth == late.count
        if queued > MANY_QUEUED or (needed is not None and before > needed):
            assert late.count == max(before - 1, 0)  # queueing, or more than pays
        elif queued < FEW_QUEUED and before < ceiling:
            assert late.count == before + 1
        else:
            assert late.count == before
    again = LateReads(ahead=ahead, loads=8, fetching=most, round_trips=trips)
    assert again.count == late.count  # the next sweep starts where this one left off


@pytest.mark.parametrize(
    ("trip", "expected"),
    [(0.0004, 0), (0.05, 16)],  # a local disk through obstore; the same chunks 50 ms away
)
def test_auto_fetches_ahead_only_where_the_bytes_take_longer_than_a_decoding(
    trip, expected, monkeypatch
):
    monkeypatch.setattr("xpatch.grain.readahead.max_reads", lambda: 2)  # two cores
    # Reads ahead keep 6 chunks in the pipe: as many as two cores need twice over when
    # the bytes come within a decoding.
    trips = RoundTrips()
    late = LateReads(ahead=6, loads=8, fetching=16, round_trips=trips)
    for _ in range(40):  # 8 out at a time, none queueing, 5 ms a decoding
        trips.timed(8, trip)
        trips.decoded(0.005)
        late.stops(0, 100)
    assert trips.queued() == 0.0
    assert late.count == expected


def test_a_failed_fetch_is_no_round_trip():
    trips = RoundTrips()
    with trips.timing():
        pass
    with pytest.raises(OSError), trips.timing():
        raise OSError("connection reset")
    assert trips.landed == 1 and trips.out == 0
