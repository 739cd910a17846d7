"""What the dtype rules of the reductions read: a plan's coverage, value ranges, NaN.

The coverage of a plan is read off its geometry (:func:`covers_every_cell`): it
decides whether an integer result can stay an integer (an integer holds no NaN for
the cells that no patch covers), so that a result's dtype is known while its graph
is built. The rules themselves are the reductions' (:mod:`xpatch.core.blend.reductions`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence

import numpy as np

from xpatch.core.errors import PredictionError
from xpatch.core.plan import Plan, reaching


def value_range(groups: Sequence[np.ndarray]) -> tuple[int, int]:
    """Smallest and largest value of some integer arrays, as Python ints."""
    present = [g for g in groups if g.size] or [np.zeros(1, np.int64)]
    return min(int(g.min()) for g in present), max(int(g.max()) for g in present)


def covers_every_cell(anchors: np.ndarray, size: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether the patches at ``anchors`` cover every cell of a grid of ``shape``.

    From the geometry alone, so that a result's dtype is known while its graph is
    built: coverage is counted on the grid compressed to the patch edges, and a
    box whose compressed grid is large is halved first.

    Examples
    --------
    >>> covers_every_cell(np.array([[0], [3]]), [3], [6])
    True
    >>> covers_every_cell(np.array([[0, 0], [2, 2]]), [2, 2], [4, 4])
    False
    """
    anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, len(shape))
    size, shape = np.asarray(size, np.int64), np.asarray(shape, np.int64)
    if len(anchors) * np.prod(size, dtype=np.float64) < np.prod(shape, dtype=np.float64):
        return False  # fewer cells in all patches together than in the grid
    return _covers_box(anchors, size, np.zeros_like(shape), shape)


