"""Later epochs from local disk: ``to_grain(cache_dir=...)`` keeps every decoded zarr chunk.

A second epoch reads no chunk from the store and serves the same items; another
fingerprint never reads the files; a damaged file is read again from the store, never
served; processes killed with SIGKILL while writing leave nothing that a later process
serves; two processes filling one folder at once agree; over moto's S3 server a second
epoch fetches nothing from the bucket.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.storage import LocalStore

from xpatch.core.errors import OptionError
from xpatch.grain.disk_cache import HEADER_BYTES, SUFFIX, TEMP_PREFIX, DiskChunks

grain = pytest.importorskip("grain")

SIZE = {"time": 1, "y": 16, "x": 16}


def write_zarr(path: Path, seed: int = 0, shape=(8, 32, 48), chunks=(2, 16, 24)) -> np.ndarray:
    values = np.random.default_rng(seed).normal(size=shape).astype("float32")
    values[0, 0, 0] = np.nan
    data = xr.Dataset({"v": (("time", "y", "x"), values)})
    data.to_zarr(path, encoding={"v": {"chunks": chunks}}, consolidated=False, mode="w")
    return values


def opened(path: Path) -> xr.DataArray:
    return xr.open_zarr(str(path), consolidated=False)["v"]  # as the subprocesses spell it


@pytest.fixture
def store_reads(monkeypatch) -> list[str]:
    """The chunk keys read from any local zarr store, by zarr's reads or xpatch's."""
    keys: list[str] = []
    get_sync, get = LocalStore.get_sync, LocalStore.get

    def counted_sync(self, key, *args, **kwargs):
        if "/c/" in key:
            keys.append(f"{self.root}/{key}")
        return get_sync(self, key, *args, **kwargs)

    async def counted(self, key, *args, **kwargs):
        if "/c/" in key:
            keys.append(f"{self.root}/{key}")
        return await get(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "get_sync", counted_sync)
    monkeypatch.setattr(LocalStore, "get", counted)
    return keys


def epoch(src) -> list[dict]:
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=4)
    return sorted(list(dataset), key=lambda item: int(item["index"]))


def assert_items_equal(items: list[dict], values: np.ndarray) -> None:
    for item in items:
        t, y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], values[t : t + 1, y : y + 16, x : x + 16])


def epoch_over_the_cache(path: Path, cache: Path, values: np.ndarray, store_reads: list):
    """A fresh source over ``cache``: one epoch, its items checked; its disk cache's stats."""
    store_reads.clear()
    src = opened(path).patch(**SIZE).to_grain(cache_dir=cache)
    assert_items_equal(epoch(src), values)
    return src.disk_cache_stats()["data"]


def cache_files(root: Path) -> list[Path]:
    return sorted(root.rglob(f"*{SUFFIX}"))


def test_a_second_epoch_reads_no_chunk_from_the_store_and_serves_the_same_items(
    tmp_path, store_reads
):
    values = write_zarr(tmp_path / "a.zarr")
    cache = tmp_path / "cache"
    first = opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache)
    items = epoch(first)
    assert len(set(store_reads)) == first.chunk_count == 16
    assert first.disk_cache_stats()["data"].writes == 16
    assert len(cache_files(cache)) == 16
    assert_items_equal(items, values)

    # A fresh source (an empty chunk cache, as the next epoch or another rank has),
    # and the pickled one a worker process of mp_prefetch gets.
    store_reads.clear()
    again = opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache)
    worker = pickle.loads(pickle.dumps(first))
    for src in (again, worker):
        second = epoch(src)
        assert store_reads == []
        assert src.disk_cache_stats()["data"].hits == 16
        for a, b in zip(items, second):
            np.testing.assert_array_equal(a["data"], b["data"])
            assert a["index"] == b["index"]


def test_another_fingerprint_never_reads_the_files(tmp_path, store_reads):
    cache = tmp_path / "cache"
    write_zarr(tmp_path / "a.zarr", seed=0)
    other = write_zarr(tmp_path / "b.zarr", seed=1)  # other values, same shape and chunks
    a = opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache)
    epoch(a)
    store_reads.clear()
    b = opened(tmp_path / "b.zarr").patch(**SIZE).to_grain(cache_dir=cache)
    assert b.fingerprint != a.fingerprint
    assert_items_equal(epoch(b), other)
    assert len(set(store_reads)) == 16 and b.disk_cache_stats()["data"].hits == 0
    # Another layout of the same data: another fingerprint, other files.
    store_reads.clear()
    strided = (
        opened(tmp_path / "b.zarr")
        .patch(**SIZE, stride={"time": 1, "y": 8, "x": 8})
        .to_grain(cache_dir=cache)
    )
    epoch(strided)
    assert strided.disk_cache_stats()["data"].hits == 0 and len(set(store_reads)) == 16
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [a.fingerprint, b.fingerprint, strided.fingerprint]
    )


