"""The sweep order: every chunk decoded once per epoch, within a bounded memory.

A random order of chunks reloads a chunk for every neighbour whose straddling
patches need it once the cache holds less than the chunks still waiting for a
neighbour: with a random order that is about half of them. A sweep visits the
chunks of each scene row after row, so what waits is one row (the chunks whose
lower neighbours are still to come), whatever the size of the data; a patch that
straddles chunks comes when the last of them is visited.

Randomness comes from three places, all drawn from ``(seed, epoch)``: the order of
the scenes, the direction of every axis of each sweep (and the order of axes that
have as many chunks), and the mixing: the patches of ``mix`` consecutive chunks of
the sweep are interleaved at random, so that a batch holds patches of many chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xpatch.core.shuffle import worker_runs

#: Default number of consecutive chunks of a sweep whose patches are interleaved: a
#: batch of 16 then holds patches of about 9 chunks (a global shuffle: about 16).
DEFAULT_MIX = 12

#: Default number of chunks read ahead of use (and in flight at once): enough to hide
#: a store's latency of tens of milliseconds behind decoding.
DEFAULT_AHEAD = 8

#: Reads may start this many positions ahead of the oldest position not yet read, at
#: least (Grain reads with 16 threads), or two chunks' patches if that is more. Reads
#: of cached chunks take microseconds and a chunk's load milliseconds: without a bound,
#: the other read threads would run through the chunks to come while one loads, and
#: load them all at once, past the cache's budget.
MIN_SPREAD_POSITIONS = 16

#: Separates the sweep's random stream from the other orders' for one (seed, epoch).
_SWEEP_STREAM = 0x5EE9


def sweep_ranks(
    grids: Sequence[Sequence[int]], seed: int, epoch: int
) -> tuple[np.ndarray, list[tuple[bool, ...]]]:
    """Return the visit rank of every chunk (scene after scene, row after row) and directions.

    Parameters
    ----------
    grids
        The number of chunks along each patched axis, per scene. Chunk ids are
        global: the chunks of scene ``k`` follow those of the scenes before it,
        in C order of its grid.
    seed, epoch
        Where the randomness comes from.

    Returns
    -------
    ranks : numpy.ndarray
        ``ranks[chunk]``: ``0`` for the first chunk visited.
    reversed_axes : list of tuple of bool
        Per scene, per axis: whether the sweep goes from the high end to the low
        end (so a chunk's neighbour visited later is the one below it).

    Notes
    -----
    The axis with the most chunks is swept slowest, so that the chunks waiting
    for their next row are as few as possible (one row along the others).

    Examples
    --------
    >>> ranks, reversed_axes = sweep_ranks([(2, 3)], seed=0, epoch=0)  # 2 x 3 chunks
    >>> sorted(ranks.tolist())
    [0, 1, 2, 3, 4, 5]
    >>> visit = np.argsort(ranks)  # chunk ids, in visit order
    >>> len(set((visit[:2] % 3).tolist()))  # the axis of 2 chunks is swept fastest
    1
    """
    rng = np.random.default_rng([int(seed), int(epoch), _SWEEP_STREAM])
    counts = [int(np.prod(g, dtype=np.int64)) for g in grids]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ranks = np.empty(int(offsets[-1]), dtype=np.int64)
    reversed_axes: list[tuple[bool, ...]] = [()] * len(grids)
    rank = 0
    for k in rng.permutation(len(grids)):
        shape = tuple(int(n) for n in grids[k])
        ids = np.arange(counts[k], dtype=np.int64).reshape(shape)
        reversed_axes[k] = tuple(bool(rng.random() < 0.5) for _ in shape)
        flips = tuple(slice(None, None, -1) if r else slice(None) for r in reversed_axes[k])
        ties = rng.random(len(shape))
        slowest_first = sorted(range(len(shape)), key=lambda a: (-shape[a], ties[a]))
        visit = ids[flips].transpose(slowest_first).ravel()
        ranks[offsets[k] + visit] = rank + np.arange(counts[k])
        rank += counts[k]
    return ranks, reversed_axes


def sweep_permutation(
    touched: np.ndarray,
    ranks: np.ndarray,
    mix: int,
    seed: int,
    epoch: int,
    worker_count: int = 1,
    batch_size: int = 1,
) -> np.ndarray:
    """Return the patch order of a sweep: by the last chunk each patch touches, mixed.

    Patch ``i`` is keyed to the rank of the last visited chunk it touches, plus a
    uniform draw in ``[0, mix)``: the patches of ``mix`` consecutive chunks come
    interleaved, and a patch never comes before all of its chunks were visited.

    With ``worker_count > 1`` the patches are first cut, in sweep order, into one
    run per ``mp_prefetch`` worker (:func:`~xpatch.core.shuffle.worker_runs`), and
    mixed within their run: the workers then share only the chunks at the cut
    (and those its straddling patches reach), not a mixing window's worth.

    Parameters
    ----------
    touched
        ``(n, m)`` global chunk ids each patch touches, -1 padded.
    ranks
        Visit rank of every chunk (the first of :func:`sweep_ranks`).
    mix
        How many consecutive chunks' patches are interleaved (>= 1).
    seed, epoch
        Where the randomness comes from.
    worker_count, batch_size
        ``mp_prefetch``'s number of workers and the batch size before it.

    Examples
    --------
    >>> touched = np.array([[0, -1], [0, 1], [1, -1], [2, -1]])
    >>> order = sweep_permutation(touched, np.array([0, 1, 2]), mix=1, seed=0, epoch=0)
    >>> order.tolist().index(3)  # chunk 2 is visited last: its patch comes last
    3
    """
    rng = np.random.default_rng([int(seed), int(epoch), _SWEEP_STREAM, 1])
    key_rank = ranks[key_chunks(touched, ranks)]
    keys = key_rank + int(mix) * rng.random(len(key_rank))
    if worker_count == 1:
        return np.argsort(keys, kind="stable")
    unmixed = np.lexsort((keys, key_rank))
    order = np.empty(len(keys), dtype=np.int64)
    for positions, (start, stop) in worker_runs(len(keys), epoch, worker_count, batch_size):
        run = unmixed[start:stop]
        order[positions] = run[np.argsort(keys[run], kind="stable")]
    return order


def key_chunks(touched: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Return, for every patch, the chunk it touches that the sweep visits last.

    A patch is served with that chunk, when all of its chunks were visited.

    Examples
    --------
    >>> key_chunks(np.array([[0, 1], [2, -1]]), np.array([1, 0, 2])).tolist()
    [0, 2]
    """
    touched = _as_rows(touched)
    rank = np.where(touched >= 0, ranks[np.maximum(touched, 0)], -1)
    return touched[np.arange(len(touched)), rank.argmax(axis=1)]


def _as_rows(touched: np.ndarray) -> np.ndarray:
    # (n,) chunk ids are (n, 1): one chunk per patch.
    touched = np.asarray(touched)
    return touched[:, None] if touched.ndim == 1 else touched


def chunk_uses(order: np.ndarray, touched: np.ndarray, chunk_count: int):
    """Return ``(first, last)``: the first and the last position of ``order`` using each chunk.

    ``order`` lists patch indices (or -1 for a position another process serves);
    a chunk no position uses gets ``first = len(order)`` and ``last = -1``.

    Examples
    --------
    >>> touched = np.array([[0, -1], [0, 1], [1, -1]])
    >>> first, last = chunk_uses(np.array([2, 0, 1]), touched, 3)
    >>> first.tolist(), last.tolist()
    ([1, 0, 3], [2, 2, -1])
    """
    touched = _as_rows(touched)
    positions = np.flatnonzero(order >= 0)
    chunks = touched[order[positions]]
    where = np.repeat(positions, chunks.shape[1])
    chunks = chunks.ravel()
    used = chunks >= 0
    first = np.full(chunk_count, len(order), dtype=np.int64)
    last = np.full(chunk_count, -1, dtype=np.int64)
    np.minimum.at(first, chunks[used], where[used])
    np.maximum.at(last, chunks[used], where[used])
    return first, last


def waiting_row(grid: Sequence[int]) -> int:
    """Return how many chunks of a sweep over ``grid`` wait for their next row at most.

    One row along every axis but the slowest (the one with the most chunks), and one.

    Examples
    --------
    >>> waiting_row((32, 16)), waiting_row((8,)), waiting_row((4, 4, 2))
    (17, 2, 9)
    """
    counts = sorted(int(n) for n in grid)
    return int(np.prod(counts[:-1], dtype=np.int64)) + 1


def spread_positions(patch_count: int, chunk_count: int) -> int:
    """Return how far reads may run ahead of the oldest position not yet read.

    Examples
    --------
    >>> spread_positions(1849, 256), spread_positions(4000, 10)
    (16, 800)
    """
    per_chunk = patch_count / max(chunk_count, 1)
    return max(MIN_SPREAD_POSITIONS, int(np.ceil(2 * per_chunk)))


def reads_span(patch_count: int, chunk_count: int) -> int:
    """Return how many chunks the reads in flight span (:func:`spread_positions`).

    Examples
    --------
    >>> reads_span(1849, 256)  # about 7 patches a chunk
    4
    """
    per_chunk = max(patch_count / max(chunk_count, 1), 1.0)
    return int(np.ceil(spread_positions(patch_count, chunk_count) / per_chunk)) + 1


def sweep_budget(
    cache_bytes: int,
    chunk_bytes: int,
    waiting_bytes: int,
    span: int = 1,
    mix: int | None = None,
    ahead: int | None = None,
) -> tuple[int, int]:
    """Return ``(mix, ahead)`` that fit a sweep in ``cache_bytes``, unless given.

    The cache holds the chunks whose patches are being mixed, those read ahead,
    those the reads in flight span (:func:`reads_span`), and what the chunks
    waiting for their next row keep (their frames, or themselves):
    ``(mix + ahead + span) * chunk_bytes + waiting_bytes``.

    Examples
    --------
    >>> sweep_budget(51 * 2**20, 2 * 2**20, 8 * 2**20, span=6)  # 5 % of 1 GiB, 2 MiB chunks
    (10, 5)
    >>> sweep_budget(512 * 2**20, 2 * 2**20, 0)
    (12, 8)
    >>> sweep_budget(4 * 2**20, 2 * 2**20, 2**20)  # room for one chunk: no mixing
    (1, 1)
    """
    spare = max(0, (int(cache_bytes) - int(waiting_bytes)) // max(int(chunk_bytes), 1) - span)
    if ahead is None:
        ahead = 0 if chunk_bytes == 0 else int(np.clip(spare // 3, 1, DEFAULT_AHEAD))
    if mix is None:
        mix = int(np.clip(spare - ahead, 1, DEFAULT_MIX))
    return int(mix), int(ahead)
