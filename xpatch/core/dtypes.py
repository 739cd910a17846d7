"""Dtype rules of the reductions: what predictions are reduced in, and what comes back.

Also the coverage of a plan read off its geometry (:func:`covers_every_cell`), which
decides whether an integer result can stay an integer (an integer holds no NaN for
the cells that no patch covers), so that a result's dtype is known while its graph is
built.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from xpatch.core.checks import check_choice
from xpatch.core.errors import PredictionError
from xpatch.core.plan import Plan, reaching
from xpatch.core.windows import BlendWindow

Reduction = Literal["mean", "sum", "max", "min", "vote"]
REDUCTIONS: tuple[str, ...] = get_args(Reduction)


def check_reduction(reduce: object) -> Reduction:
    """Return ``reduce`` if it is known, else raise listing the valid ones."""
    return check_choice("reduce", reduce, REDUCTIONS)  # type: ignore[return-value]


def accumulation_dtype(
    dtype: np.dtype,
    reduce: Reduction = "mean",
    *,
    window: np.ndarray | BlendWindow | None = None,
    covered: bool = False,
) -> np.dtype:
    """Return the dtype in which ``dtype`` predictions are reduced, and the result's.

    Floats: float32 for half and single precision, else float64 (or complex). Integers: the
    :func:`exact_integer_dtype` if every cell of the grid is ``covered`` (an integer holds no
    NaN; :func:`xpatch.core.partials.result_dtype` reads that off a plan), else float64.

    Examples
    --------
    >>> [str(accumulation_dtype(np.dtype(t))) for t in ("float16", "float32", "uint8", "int64")]
    ['float32', 'float32', 'float64', 'float64']
    >>> [str(accumulation_dtype(np.dtype("uint8"), r, window=np.ones(3), covered=True))
    ...  for r in ("max", "sum", "mean")]
    ['uint8', 'uint64', 'float64']
    """
    dtype = np.dtype(dtype)
    if reduce == "vote":
        check_vote_dtype(dtype)
    if np.issubdtype(dtype, np.inexact):
        return np.result_type(dtype, np.float32)
    exact = exact_integer_dtype(dtype, reduce, window)
    return exact if exact is not None and covered else np.dtype(np.float64)


def working_dtype(acc: np.dtype, reduce: Reduction, window) -> np.dtype:
    """Return the dtype a ``"mean"`` into ``acc`` is computed in: ``acc``, or float64.

    A mean divides Σw·x by Σw. A weight below float32's smallest normal number divided
    by its epsilon (~1e-31; the tails of a narrow Gaussian, e.g. 3e-43 at the ends of
    ``("gaussian", 1.5)`` over 43 cells) keeps only a few bits in float32, or becomes 0,
    so the cells only such weights reach would come back off by ~1e-4 or NaN. Such a
    window is blended in float64, and the result cast back to ``acc``.

    Examples
    --------
    >>> f32 = np.dtype("float32")
    >>> [str(working_dtype(f32, "mean", w)) for w in (np.ones(3), np.array([1e-43, 1.0]))]
    ['float32', 'float64']
    >>> str(working_dtype(f32, "sum", np.array([1e-43, 1.0])))
    'float32'
    """
    acc = np.dtype(acc)
    if reduce != "mean" or acc.kind not in "fc" or np.finfo(acc).bits >= 64:
        return acc
    info = np.finfo(acc)
    if BlendWindow.of(window).values.min(initial=np.inf) >= info.tiny / info.eps:
        return acc
    return np.result_type(acc, np.float64)


def exact_integer_dtype(dtype: np.dtype, reduce: Reduction, window) -> np.dtype | None:
    """Return the integer dtype that reduces integers of ``dtype`` exactly, or None.

    ``"max"`` / ``"min"`` / ``"vote"`` pick a value: ``dtype``. ``"sum"`` with whole weights
    (``"boxcar"``; and whole separable factors, which weigh too): int64, uint64 for unsigned.
    Else None.
    """
    kind = np.dtype(dtype).kind
    if reduce == "vote":  # a vote picks one of the labels
        return np.dtype(dtype) if kind in "biu" else None
    if kind not in "iu" or reduce == "mean" or (reduce == "sum" and window is None):
        return None
    if reduce in ("max", "min"):
        return np.dtype(dtype)
    window = BlendWindow.of(window)
    if all((np.mod(v, 1) == 0).all() for v in (window.values, *(window.factors or ()))):
        return np.dtype(np.uint64 if np.dtype(dtype).kind == "u" else np.int64)
    return None


def reduction_fill(dtype: np.dtype, reduce: Reduction) -> object:
    """Return a cell's value before anything lands: NaN, or an integer max's / min's identity."""
    if np.dtype(dtype).kind not in "iu":
        return np.nan
    return getattr(np.iinfo(dtype), "min" if reduce == "max" else "max")


