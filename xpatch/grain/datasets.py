"""The Grain datasets xpatch owns: the chunk-local shuffle and the fingerprinted state.

This module imports grain; the sources (:mod:`xpatch.grain.base`) import it only when
a pipeline method is called, so a data source itself needs only numpy.

grain 0.2.18 keeps no state in a ``MapDataset``: the iterator of
``map_dataset.to_iter_dataset()`` saves ``{"next_index": n}`` whatever the
datasets before it, so no ``MapDataset`` can add the source's fingerprint to a
checkpoint. An ``IterDataset`` can: :class:`FingerprintIterDataset` nests its
parent's state under the fingerprint and refuses a state saved from another source.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import grain
import numpy as np
from dask.base import tokenize

from xpatch.core.errors import OptionError
from xpatch.core.shuffle import (
    check_count,
    check_seed,
    worker_permutation,
)
from xpatch.core.sweep import sweep_permutation, sweep_ranks
from xpatch.grain.memory import check_floor
from xpatch.grain.readahead import ChunkReads, SweepReads

#: The orders :meth:`~xpatch.grain.base.Source.chunk_shuffle` offers.
Order = Literal["sweep", "chunk"]
ORDERS = ("sweep", "chunk")


class ShuffledSource(Protocol):
    """What the datasets here read of a source (:class:`xpatch.grain.base.Source`).

    Its items and what identifies them; its chunks only through :attr:`chunk_reads`
    (the source itself, or the inner source of a wrapper), which orders the epochs
    and is read ahead.
    """

    fingerprint: str
    patcher: Any
    variables: tuple

    def __len__(self) -> int: ...

    @property
    def chunk_reads(self) -> ChunkReads: ...  # noqa: D102


#: Keys of a fingerprinted iterator state: the source's fingerprint, a readable
#: description of its layout (for the error message), and the pipeline's own state.
FINGERPRINT_KEY = "xpatch_fingerprint"
LAYOUT_KEY = "xpatch_layout"
PIPELINE_KEY = "pipeline"
#: Key of what orders the patches in the pipeline (:func:`pipeline_order`), beside them.
ORDER_KEY = "xpatch_order"

#: Longest layout description kept in a state: explicit anchors print long, and a
#: state placed before ``mp_prefetch`` travels with every element.
LAYOUT_CHARS = 400


def chunk_shuffle(
    source: ShuffledSource,
    dataset: Any,
    seed: int,
    shard_options: Any,
    worker_count: int = 1,
    batch_size: int = 1,
    order: Order = "sweep",
    mix: int | None = None,
    read_ahead: int | None = None,
) -> ChunkShuffleMapDataset:
    """Build ``source.chunk_shuffle(dataset, seed=..., ...)`` (see there)."""
    worker_count = check_count("worker_count", worker_count)
    batch_size = check_count("batch_size", batch_size)
    if order not in ORDERS:
        raise OptionError(
            f"order={order!r} is not one of {ORDERS}: 'sweep' reads each chunk once per "
            "epoch within the cache's budget, 'chunk' is the previous order (chunks at "
            "random, each with its patches)."
        )
    if mix is not None:
        mix = check_count("mix", mix)
    if read_ahead is not None and (
        isinstance(read_ahead, bool)
        or not isinstance(read_ahead, int | np.integer)
        or read_ahead < 0
    ):
        raise OptionError(f"read_ahead={read_ahead!r} must be an int >= 0 (0: no reads ahead).")
    if dataset is None:
        dataset = grain.MapDataset.source(source)
    reads = source.chunk_reads
    groups = reads.chunk_of_patch()
    # Shards split the patches by anchor chunk; the order may group them otherwise.
    sweep = None
    if order == "sweep":
        # Below the floor a sweep evicts chunks it still needs: refused before any read.
        check_floor(reads)
        mix, ahead = reads.sweep_settings(mix, read_ahead)
        visits = reads.touched_chunks()
        sweep = Sweep(reads.chunk_grids(), mix, ahead)
    else:
        visits = reads.shuffle_groups()
    if len(dataset) != len(groups):
        raise OptionError(
            f"dataset has {len(dataset)} elements and the source {len(groups)} patches; "
            "chunk_shuffle needs element i to be patch i: shuffle before filter, batch "
            "or slicing (use shard_options= to shard)."
        )
    members = None
    if shard_options is not None:
        # Split the patches in chunk order, not index order: explicit anchors keep
        # the caller's order, and a run of it could span every chunk.
        start, stop = shard_range(len(groups), shard_options)
        members = np.argsort(groups, kind="stable")[start:stop]
    return ChunkShuffleMapDataset(
        dataset,
        groups=visits,
        seed=seed,
        members=members,
        source=source,
        dealt=(worker_count, batch_size),
        sweep=sweep,
    )


class Sweep:
    """What a sweep order needs besides the patches' chunks: the grids, ``mix`` and ``ahead``.

    Parameters
    ----------
    grids
        The number of chunks along each patched axis, per scene.
    mix
        How many consecutive chunks of the sweep have their patches interleaved.
    ahead
        How many chunks are read ahead of use (0: none).
    """

    def __init__(self, grids: Sequence[Sequence[int]], mix: int, ahead: int) -> None:
        self.grids = [tuple(int(n) for n in g) for g in grids]
        self.mix = int(mix)
        self.ahead = int(ahead)

    @property
    def chunk_count(self) -> int:
        """Number of chunks over every grid."""
        return int(sum(np.prod(g, dtype=np.int64) for g in self.grids))


def shard_range(count: int, shard_options: Any) -> tuple[int, int]:
    """``(start, stop)`` of a shard's contiguous run, split as Grain's ``IndexSampler`` does.

    Examples
    --------
    >>> from types import SimpleNamespace as Options
    >>> [shard_range(10, Options(shard_index=i, shard_count=3, drop_remainder=False))
    ...  for i in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    index, shards = int(shard_options.shard_index), int(shard_options.shard_count)
    if not 0 <= index < shards:
        raise OptionError(
            f"shard_options has shard_index={index} and shard_count={shards}; the index must "
            "be in [0, shard_count)."
        )
    per_shard, remainder = divmod(count, shards)
    start, stop = per_shard * index, per_shard * (index + 1)
    if not shard_options.drop_remainder:
        start += min(index, remainder)
        stop += min(index + 1, remainder)
    return start, stop


class ChunkShuffleMapDataset(grain.MapDataset):
    """Serve a parent's elements epoch by epoch in a sweep of their chunks, or chunk by chunk.

    Element ``i`` of epoch ``e`` (index ``e * len + i``) is the parent's element
    ``e * len + perm_e[i]``, where ``perm_e`` depends on ``(seed, e)`` only: a sweep
    (:mod:`xpatch.core.sweep`, read ahead by :class:`~xpatch.grain.readahead.SweepReads`)
    or, without ``sweep``, groups (chunks) in a random order, each with its elements.

    Its iterator (``.to_iter_dataset()``, or iterating it) carries the source's
    fingerprint in its state, as :meth:`xpatch.grain.base.Source.with_fingerprint`
    does; after ``.batch``, ``.map`` or ``.repeat`` that iterator is Grain's, so
    end such pipelines with ``.pipe(src.with_fingerprint)``.

    Parameters
    ----------
    parent
        The dataset to shuffle.
    groups
        ``(len(parent),)`` group label of every element, or ``(len(parent), m)``
        labels, -1 padded (the chunks its patch touches: it comes with the last).
    seed
        ``0 <= seed < 2**32``.
    members
        The parent's elements to serve (a shard); default all of them.
    source
        The :class:`~xpatch.grain.base.Source` whose patches ``parent`` serves: its
        fingerprint goes in the state, its :attr:`~xpatch.grain.base.Source.chunk_reads`
        are read ahead of a sweep.
    dealt
        ``(worker_count, batch_size)``: each epoch's order is dealt to
        ``mp_prefetch`` workers that take every ``worker_count``-th batch of
        ``batch_size`` (:func:`~xpatch.core.shuffle.worker_permutation`).
    sweep
        Order the epochs as a sweep (:mod:`xpatch.core.sweep`), with ``groups``
        the chunks every patch touches, and read ahead of it; default: chunks
        in a random order, each with its patches.
    """

    _MUTATES_ELEMENT_SPEC = False

    def __init__(
        self,
        parent: grain.MapDataset,
        *,
        groups: np.ndarray,
        seed: int,
        members: np.ndarray | None = None,
        source: ShuffledSource | None = None,
        dealt: tuple[int, int] = (1, 1),
        sweep: Sweep | None = None,
    ) -> None:
        super().__init__(parent)
        self._dealt = dealt
        self._sweep = sweep
        self._reads: SweepReads | None = None
        self._seed = check_seed(seed)
        self._members = np.arange(len(parent)) if members is None else np.asarray(members)
        self._groups = np.asarray(groups)[self._members]
        self._source = source
        self._lock = threading.Lock()
        self._permutations: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._members)

    @property
    def dealt(self) -> tuple[int, int]:
        """``(worker_count, batch_size)`` the epochs are dealt to."""
        return self._dealt

    def signature(self) -> str:
        """Return the seed, the shard and the dealing: what decides this shuffle's order.

        Examples
        --------
        >>> parent = grain.MapDataset.range(4)
        >>> ChunkShuffleMapDataset(parent, groups=np.zeros(4), seed=7).signature()
        'chunk_shuffle(seed=7)'
        """
        shard = ""
        if not np.array_equal(self._members, np.arange(len(self._parent))):
            shard = f",shard={tokenize(self._members)[:8]}"
        workers, batch = self._dealt
        dealt = f",workers={workers},batch={batch}" if workers > 1 else ""
        # The chunk order as before the sweep, so that its checkpoints still restore.
        kind = "" if self._sweep is None else f",order=sweep,mix={self._sweep.mix}"
        return f"chunk_shuffle(seed={self._seed}{kind}{shard}{dealt})"

    def __str__(self) -> str:
        return f"ChunkShuffleMapDataset(seed={self._seed})"

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_permutations"] = {}
        state["_reads"] = None  # threads: each process reads ahead for itself
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def to_iter_dataset(
        self, read_options: Any = None, *, allow_nones: bool = False
    ) -> grain.IterDataset:
        """``grain.MapDataset.to_iter_dataset``, with the source's fingerprint in its state."""
        iter_dataset = super().to_iter_dataset(read_options, allow_nones=allow_nones)
        if self._source is None:
            return iter_dataset
        return FingerprintIterDataset.wrap(iter_dataset, self._source)

    def permutation(self, epoch: int) -> np.ndarray:
        """Return the order of epoch ``epoch``: positions in ``members``."""
        with self._lock:
            cached = self._permutations.get(epoch)
        if cached is not None:
            return cached
        if self._sweep is None:
            order = worker_permutation(self._groups, self._seed, epoch, *self._dealt)
        else:
            ranks, _ = self.sweep_ranks(epoch)
            order = sweep_permutation(
                self._groups, ranks, self._sweep.mix, self._seed, epoch, *self._dealt
            )
        with self._lock:
            # Two epochs are live at a boundary when prefetching runs ahead.
            if len(self._permutations) >= 2:
                self._permutations.pop(min(self._permutations))
            self._permutations[epoch] = order
        return order

    def _shuffled_index(self, index: int) -> int:
        epoch, within = divmod(int(index), len(self._members))
        member = self._members[self.permutation(epoch)[within]]
        return int(member) + epoch * len(self._parent)

    def sweep_ranks(self, epoch: int) -> tuple[np.ndarray, list[tuple[bool, ...]]]:
        """Epoch ``epoch``'s sweep: every chunk's visit rank, and which axes run high to low."""
        return sweep_ranks(self._sweep.grids, self._seed, epoch)

    def _reading(self) -> SweepReads:
        if self._reads is not None:  # every read asks: no lock once it is made
            return self._reads
        with self._lock:
            if self._reads is None:
                # The chunk reads, not the items: a wrapper's are its inner source's.
                self._reads = SweepReads(
                    self._source.chunk_reads,
                    self._groups,
                    self._sweep.chunk_count,
                    self.permutation,
                    self.sweep_ranks,
                    self._sweep.ahead,
                    self._dealt,
                )
            return self._reads

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        if self._sweep is None or self._source is None:
            return self._parent[self._shuffled_index(index)]
        reads = self._reading()
        try:
            # Inside: a position marked in flight and never marked read would hold
            # every later read at the spread's bound.
            reads.reached(index)
            return self._parent[self._shuffled_index(index)]
        finally:
            reads.finished(index)

    def _getitems(self, indices: Sequence[int]) -> Any:
        return [self[i] for i in indices]


