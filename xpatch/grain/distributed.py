"""PyTorch DDP: one contiguous run of the sweep per rank, so ranks share only the cuts.

``torch.utils.data.DistributedSampler`` hands rank ``r`` the indices ``r, r + W,
r + 2W, ...`` of a (shuffled or not) order. Over a chunk-local order that strides
across every chunk, so every rank reads nearly every chunk: the epoch's chunk reads
are multiplied by the number of ranks. :class:`RankSampler` cuts each epoch's sweep
(:meth:`~xpatch.grain.base.Source.chunk_shuffled_order`) into one contiguous run per
rank, before the mixing, and mixes the patches within each run; ranks then share
only the chunks at the cuts (and those their straddling patches reach).
``DataLoader(num_workers=k)`` hands its workers the batches round robin, each
worker with its own cache; given ``num_workers`` and ``batch_size``, the sampler
deals each rank's run to them as contiguous runs too.

Nothing here imports torch: a ``DataLoader`` takes any iterable of indices with a
length as its ``sampler``. torch is imported only to read the rank and the world
size of an initialised process group when they are not given.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import numpy as np

from xpatch.core.errors import OptionError
from xpatch.core.shuffle import check_count, check_seed, worker_runs
from xpatch.core.sweep import key_chunks, sweep_ranks
from xpatch.grain.base import Source

TORCH_HINT = "pip install torch"


class RankSampler:
    """A rank's share of each epoch's sweep: one contiguous run of it, mixed within.

    Each epoch's sweep (the order of :meth:`Source.chunk_shuffled_order
    <xpatch.grain.base.Source.chunk_shuffled_order>` before its patches are
    interleaved) is cut into ``world_size`` contiguous runs, one per rank; the
    patches of each run are then interleaved as the sweep interleaves them
    (``mix`` consecutive chunks). Every rank computes the same cuts from
    ``(seed, epoch)``, so ranks never overlap and share only the chunks at their
    cuts. The cuts move with the epoch, as the sweep turns (the order of the
    scenes, the direction of every axis).

    Every rank gets the same number of indices, which DDP needs: a rank with fewer
    batches would wait forever in the others' gradient all-reduce. With
    ``drop_remainder=False`` (default, as ``DistributedSampler(drop_last=False)``)
    that is ``ceil(len(src) / world_size)``: the ``len(src) % world_size``
    last ranks hold one patch more than the others, and the run of each of the
    others takes one more, the first patch of the next rank's run (a patch at the cut,
    whose chunks are already read there), so every patch comes at least once and
    at most ``world_size - 1`` come twice. With ``drop_remainder=True`` it is
    ``len(src) // world_size``: the last ``len(src) % world_size`` patches of
    the sweep (others every epoch) are left out and none repeats.

    Pad is the default because it serves every patch every epoch at the cost of at
    most ``world_size - 1`` repeats; both policies give equal counts.

    Parameters
    ----------
    source
        An xpatch Grain source (``p.to_grain(...)``, a scene, tree or forecast
        source): the index a ``DataLoader`` reads with this sampler.
    rank, world_size
        This process's rank and the number of ranks. Default: those of the
        initialised ``torch.distributed`` process group (which needs torch).
    seed
        The seed, the same on every rank; ``0 <= seed < 2**32``.
    drop_remainder
        ``False`` (default): pad to ``ceil(len(source) / world_size)`` per rank as
        above; ``True``: drop to ``len(source) // world_size`` per rank.
    mix
        How many consecutive chunks of the sweep have their patches interleaved
        (default: as :meth:`~xpatch.grain.base.Source.chunk_shuffle` chooses from
        the cache's budget).
    num_workers, batch_size
        The ``DataLoader``'s, when it has worker processes (``num_workers > 1``):
        it hands worker ``w`` the batches ``w, w + k, w + 2k, ...``, and each worker
        reads into its own cache, so a run dealt batch by batch would be read by
        every worker. The rank's run is then cut, in sweep order, into one run per
        worker, as long as its share of the batches, each mixed within itself.
        Give the same values as to the ``DataLoader``; ``num_workers`` of 0 or 1
        deals nothing.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> from xpatch.grain.distributed import RankSampler
    >>> src = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(16).patch(
    ...     y=8, x=8).to_grain()
    >>> ranks = [RankSampler(src, rank=r, world_size=3, seed=0) for r in range(3)]
    >>> [len(s) for s in ranks]  # 64 patches: 22 each, two of them repeated
    [22, 22, 22]
    >>> sorted(set().union(*(list(s) for s in ranks))) == list(range(64))
    True
    >>> ranks[0].set_epoch(1)  # call it before each epoch, as with DistributedSampler
    """

    def __init__(
        self,
        source: Source,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int,
        drop_remainder: bool = False,
        mix: int | None = None,
        num_workers: int = 0,
        batch_size: int = 1,
    ) -> None:
        if not isinstance(source, Source):
            raise OptionError(
                f"source={type(source).__name__} is not an xpatch source: pass what "
                "p.to_grain(...) returns (or a scene, tree or forecast source)."
            )
        if not isinstance(drop_remainder, bool):
            raise OptionError(
                f"drop_remainder={drop_remainder!r} must be True (drop to len // world_size "
                "per rank) or False (pad to ceil(len / world_size) per rank)."
            )
        self._seed = check_seed(seed)
        if mix is not None:
            mix = check_count("mix", mix)
        if (
            isinstance(num_workers, bool)
            or not isinstance(num_workers, int | np.integer)
            or num_workers < 0
        ):
            raise OptionError(
                f"num_workers={num_workers!r} must be an int >= 0: the DataLoader's num_workers."
            )
        batch_size = check_count("batch_size", batch_size)
        if rank is None or world_size is None:
            group_rank, group_size = _process_group()
            rank = group_rank if rank is None else rank
            world_size = group_size if world_size is None else world_size
        world_size = check_count("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
            raise OptionError(f"rank={rank!r} must be an int in [0, world_size={world_size}).")
        if not 0 <= rank < world_size:
            raise OptionError(
                f"rank={rank} is not in [0, world_size={world_size}): pass the rank of this "
                "process, 0 to world_size - 1."
            )
        self._source = source
        self._rank, self._world_size = int(rank), world_size
        self._drop = drop_remainder
        self._mix = mix
        self._dealt = (max(int(num_workers), 1), batch_size)
        self._epoch = 0
        n = len(source)
        self._count = n // world_size if drop_remainder else -(-n // world_size)

    @property
    def rank(self) -> int:
        """The rank of this process."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._world_size

    @property
    def epoch(self) -> int:
        """The epoch :meth:`__iter__` serves (set by :meth:`set_epoch`)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch ``epoch`` next: its own sweep, the same on every rank.

        Call it before each epoch on every rank, as with ``DistributedSampler``;
        without it every epoch repeats epoch 0's order.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise OptionError(f"epoch={epoch!r} must be an int >= 0.")
        self._epoch = int(epoch)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices(self._epoch).tolist())

    def indices(self, epoch: int) -> np.ndarray:
        """Return this rank's patch indices of epoch ``epoch``, in the order served."""
        mixed = self._source.chunk_shuffled_order(self._seed, epoch, mix=self._mix)
        start = _run_start(len(mixed), self._rank, self._world_size, self._drop)
        # Cut before the mixing: a run of the mixed order would share a mixing window
        # of chunks (``mix`` of them) with its neighbour, not only the chunk at the cut.
        position = np.empty(len(mixed), dtype=np.int64)
        position[mixed] = np.arange(len(mixed))
        reads = self._source.chunk_reads
        ranks, _ = sweep_ranks(reads.chunk_grids(), self._seed, epoch)
        visit = ranks[key_chunks(reads.touched_chunks(), ranks)]
        unmixed = np.lexsort((position, visit))
        run = unmixed[start : start + self._count]
        workers, batch_size = self._dealt
        if workers == 1:
            # Within the run, the mixed order's own interleaving.
            return run[np.argsort(position[run], kind="stable")]
        order = np.empty(len(run), dtype=np.int64)
        # Epoch 0's dealing every epoch: a DataLoader's iterator starts each epoch
        # at worker 0, where Grain's repeated stream runs on across epochs.
        for positions, (begin, end) in worker_runs(len(run), 0, workers, batch_size):
            part = run[begin:end]
            order[positions] = part[np.argsort(position[part], kind="stable")]
        return order

    def __repr__(self) -> str:
        policy = "drop" if self._drop else "pad"
        return (
            f"RankSampler(rank={self._rank}, world_size={self._world_size}, seed={self._seed}, "
            f"epoch={self._epoch}, {policy}: {self._count} of {len(self._source)} patches)"
        )


def _run_start(n: int, rank: int, world_size: int, drop: bool) -> int:
    """Where rank ``rank``'s run starts in the unmixed sweep of ``n`` patches.

    Dropping, runs are ``n // world_size`` long, back to back. Padding, the last
    ``n % world_size`` runs are one longer than the first ones, which each take the
    next run's first patch as well: all are ``ceil(n / world_size)`` long.

    Examples
    --------
    >>> [_run_start(10, r, 3, drop=False) for r in range(3)]  # runs of 4: 0-3, 3-6, 6-9
    [0, 3, 6]
    >>> [_run_start(10, r, 3, drop=True) for r in range(3)]  # runs of 3, patch 9 dropped
    [0, 3, 6]
    >>> [_run_start(11, r, 3, drop=False) for r in range(3)]  # 0-3, 3-6, 7-10
    [0, 3, 7]
    """
    per, remainder = divmod(n, world_size)
    if drop:
        return rank * per
    return rank * per + max(0, rank - (world_size - remainder))


def _process_group() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group."""
    try:
        dist = importlib.import_module("torch.distributed")
    except ImportError as error:
        raise ImportError(
            "RankSampler without rank= and world_size= reads them from torch.distributed, "
            f"which needs torch ({TORCH_HINT}); or pass rank= and world_size=."
        ) from error
    if not (dist.is_available() and dist.is_initialized()):
        raise OptionError(
            "RankSampler got no rank= or world_size= and no torch.distributed process group "
            "is initialised: call torch.distributed.init_process_group(...) first, or pass "
            "rank= and world_size=."
        )
    return int(dist.get_rank()), int(dist.get_world_size())
