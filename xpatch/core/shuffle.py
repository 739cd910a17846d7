"""Chunk-local shuffling: groups in a random order, members of a group in a random order."""

from __future__ import annotations

import numpy as np

from xpatch.core.errors import OptionError


def check_seed(seed: object) -> int:
    """Return ``seed`` as an int in ``[0, 2**32)`` or raise naming the fix."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32:
        raise OptionError(f"seed={seed!r} must be an int in [0, 2**32).")
    return int(seed)


def chunk_local_permutation(groups: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Return a permutation of ``range(len(groups))`` that keeps each group's members together.

    The groups come in a random order and the members of each group in a random
    order; the result depends on ``(seed, epoch)`` only, so every process computes
    the same one.

    Parameters
    ----------
    groups
        Group label of every element (for patches: the chunk holding the anchor),
        or ``(n, m)`` labels per element, ``-1`` where an element has fewer than
        ``m`` (for patches: every chunk the patch touches). An element with
        several labels joins the one of them that comes last, so that it is
        visited after all of them.
    seed, epoch
        Where the randomness comes from.

    Examples
    --------
    >>> order = chunk_local_permutation(np.array([0, 0, 1, 1, 1, 2]), seed=0, epoch=0)
    >>> sorted(order.tolist())
    [0, 1, 2, 3, 4, 5]
    >>> labels = np.array([0, 0, 1, 1, 1, 2])[order]
    >>> int((np.diff(labels) != 0).sum())  # each group in one run
    2
    >>> touched = np.array([[0, -1], [1, -1], [0, 1]])  # the third straddles groups 0 and 1
    >>> order = chunk_local_permutation(touched, seed=0, epoch=0)
    >>> order.tolist().index(2) > min(order.tolist().index(0), order.tolist().index(1))
    True
    """
    rng = np.random.default_rng([check_seed(seed), int(epoch)])
    groups = np.asarray(groups)
    if groups.ndim == 1:
        labels, group = np.unique(groups, return_inverse=True)
        rank = rng.permutation(len(labels))
        return np.lexsort((rng.random(len(group)), rank[group]))
    labels, flat = np.unique(groups[groups >= 0], return_inverse=True)
    rank = rng.permutation(len(labels))
    ranks = np.full(groups.shape, -1, dtype=np.int64)
    ranks[groups >= 0] = rank[flat]
    return np.lexsort((rng.random(len(groups)), ranks.max(axis=1)))


def check_count(name: str, value: object) -> int:
    """Return ``value`` as an int >= 1, or raise an OptionError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise OptionError(f"{name}={value!r} must be an int >= 1.")
    return int(value)


def worker_permutation(
    groups: np.ndarray, seed: int, epoch: int, worker_count: int, batch_size: int
) -> np.ndarray:
    """Return a chunk-local permutation dealt to workers taking every ``worker_count``-th batch.

    Grain's ``mp_prefetch`` gives worker ``w`` the batches ``w, w + W, w + 2W, ...``.
    A chunk-local order dealt round robin would have every worker read every chunk
    (and the neighbours its straddling patches reach into). Instead the elements
    are cut, in chunk order, into ``worker_count`` runs of neighbouring chunks,
    one per worker and as long as its share of the batches (which run goes to which
    worker turns with the epoch); each run gets its own chunk-local order
    (:func:`chunk_local_permutation`), which fills its worker's batches. Workers
    then share only the chunks at their runs' borders. Epoch ``e`` is taken to
    start at element ``e * len(groups)`` of a stream batched across epochs.

    Parameters
    ----------
    groups
        As for :func:`chunk_local_permutation`; with ``(n, m)`` labels the
        first (the lowest chunk index) places an element in chunk order.
    seed, epoch
        Where the randomness comes from.
    worker_count, batch_size
        ``mp_prefetch``'s number of workers and the batch size before it.

    Examples
    --------
    >>> groups = np.repeat(np.arange(4), 3)  # 4 chunks of 3 elements
    >>> order = worker_permutation(groups, seed=0, epoch=0, worker_count=2, batch_size=3)
    >>> sorted(order.tolist()) == list(range(12))
    True
    >>> chunks = groups[order].reshape(4, 3)  # batch b goes to worker b % 2
    >>> sorted(set(chunks[0::2].ravel().tolist())), sorted(set(chunks[1::2].ravel().tolist()))
    ([0, 1], [2, 3])
    """
    groups = np.asarray(groups)
    if worker_count == 1:
        return chunk_local_permutation(groups, seed, epoch)
    placed = groups if groups.ndim == 1 else groups[:, 0]
    in_chunk_order = np.argsort(placed, kind="stable")
    order = np.empty(len(groups), dtype=np.int64)
    for positions, (start, stop) in worker_runs(len(groups), epoch, worker_count, batch_size):
        run = in_chunk_order[start:stop]
        order[positions] = run[chunk_local_permutation(groups[run], seed, epoch)]
    return order


def worker_runs(n: int, epoch: int, worker_count: int, batch_size: int) -> list:
    """Per worker: ``(its positions, (start, stop) of the run of the order it gets)``.

    Worker ``w`` of ``mp_prefetch`` takes every ``worker_count``-th batch of
    ``batch_size``; it gets one contiguous run of an order, as long as its share.

    Examples
    --------
    >>> [(p.nonzero()[0].tolist(), run) for p, run in worker_runs(8, 0, 2, 2)]
    [([0, 1, 4, 5], (0, 4)), ([2, 3, 6, 7], (4, 8))]
    """
    # Batches run on across epochs (.repeat() before .batch()): epoch e starts at
    # element e * n of the stream, not at worker 0's first batch.
    worker = ((np.arange(n) + epoch * n) // batch_size) % worker_count
    counts = np.bincount(worker, minlength=worker_count)
    # The runs rotate from epoch to epoch, so that no worker keeps the same chunks.
    runs = [(w + epoch) % worker_count for w in range(worker_count)]
    dealt, start = [], 0
    for run_index in range(worker_count):
        w = runs.index(run_index)
        dealt.append((worker == w, (start, start + int(counts[w]))))
        start += int(counts[w])
    return dealt