def value_range(groups: Sequence[np.ndarray]) -> tuple[int, int]:
    """Smallest and largest value of some integer arrays, as Python ints."""
    present = [g for g in groups if g.size] or [np.zeros(1, np.int64)]
    return min(int(g.min()) for g in present), max(int(g.max()) for g in present)


def check_exact_in_float(groups: Sequence[np.ndarray], reduce: Reduction, window) -> None:
    """Refuse integers beyond 2**53 that an exact reduction would return rounded in float64.

    ``"max"``, ``"min"``, ``"vote"`` and an integral ``"sum"`` of integers are float64 only
    when some cell is covered by no patch (it is NaN).
    """
    exact = exact_integer_dtype(groups[0].dtype, reduce, window) if groups else None
    if exact is None or exact.kind == "b" or np.iinfo(groups[0].dtype).bits < 53:
        return
    low, high = value_range(groups)
    if max(-low, high) > 2**53:
        raise PredictionError(
            f"reduce={reduce!r} of {groups[0].dtype} predictions from {low} to {high} gives "
            "float64, because some cells are covered by no patch (NaN there), and float64 holds "
            "integers exactly only up to 2**53. Cover every cell (boundary='shift' or 'pad', "
            f"stride <= size) to get an exact {exact} result."
        )


def check_vote_dtype(dtype: np.dtype) -> None:
    """Refuse predictions that ``reduce="vote"`` cannot count: it votes on class labels.

    Examples
    --------
    >>> check_vote_dtype(np.dtype("uint8"))
    >>> check_vote_dtype(np.dtype("float32"))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: reduce='vote' counts class labels, ...
    """
    dtype = np.dtype(dtype)
    if dtype.kind not in "biu":
        raise PredictionError(
            f"reduce='vote' counts class labels, which must be bool or integers; the "
            f"predictions are {dtype}. Pass labels (pred.round().astype('uint8'), or "
            "scores.argmax(...) per patch; to apply, dtype='uint8' and fn returning labels), "
            "or blend scores with reduce='mean' and take the argmax of the result."
        )


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
    anchors = anchors[reach]
    starts, ends = np.clip(anchors, lo, hi), np.clip(anchors + size, lo, hi)
    cuts = [np.unique(np.r_[a, b, s, e]) for a, b, s, e in zip(lo, hi, starts.T, ends.T)]
    if np.prod([float(len(c)) for c in cuts]) > 2**20:  # halve the axis with the most edges
        j = int(np.argmax([len(c) for c in cuts]))
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[j] = right_lo[j] = cuts[j][len(cuts[j]) // 2]
        return _covers_box(anchors, size, lo, left_hi) and _covers_box(anchors, size, right_lo, hi)
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
    return bool((count[tuple(slice(0, len(c) - 1) for c in cuts)] > 0).all())


#: Plan -> whether its patches cover every cell (a plan is immutable; it is asked once).
_COVERAGE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plan_covers(plan: Plan) -> bool:
    """Whether the patches of ``plan`` cover every cell of its grid (cached per plan)."""
    covered = _COVERAGE.get(plan)
    if covered is None:
        covered = _COVERAGE[plan] = covers_every_cell(plan.anchors, plan.size, plan.grid.shape)
    return covered


def result_dtype(dtype: np.dtype, reduce: Reduction, window, plan: Plan) -> np.dtype:
    """Return the dtype of reducing ``dtype`` predictions on ``plan``, read off the geometry.

    :func:`~xpatch.core.overlap_add.accumulation_dtype`, with the coverage of
    the plan: integers stay integers for ``"max"``, ``"min"`` and an integral
    ``"sum"`` when every cell is covered. Nothing is computed.

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid
    >>> grid = ChunkGrid.from_chunks([(6,)])
    >>> full = Plan.compile(np.array([[0], [3]]), grid, [3], keep_order=True)
    >>> gap = Plan.compile(np.array([[0], [4]]), grid, [2], keep_order=True)
    >>> [str(result_dtype(np.dtype("int16"), "max", np.ones(3), p)) for p in (full, gap)]
    ['int16', 'float64']
    """
    exact = exact_integer_dtype(dtype, reduce, window) is not None
    covered = exact and plan_covers(plan)
    return accumulation_dtype(dtype, reduce, window=window, covered=covered)


def weighted_result_dtype(
    dtype: np.dtype, reduce: Reduction, window, plan: Plan, weighted: bool
) -> np.dtype:
    """:func:`result_dtype`, or with float weights (``weighted``) the float accumulation dtype.

    A vote still returns its labels' dtype; a weighted mean or sum of integers is float64.

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid
    >>> plan = Plan.compile(np.array([[0], [3]]), ChunkGrid.from_chunks([(6,)]), [3],
    ...                     keep_order=True)
    >>> [str(weighted_result_dtype(np.dtype("int16"), r, np.ones(3), plan, True))
    ...  for r in ("sum", "vote")]
    ['float64', 'int16']
    """
    if weighted and reduce != "vote":
        return accumulation_dtype(dtype, reduce)
    return result_dtype(dtype, reduce, window, plan)


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
