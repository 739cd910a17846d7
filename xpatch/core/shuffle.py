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