def pipeline_order(dataset: Any) -> str:
    """Return what of a pipeline decides which element comes where: its shuffle and shape.

    A checkpoint is a position; restored into a pipeline that orders the elements
    otherwise (another seed or shard of :meth:`~xpatch.grain.base.Source.chunk_shuffle`,
    its ``worker_count`` or ``batch_size``, another ``.batch``, another number of
    ``mp_prefetch`` workers), it would continue at the same position of other
    elements, or fail inside Grain. Empty for a pipeline with none of them.

    The pipeline is walked through each dataset's parents and the datasets its
    attributes hold (``mp_prefetch`` keeps its workers' pipelines in a list).
    """
    parts: list[str] = []
    seen: set[int] = set()
    queue = [dataset]
    while queue:
        node = queue.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ChunkShuffleMapDataset):
            parts.append(node.signature())
        size = getattr(node, "_batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            parts.append(f"batch={size}")
        queue.extend(getattr(node, "parents", ()))
        for value in vars(node).values():
            if _is_dataset(value):
                queue.append(value)
            elif isinstance(value, list | tuple) and value and all(map(_is_dataset, value)):
                if len(value) > 1:
                    parts.append(f"workers={len(value)}")
                queue.extend(value)
    # Parallel workers' pipelines repeat each other's parts: one of each, in order.
    return ";".join(dict.fromkeys(parts))


def _is_dataset(value: object) -> bool:
    return isinstance(value, grain.MapDataset | grain.IterDataset)


class FingerprintIterDataset(grain.IterDataset):
    """An ``IterDataset`` whose iterator state carries a source's fingerprint.

    ``get_state()`` is ``{"xpatch_fingerprint": ..., "xpatch_order": ...,
    "xpatch_layout": ..., "pipeline": <the parent's state>}`` (strings and the
    parent's state, so it stays JSON-serialisable for Orbax): the source, what
    orders its patches in the pipeline (:func:`pipeline_order`), and the position.
    ``set_state`` raises :class:`~xpatch.OptionError` for a state saved from a
    source with another fingerprint, or without one, or from a pipeline that
    orders the patches otherwise, before touching the parent. Build it with
    :meth:`xpatch.grain.base.Source.with_fingerprint`.
    """

    def __init__(
        self, parent: grain.IterDataset, fingerprint: str, layout: str, order: str = ""
    ) -> None:
        super().__init__(parent)
        self._fingerprint = fingerprint
        self._layout = layout
        self._order = order

    @classmethod
    def wrap(cls, dataset: Any, source: ShuffledSource) -> FingerprintIterDataset:
        """``dataset`` with ``source``'s fingerprint in its state (itself if it has it already)."""
        if isinstance(dataset, grain.MapDataset):
            raise OptionError(
                f"with_fingerprint got a MapDataset ({dataset}); it wraps an IterDataset, whose "
                "iterator has a state: call .to_iter_dataset() first, e.g. "
                "ds.to_iter_dataset().pipe(src.with_fingerprint)."
            )
        if not isinstance(dataset, grain.IterDataset):
            raise OptionError(
                f"with_fingerprint got a {type(dataset).__name__}; pass a grain.IterDataset, "
                "e.g. grain.MapDataset.source(src).to_iter_dataset()."
            )
        fingerprint, order = source.fingerprint, pipeline_order(dataset)
        if isinstance(dataset, cls) and (dataset.fingerprint, dataset.order) == (
            fingerprint,
            order,
        ):
            return dataset
        layout = f"{source.patcher!r}, variables {source.variables}"
        if len(layout) > LAYOUT_CHARS:
            layout = layout[: LAYOUT_CHARS - 3] + "..."
        return cls(dataset, fingerprint, layout, order)

    @property
    def fingerprint(self) -> str:
        """The source's fingerprint the states of this dataset's iterators carry."""
        return self._fingerprint

    @property
    def order(self) -> str:
        """What orders the patches in this pipeline (:func:`pipeline_order`)."""
        return self._order

    def __iter__(self) -> grain.DatasetIterator:
        parent = self._parent.__iter__()
        return _FingerprintIterator(parent, self._fingerprint, self._layout, self._order)

    def __str__(self) -> str:
        return f"FingerprintIterDataset(fingerprint={self._fingerprint})"


class _FingerprintIterator(grain.DatasetIterator):
    """The iterator of :class:`FingerprintIterDataset`: the parent's, with a checked state."""

    _MUTATES_ELEMENT_SPEC = False

    def __init__(
        self, parent: grain.DatasetIterator, fingerprint: str, layout: str, order: str
    ) -> None:
        super().__init__(parent)
        self._fingerprint = fingerprint
        self._layout = layout
        self._order = order

    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        return {
            FINGERPRINT_KEY: self._fingerprint,
            ORDER_KEY: self._order,
            LAYOUT_KEY: self._layout,
            PIPELINE_KEY: self._parent.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or FINGERPRINT_KEY not in state or PIPELINE_KEY not in state:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise OptionError(
                f"set_state got a state without {FINGERPRINT_KEY!r} (it has {keys}): it was "
                "saved from a pipeline that did not end with .pipe(src.with_fingerprint), so "
                "nothing says which source it belongs to. Restore it into that pipeline, or, "
                f"if it was saved from this very source, pass {{{FINGERPRINT_KEY!r}: "
                f"src.fingerprint, {PIPELINE_KEY!r}: state}}."
            )
        saved = state[FINGERPRINT_KEY]
        if saved != self._fingerprint:
            saved_layout = state.get(LAYOUT_KEY, "not recorded")
            raise OptionError(
                f"set_state: the checkpoint was saved from an xpatch source with fingerprint "
                f"{saved!r} and this pipeline reads one with fingerprint {self._fingerprint!r}: "
                "another layout (size, stride, window, boundary, sampler, anchors, pad_value, "
                "pad_mode, variables, transform, "
                "or a cache_bytes or xpatch release that "
                "orders chunk_shuffle's straddling patches otherwise) or other data, so "
                "resuming would continue at the "
                f"same position in other patches. Saved: {saved_layout}. Now: {self._layout}. "
                "Where the two read the same, the data differ. To resume, rebuild the source "
                "as it was saved (the same data and the same patch(...) and to_grain(...) "
                "arguments); to train on this source, start its pipeline from the beginning "
                "(no set_state)."
            )
        # A state without the order (hand-made from Grain's, as the message above says,
        # or saved before xpatch recorded it) is taken as this pipeline's own.
        saved_order = state.get(ORDER_KEY, self._order)
        if saved_order != self._order:
            # Checkpoints saved before the sweep became chunk_shuffle's default name no order.
            before_sweep = (
                "chunk_shuffle(" in saved_order
                and "order=sweep" not in saved_order
                and "order=sweep" in self._order
            )
            hint = (
                " It was saved before chunk_shuffle's default order became the sweep: "
                "pass order='chunk' to chunk_shuffle to resume it."
                if before_sweep
                else ""
            )
            raise OptionError(
                "set_state: the checkpoint was saved from a pipeline that orders the patches "
                f"as {saved_order or 'the source does'!r} and this one orders them as "
                f"{self._order or 'the source does'!r}: another pipeline (chunk_shuffle's "
                "seed, order, mix, shard_options, worker_count or batch_size, another .batch, "
                "or another number of mp_prefetch workers), so resuming would continue at the "
                "same position of other patches, or fail inside Grain. Rebuild the pipeline as "
                "it was saved; to train with this one, start it from the beginning (no "
                f"set_state).{hint}"
            )
        self._parent.set_state(state[PIPELINE_KEY])

    def _get_next_index(self) -> int:
        return self._parent._get_next_index()

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index)

    def __str__(self) -> str:
        return f"FingerprintIterDataset(fingerprint={self._fingerprint})"
