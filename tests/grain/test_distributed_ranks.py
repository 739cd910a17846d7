"""PyTorch DDP ranks: one contiguous run of the sweep per rank (xpatch.grain.distributed).

The case is insitubatch's kind (a time series chunked along time, 64 chunks of 8
steps) with patches of 4 steps at stride 3, so that patches straddle chunks; each
rank reads through its own source and cache (16 of the 64 chunks), and the chunk
reads of the ranks are summed.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections import Counter

import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)
from xpatch.core.errors import OptionError
from xpatch.grain.distributed import RankSampler

CHUNKS = 64
CHUNK_BYTES = 8 * 16 * 16 * 4
BUDGET = 16 * CHUNK_BYTES  # a quarter of the data per rank


def series(values: np.ndarray | None = None) -> xr.DataArray:
    if values is None:
        values = np.zeros((8 * CHUNKS, 16, 16), np.float32)
    return xr.DataArray(values, dims=("time", "y", "x")).chunk(time=8)


def make_source(scene: xr.DataArray):
    return scene.patch(time=4, y=16, x=16, stride={"time": 3}).to_grain(cache_bytes=BUDGET)


def run_ranks(sampler_of, world_size: int = 2) -> tuple[list[list[int]], float]:
    """Each rank's indices, read through its own source; and chunk loads per chunk, summed."""
    served, loads = [], 0
    for rank in range(world_size):
        src = make_source(series())
        sampler = sampler_of(src, rank)
        indices = [int(i) for i in sampler]
        for i in indices:
            src[i]
        served.append(indices)
        loads += src.cache_stats().loads
    return served, loads / CHUNKS


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_two_ranks_serve_every_patch_once_and_read_each_chunk_about_once(drop_remainder):
    n = len(make_source(series()))
    assert n % 2 == 1  # 171 patches: the remainder policy matters
    served, loads_per_chunk = run_ranks(
        lambda src, rank: RankSampler(
            src, rank=rank, world_size=2, seed=1, drop_remainder=drop_remainder
        )
    )
    counts = Counter(served[0] + served[1])
    # DDP needs the same number of batches on every rank.
    assert len(served[0]) == len(served[1]) == (n // 2 if drop_remainder else n // 2 + 1)
    if drop_remainder:
        assert len(counts) == n - 1 and set(counts.values()) == {1}
    else:
        # Every patch; one twice: rank 0 ends with rank 1's first patch (at the cut).
        assert sorted(counts) == list(range(n))
        (twice,) = [i for i, c in counts.items() if c == 2]
        assert twice in served[0] and twice in served[1] and max(counts.values()) == 2
    assert loads_per_chunk <= 1.05, loads_per_chunk


def test_pad_repeats_the_first_patch_of_the_next_run():
    src = make_source(series())
    ranks = [RankSampler(src, rank=r, world_size=2, seed=1) for r in range(2)]
    repeated = set(ranks[0].indices(0)) & set(ranks[1].indices(0))
    assert len(repeated) == 1
    # It is rank 1's patch whose chunks the sweep visits first: at the cut.
    order = src.chunk_shuffled_order(seed=1)
    first_of_rank_1 = min(ranks[1].indices(0), key=lambda i: order.tolist().index(i))
    (patch,) = repeated
    chunks = src.touched_chunks()
    assert set(chunks[patch][chunks[patch] >= 0]) & set(chunks[first_of_rank_1].ravel())


def test_set_epoch_changes_the_order_and_the_seed_fixes_it_on_every_rank():
    src = make_source(series())
    other = make_source(series())  # another rank's process builds its own source
    a = RankSampler(src, rank=1, world_size=2, seed=5)
    b = RankSampler(other, rank=1, world_size=2, seed=5)
    assert list(a) == list(b)
    before = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != before
    assert a.epoch == 1
    # Epoch 1 splits the patches between the ranks again, with other cuts.
    zero = RankSampler(src, rank=0, world_size=2, seed=5)
    zero.set_epoch(1)
    assert set(zero) | set(a) == set(range(len(src)))
    assert set(zero) != set(RankSampler(src, rank=0, world_size=2, seed=5))
    assert list(RankSampler(src, rank=1, world_size=2, seed=6)) != before


def test_distributed_sampler_makes_every_rank_read_nearly_every_chunk():
    torch_data = pytest.importorskip("torch.utils.data")
    for shuffle in (False, True):
        served, loads_per_chunk = run_ranks(
            lambda src, rank, shuffle=shuffle: torch_data.DistributedSampler(
                src, num_replicas=2, rank=rank, shuffle=shuffle, seed=1
            )
        )
        assert set(served[0]) | set(served[1]) == set(range(len(served[0]) * 2 - 1))
        # Strided indices: each rank reads (at least) every chunk; the docs quote these.
        assert loads_per_chunk >= 2.0, (shuffle, loads_per_chunk)


def _rank_process(rank: int, folder: str) -> None:
    """One rank in its own process: its own source and cache over the zarr store."""
    src = make_source(xr.open_zarr(f"{folder}/series.zarr", consolidated=False)["v"])
    seen = []
    for i in RankSampler(src, rank=rank, world_size=2, seed=3):
        seen.append(int(src[i]["index"]))
    result = {
        "seen": seen,
        "loads": src.cache_stats().loads,
        # Nothing of xpatch imports torch: a sampler needs none.
        "imported_torch": "torch" in sys.modules,
    }
    with open(f"{folder}/rank{rank}.json", "w") as file:
        json.dump(result, file)


def test_two_processes_each_read_their_own_run(tmp_path):
    values = np.random.default_rng(0).random((8 * CHUNKS, 16, 16), dtype=np.float32)
    series(values).rename("v").to_dataset().to_zarr(tmp_path / "series.zarr", consolidated=False)
    # Rank 1 in a process of its own, rank 0 in this one meanwhile: two caches.
    other = multiprocessing.get_context("spawn").Process(
        target=_rank_process, args=(1, str(tmp_path))
    )
    other.start()
    _rank_process(0, str(tmp_path))
    other.join(timeout=120)
    assert other.exitcode == 0
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert not results[1]["imported_torch"]
    n = len(make_source(series()))
    assert len(results[0]["seen"]) == len(results[1]["seen"]) == n // 2 + 1
    assert sorted(set(results[0]["seen"]) | set(results[1]["seen"])) == list(range(n))
    assert (results[0]["loads"] + results[1]["loads"]) / CHUNKS <= 1.05


def test_rank_and_world_size_come_from_the_process_group(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/group", rank=0, world_size=1)
    try:
        sampler = RankSampler(make_source(series()), seed=0)
    finally:
        dist.destroy_process_group()
    assert (sampler.rank, sampler.world_size, len(sampler)) == (0, 1, 171)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 2, "world_size": 2}, r"rank=2 is not in \[0, world_size=2\)"),
        ({"rank": 0, "world_size": 0}, "world_size=0 must be an int >= 1"),
        ({"rank": 0, "world_size": 2, "drop_remainder": "yes"}, "drop_remainder='yes'"),
        ({"rank": 0, "world_size": 2, "mix": 0}, "mix=0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(OptionError, match=match):
        RankSampler(make_source(series()), seed=0, **kwargs)


def test_not_an_xpatch_source_is_refused():
    with pytest.raises(OptionError, match="source=list is not an xpatch source"):
        RankSampler([1, 2, 3], rank=0, world_size=1, seed=0)


def test_rank_from_the_process_group_needs_torch_or_a_group(monkeypatch):
    src = make_source(series())
    pytest.importorskip("torch.distributed")
    with pytest.raises(OptionError, match=r"no torch\.distributed process group is"):
        RankSampler(src, seed=0)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)  # as without torch
    with pytest.raises(ImportError, match="pip install torch"):
        RankSampler(src, world_size=2, seed=0)
    # Given both, torch is never asked.
    assert len(RankSampler(src, rank=0, world_size=2, seed=0)) == len(src) // 2 + 1