def _covers_box(anchors: np.ndarray, size: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    reach = reaching(anchors, size, lo, hi)
    if not reach.any():
        return False
    count, halves = _box_counts(anchors[reach], size, lo, hi)
    if halves is not None:
        return all(_covers_box(anchors[reach], size, *half) for half in halves)
    return bool((count > 0).all())


def _most_in_box(anchors: np.ndarray, size: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int:
    reach = reaching(anchors, size, lo, hi)
    if not reach.any():
        return 0
    count, halves = _box_counts(anchors[reach], size, lo, hi)
    if halves is not None:
        return max(_most_in_box(anchors[reach], size, *half) for half in halves)
    return int(count.max(initial=0))


def _box_counts(
    anchors: np.ndarray, size: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray | None, list | None]:
    """Patches per cell of the box ``[lo, hi)``, on its grid compressed to the patch edges.

    Returns ``(counts, None)``, or ``(None, halves)``: the two boxes ``(lo, hi)`` to
    count instead where the compressed grid is large (the axis with most edges halved).
    """
    starts, ends = np.clip(anchors, lo, hi), np.clip(anchors + size, lo, hi)
    cuts = [np.unique(np.r_[a, b, s, e]) for a, b, s, e in zip(lo, hi, starts.T, ends.T)]
    if np.prod([float(len(c)) for c in cuts]) > 2**20:  # halve the axis with the most edges
        j = int(np.argmax([len(c) for c in cuts]))
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[j] = right_lo[j] = cuts[j][len(cuts[j]) // 2]
        return None, [(lo, left_hi), (right_lo, hi)]
    # Coverage counts on the compressed grid: +-1 at the corners of each patch, then cumsum.
    count = np.zeros([len(c) for c in cuts], dtype=np.int64)
    edges = [
        (np.searchsorted(c, s), np.searchsorted(c, e)) for c, s, e in zip(cuts, starts.T, ends.T)
    ]
    for corner in itertools.product((0, 1), repeat=len(cuts)):
        index = tuple(pair[bit] for pair, bit in zip(edges, corner))
        np.add.at(count, index, -1 if sum(corner) % 2 else 1)
    for j in range(count.ndim):
        np.cumsum(count, axis=j, out=count)
    return count[tuple(slice(0, len(c) - 1) for c in cuts)], None


def most_covering(anchors: np.ndarray, size: Sequence[int], shape: Sequence[int]) -> int:
    """Return the most patches at ``anchors`` that cover one cell of a grid of ``shape``.

    It bounds how many terms a cell's blend adds, hence float64's rounding error.

    Examples
    --------
    >>> most_covering(np.array([[0], [2], [4]]), [4], [8]), most_covering(np.zeros(0), [4], [8])
    (2, 0)
    """
    anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, len(shape))
    size, shape = np.asarray(size, np.int64), np.asarray(shape, np.int64)
    return _most_in_box(anchors, size, np.zeros_like(shape), shape)


#: Plan -> whether its patches cover every cell (a plan is immutable; it is asked once).
_COVERAGE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: Plan -> the most patches that cover one of its cells.
_MOST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plan_most_covering(plan: Plan) -> int:
    """Return the most patches of ``plan`` that cover one cell of its grid (cached per plan)."""
    most = _MOST.get(plan)
    if most is None:
        most = _MOST[plan] = most_covering(plan.anchors, plan.size, plan.grid.shape)
    return most


def plan_covers(plan: Plan) -> bool:
    """Whether the patches of ``plan`` cover every cell of its grid (cached per plan)."""
    covered = _COVERAGE.get(plan)
    if covered is None:
        covered = _COVERAGE[plan] = covers_every_cell(plan.anchors, plan.size, plan.grid.shape)
    return covered


def holds_nan(values: np.ndarray) -> bool:
    """Tell whether ``values`` holds a NaN, in one read and without a mask.

    ``min`` propagates NaN: half the time of ``np.isnan(values).any()`` on a
    64 MiB array, which also makes a 16 MiB mask.

    Examples
    --------
    >>> holds_nan(np.array([1.0, np.nan])), holds_nan(np.arange(3)), holds_nan(np.ones(0))
    (True, False, False)
    >>> holds_nan(np.array([np.inf, -np.inf], "f2")), holds_nan(np.array([np.nan, np.inf], "f2"))
    (False, True)
    """
    if values.size == 0 or values.dtype.kind not in "fc":
        return False
    if values.dtype.kind == "c":  # min orders complex values; keep the plain test
        return bool(np.isnan(values).any())
    return bool(np.isnan(values.min()))


def rounding_limit(most: int) -> float:
    """Return the largest ``|mean|`` that float64 blends of integers round to the right integer.

    A float64 mean of ``most`` overlapping values (Σ w·x / Σ w) is off by at most
    about ``(2·most + 4)`` units of its last place (2**-53 relative): below this
    limit that is under half an integer, so ``rint`` gives the integer a blend of
    agreeing integers is. Above it (int64 values past ~1e14: microsecond timestamps)
    an integer result may be off by one or more, and would look exact.

    Examples
    --------
    >>> rounding_limit(4) == 2**52 / 12, rounding_limit(1) == 2**52 / 6
    (True, True)
    """
    return 2.0**52 / (2 * max(int(most), 1) + 4)


def check_rounds_exactly(block: np.ndarray, most: int, stored: np.dtype, what: str) -> np.ndarray:
    """Return a float blend ``block``, refusing values that ``stored`` would round wrongly.

    ``most``: the most patches covering one cell (:func:`plan_most_covering`);
    ``what``: how the caller named the stored dtype (``"out_dtype='int64'"``).

    Examples
    --------
    >>> check_rounds_exactly(np.array([1.5, np.nan]), 4, np.dtype("int64"), "out_dtype").tolist()
    [1.5, nan]
    >>> check_rounds_exactly(np.array([2.0**53]), 4, np.dtype("int64"), "out_dtype='int64'")
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: out_dtype='int64': the blend reaches 9.0072e+15, ...
    """
    limit = rounding_limit(most)
    largest = float(np.fmax.reduce(np.abs(block), axis=None, initial=0.0)) if block.size else 0.0
    if largest > limit:
        raise PredictionError(
            f"{what}: the blend reaches {largest:.6g}, past 2**53 / {int(2**53 / limit)} = "
            f"{limit:.6g}, beyond which a float64 blend of up to {most} overlapping integers "
            f"(reduce='mean' blends in float64) can be off by one or more after rounding: "
            f"stored as {stored} it would look exact and be wrong. Subtract an offset "
            "first (e.g. timestamps minus the first) and add it back after, take "
            "reduce='max' or 'min' (exact for integers), or keep a float "
            "(out_dtype='float64')."
        )
    return block