def test_a_damaged_file_is_read_again_from_the_store_never_served(tmp_path, store_reads):
    values = write_zarr(tmp_path / "a.zarr")
    cache = tmp_path / "cache"
    epoch(opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache))
    files = cache_files(cache)
    truncated, flipped, emptied = files[0], files[3], files[5]
    os.truncate(truncated, truncated.stat().st_size - 7)  # a write cut short
    with open(flipped, "r+b") as handle:  # pages lost in a crash: same length, other bytes
        handle.seek(HEADER_BYTES + 100)
        byte = handle.read(1)
        handle.seek(HEADER_BYTES + 100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    emptied.write_bytes(b"")
    stats = epoch_over_the_cache(tmp_path / "a.zarr", cache, values, store_reads)
    assert (stats.rejected, stats.hits, stats.writes) == (3, 13, 3)
    assert len(set(store_reads)) == 3
    # Written whole again: the next source reads them from disk.
    store_reads.clear()
    epoch(opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache))
    assert store_reads == []


def test_a_whole_file_under_another_chunks_name_is_never_served(tmp_path, store_reads):
    # A writer's temporary file renamed over the wrong name (a file system without
    # atomic renames): whole, its checksum right, but another chunk's values.
    values = write_zarr(tmp_path / "a.zarr")
    cache = tmp_path / "cache"
    epoch(opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache))
    first, second = cache_files(cache)[:2]
    os.replace(first, second)
    stats = epoch_over_the_cache(tmp_path / "a.zarr", cache, values, store_reads)
    assert (stats.rejected, stats.misses, stats.writes) == (1, 2, 2)
    assert len(set(store_reads)) == 2


def test_a_bad_cache_dir_is_refused_before_any_read(tmp_path):
    write_zarr(tmp_path / "a.zarr")
    (tmp_path / "file").write_text("")
    p = opened(tmp_path / "a.zarr").patch(**SIZE)
    with pytest.raises(OptionError, match=r"cache_dir=.*file.*writable local folder"):
        p.to_grain(cache_dir=tmp_path / "file" / "cache")
    with pytest.raises(OptionError, match=r"cache_dir=3 must be the path of a local folder"):
        p.to_grain(cache_dir=3)
    in_memory = xr.DataArray(np.zeros((4, 4)), dims=("y", "x")).chunk(2)
    with pytest.warns(UserWarning, match="keeps nothing"):
        in_memory.patch(y=2, x=2).to_grain(cache_dir=tmp_path / "c")


