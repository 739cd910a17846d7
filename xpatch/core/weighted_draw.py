"""Draw cells with probability proportional to a weight map, reading it chunk by chunk once.

:func:`weighted_cells` is the exact one-pass draw behind
:class:`xpatch.WeightedAnchors`: ``count`` independent draws with replacement,
kept as ``count`` reservoirs. When a chunk of mass ``m`` arrives after a total
``T`` (itself included), each reservoir takes a cell of that chunk (drawn in
proportion to its weights) with probability ``m / T``. A cell of weight ``w``
then ends in a reservoir with probability ``w / T_final``, whatever the chunk
order, and no chunk is read twice or held after its turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from xpatch.core.errors import OptionError


def weighted_cells(
    chunks: Iterable[tuple[Sequence[int], np.ndarray]], count: int, seed: int
) -> np.ndarray:
    """Return ``(count, ndim)`` cells drawn with replacement in proportion to the weights.

    Parameters
    ----------
    chunks
        ``(origin, weights)`` pairs covering the map once, in a fixed order (the
        draw depends on it): a chunk's start per axis and its weights, finite
        and >= 0.
    count
        Number of draws.
    seed
        Seed of the generator (numpy PCG64).

    Examples
    --------
    >>> w = np.zeros((4, 4)); w[1, 2] = 1.0
    >>> cells = weighted_cells([((0, 0), w[:2]), ((2, 0), w[2:])], count=3, seed=0)
    >>> cells.tolist()
    [[1, 2], [1, 2], [1, 2]]
    """
    rng = np.random.default_rng(seed)
    cells: np.ndarray | None = None
    total = 0.0
    for origin, values in chunks:
        weights = np.asarray(values, dtype=np.float64)
        if cells is None:
            cells = np.zeros((count, weights.ndim), dtype=np.int64)
        if weights.size == 0:
            continue
        bad = ~np.isfinite(weights) | (weights < 0)
        if bad.any():
            raise OptionError(
                f"WeightedAnchors: the weights in the chunk starting at {list(origin)} have "
                f"{int(bad.sum())} values that are negative or not finite (such as "
                f"{weights[bad].ravel()[0]}); weights must be finite and >= 0, e.g. "
                "weights.fillna(0).clip(min=0)."
            )
        with np.errstate(over="ignore"):  # an overflow is refused just below
            mass = float(weights.sum())
        if mass == 0.0:
            continue
        total += mass
        if not np.isfinite(total):
            raise OptionError(
                "WeightedAnchors: the weights sum to more than float64 holds; scale them "
                "down first, e.g. weights / weights.max()."
            )
        taken = rng.random(count) < mass / total
        drawn = int(taken.sum())
        if drawn:
            flat = rng.choice(weights.size, size=drawn, p=weights.ravel() / mass)
            cells[taken] = np.stack(np.unravel_index(flat, weights.shape), axis=1) + np.asarray(
                origin, dtype=np.int64
            )
    if cells is None or total == 0.0:
        raise OptionError(
            "WeightedAnchors: every weight is 0, so no cell can be drawn; give some cells "
            "a positive weight."
        )
    return cells