class _Probe:
    """A source's items as (index, chunk loads so far in this worker's own cache)."""

    def __init__(self, src) -> None:
        self.src = src

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return int(self.src[index]["index"]), self.src.cache_stats().loads


@pytest.mark.parametrize("dealt", [False, True])
def test_dataloader_workers_each_read_their_own_part_of_the_run(dealt):
    torch_data = pytest.importorskip("torch.utils.data")
    served, loads = [], 0
    for rank in (0, 1):
        src = make_source(series())
        sampler = RankSampler(
            src,
            rank=rank,
            world_size=2,
            seed=1,
            **({"num_workers": 2, "batch_size": 8} if dealt else {}),
        )
        loader = torch_data.DataLoader(
            _Probe(src),
            sampler=sampler,
            batch_size=8,
            num_workers=2,
            multiprocessing_context="fork",
        )
        last = {}
        for batch_number, (indices, worker_loads) in enumerate(loader):
            served += indices.tolist()
            # DataLoader hands batch b to worker b % 2: its loads so far.
            last[batch_number % 2] = int(worker_loads.max())
        loads += sum(last.values())
    assert set(served) == set(range(len(make_source(series()))))
    per_chunk = loads / CHUNKS
    # Batch by batch both workers of a rank read most chunks of its run; dealt, once.
    assert (per_chunk <= 1.1) if dealt else (per_chunk >= 1.5), per_chunk