#: Runs in a subprocess: forks writers that fill the cache and kills them (SIGKILL).
WRITERS = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    from pathlib import Path
    import numpy as np, xarray as xr
    import xpatch
    from xpatch.grain import disk_cache

    zarr_path, kill_dir, both_dir, out = sys.argv[1:5]

    def source(cache_dir):
        da = xr.open_zarr(zarr_path, consolidated=False)["v"]
        return da.patch(time=1, y=128, x=128).to_grain(cache_dir=cache_dir)

    # Built before the forks (zarr resets its event loop in a forked child).
    src, cache_dir_of_src = source(kill_dir), kill_dir

    def fill_forever(ready):
        os.write(ready, b"r")
        folder = Path(cache_dir_of_src) / src.fingerprint
        pick = random.Random(os.getpid())
        while True:  # chunks written again and again, others left in place
            for path in folder.glob("*/*.chunk"):
                if pick.random() < 0.5:
                    os.unlink(path)
            src.clear_cache()
            for i in range(len(src)):
                src[i]

    def half_then_wait(fd, header, data):
        with os.fdopen(fd, "wb") as handle:
            handle.write(header)
            handle.write(memoryview(data)[: len(data) // 2])
            handle.flush()
            os.write(written, b"w")
            time.sleep(60)

    def forked(work, *args):
        pid = os.fork()
        if pid == 0:
            try:
                work(*args)
            finally:
                os._exit(1)
        return pid

    def killed(pid):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    rng = random.Random(int(sys.argv[5]))
    if True:  # writers killed
        for _ in range(8):  # at random times
            ready, signalled = os.pipe()
            pid = forked(fill_forever, signalled)
            os.read(ready, 1)
            time.sleep(rng.uniform(0.0, 0.15))
            killed(pid)
        # Right after the temporary file is made, half written.
        written_read, written = os.pipe()
        write_file, disk_cache._write_file = disk_cache._write_file, half_then_wait
        ready, signalled = os.pipe()
        pid = forked(fill_forever, signalled)
        os.read(written_read, 1)
        killed(pid)
        disk_cache._write_file = write_file
    if True:  # two processes fill one cache at once
        src = source(both_dir)

        def fill_once(k):
            items = np.stack([src[i]["data"] for i in range(len(src))])
            np.save(f"{out}-{k}.npy", items)
            stats = src.disk_cache_stats()["data"]
            Path(f"{out}-{k}.json").write_text(json.dumps(stats.__dict__))
            os._exit(0)
        pids = [forked(fill_once, k) for k in range(2)]
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        assert codes == [0, 0], codes
    """
)


@pytest.fixture(scope="module")
def writers(tmp_path_factory) -> tuple[np.ndarray, Path, Path, Path]:
    """The zarr, the cache its killed writers left, the one two writers filled, their items.

    One subprocess (one interpreter start) runs both campaigns.
    """
    root = tmp_path_factory.mktemp("writers")
    values = write_zarr(root / "big.zarr", shape=(8, 256, 512), chunks=(2, 256, 256))
    killed, both, out = root / "killed", root / "both", root / "out"
    subprocess.run(
        [sys.executable, "-c", WRITERS, *map(str, (root / "big.zarr", killed, both, out)), "0"],
        check=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    return values, killed, both, out


def chunk_of(values: np.ndarray, path: Path) -> np.ndarray:
    t, y, x = (int(c) for c in path.name[: -len(SUFFIX)].split("."))
    return values[2 * t : 2 * t + 2, 256 * y : 256 * y + 256, 256 * x : 256 * x + 256]


def test_writers_killed_with_sigkill_leave_nothing_partial_to_serve(writers, store_reads):
    values, cache, _, _ = writers
    big = cache.parent / "big.zarr"
    (folder,) = {path.parent for path in cache.rglob("*") if path.is_file()}
    temps = sorted(folder.glob(f"{TEMP_PREFIX}*"))
    assert temps, "the writer killed after making its temporary file left it"
    # Every file under a chunk's name is whole: the rename is atomic.
    disk = DiskChunks(cache, folder.parent.name, "data")
    assert disk.folder == folder
    finals = cache_files(cache)
    for path in finals:
        coords = tuple(int(c) for c in path.name[: -len(SUFFIX)].split("."))
        np.testing.assert_array_equal(
            disk.get(coords, (2, 256, 256), np.dtype("float32")), chunk_of(values, path)
        )
    # A file system without atomic renames: a killed writer's temporary file (half written,
    # or whole but another chunk's) under a chunk's name.
    victim = finals[0] if finals else folder / f"0.0.0{SUFFIX}"
    os.replace(temps[-1], victim)
    src = opened(big).patch(time=1, y=128, x=128).to_grain(cache_dir=cache)
    assert src.fingerprint == folder.parent.name
    for i in range(len(src)):
        t, y, x = src[i]["anchor"].tolist()
        np.testing.assert_array_equal(src[i]["data"], values[t : t + 1, y : y + 128, x : x + 128])
    stats = src.disk_cache_stats()["data"]
    # The victim took one whole chunk's place, or (no writer got as far as a rename
    # before its kill) a name of its own.
    assert stats.rejected == 1 and stats.hits == max(len(finals) - 1, 0)
    assert len(set(store_reads)) == 8 - stats.hits
    # A temporary file an hour old is a dead writer's: removed when the folder is next used.
    for path in folder.glob(f"{TEMP_PREFIX}*"):
        os.utime(path, (0, 0))
    DiskChunks(cache, src.fingerprint, "data").put((9, 9, 9), np.zeros(1, "float32"))
    assert not list(folder.glob(f"{TEMP_PREFIX}*"))


def test_two_processes_filling_one_cache_at_once_serve_the_same_items(writers, store_reads):
    values, _, cache, out = writers
    first, second = np.load(f"{out}-0.npy"), np.load(f"{out}-1.npy")
    np.testing.assert_array_equal(first, second)
    stats = [json.loads(Path(f"{out}-{k}.json").read_text()) for k in range(2)]
    assert all(s["rejected"] == 0 for s in stats)
    assert sum(s["hits"] + s["misses"] for s in stats) == 16
    src = opened(cache.parent / "big.zarr").patch(time=1, y=128, x=128).to_grain(cache_dir=cache)
    items = [src[i] for i in range(len(src))]
    assert store_reads == []
    for item, served in zip(items, first):
        t, y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(served, values[t : t + 1, y : y + 128, x : x + 128])
        np.testing.assert_array_equal(item["data"], served)


def test_a_second_epoch_over_s3_fetches_nothing_from_the_bucket(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    pytest.importorskip("obstore")
    pytest.importorskip("moto.server")
    from tests.s3_server import moto_endpoint, storage_options
    from xpatch.grain.object_store import ObjectStoreReader

    fetched: list[str] = []
    fetch = ObjectStoreReader.fetch

    def counted(self, key):
        fetched.append(key)
        return fetch(self, key)

    monkeypatch.setattr(ObjectStoreReader, "fetch", counted)
    with moto_endpoint("cache") as endpoint:
        options = storage_options(endpoint)
        values = write_zarr(tmp_path / "a.zarr")
        url = f"s3://cache/{uuid.uuid4().hex[:8]}/a.zarr"
        xr.open_zarr(tmp_path / "a.zarr", consolidated=False).to_zarr(
            url, storage_options=options, consolidated=False
        )
        cache = tmp_path / "cache"

        def remote():
            da = xr.open_zarr(url, storage_options=options, consolidated=False)["v"]
            return da.patch(**SIZE).to_grain(cache_dir=cache)

        first = epoch(remote())
        assert len(set(fetched)) == 16
        fetched.clear()
        zarr_gets: list[str] = []
        get = zarr.storage.FsspecStore.get

        async def counted_get(self, key, *args, **kwargs):
            if "/c/" in key:
                zarr_gets.append(key)
            return await get(self, key, *args, **kwargs)

        monkeypatch.setattr(zarr.storage.FsspecStore, "get", counted_get)
        src = remote()
        second = epoch(src)
        assert fetched == [] and zarr_gets == []
        assert src.disk_cache_stats()["data"].hits == 16
    assert_items_equal(second, values)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a["data"], b["data"])


def test_forecast_scene_and_tree_sources_keep_their_chunks_on_disk(tmp_path, store_reads):
    import pandas as pd

    import xpatch

    write_zarr(tmp_path / "a.zarr", seed=0)
    write_zarr(tmp_path / "b.zarr", seed=1)
    times = pd.date_range("2020-01-01", periods=8, freq="6h")

    def sources(cache):
        a, b = opened(tmp_path / "a.zarr"), opened(tmp_path / "b.zarr")
        forecast = a.assign_coords(time=times).patch(
            time=xpatch.Forecast(inputs=["0h"], targets=["6h"]), y=16, x=16
        )
        scenes = xpatch.patch_scenes([a, b], y=16, x=16)
        tree = xr.DataTree.from_dict({"/a": a.to_dataset(), "/b": b.to_dataset()})
        return [
            forecast.to_grain(cache_dir=cache),
            scenes.to_grain(cache_dir=cache),
            tree.patch(y=16, x=16).to_grain(cache_dir=cache),
        ]

    cache = tmp_path / "cache"
    first = sources(cache)
    firsts = [[src[i] for i in range(len(src))] for src in first]
    assert len(set(store_reads)) == 32  # both zarrs' chunks
    store_reads.clear()
    again = sources(cache)
    for src, items in zip(again, firsts):
        for i, item in enumerate(items):
            served = src[i]
            for key in ("inputs", "data", "/a"):
                if key in item:
                    a, b = item[key], served[key]
                    a, b = (a["v"], b["v"]) if key == "/a" else (a, b)
                    np.testing.assert_array_equal(a, b)
    assert store_reads == []


def test_values_unlike_zarrs_leave_nothing_on_disk(tmp_path, monkeypatch):
    from xpatch.grain.zarr_chunks import ZarrChunks

    values = write_zarr(tmp_path / "a.zarr")
    cache = tmp_path / "cache"
    src = opened(tmp_path / "a.zarr").patch(**SIZE).to_grain(cache_dir=cache)
    wrong = lambda self, coords: np.full((2, 16, 24), 7, "float32")  # noqa: E731
    monkeypatch.setattr(ZarrChunks, "_decoded", wrong)
    with pytest.warns(RuntimeWarning, match="other values than zarr's"):
        items = [src[i] for i in range(len(src))]
    assert_items_equal(items, values)  # zarr's own reads
    assert cache_files(cache) == []  # what was decoded wrong was never kept
