"""The reductions: how the results of overlapping patches combine in a cell.

Each reduction is one object, as flox's aggregations are: it knows its
accumulator, how it adds the patches that land on a block (eagerly, :meth:`block`),
what one group of patches leaves in its box (lazily, :meth:`partial`), how the
partials on an output block combine into the result (:meth:`combine`), and the
result's dtype. The drivers (:mod:`xpatch.core.blend.overlap_add` eagerly,
:mod:`xpatch.core.blend.partials` on dask, :mod:`xpatch.core.apply`) ask the
reduction and never compare its name.

- :data:`MEAN` (Σ w·x / Σ w) and :data:`SUM` (Σ w·x): a :class:`WeightedSum`;
- :data:`MAX` and :data:`MIN`: an :class:`Extreme`, unweighted;
- :data:`VOTE`: a :class:`Vote` of class labels (:mod:`xpatch.core.blend.vote`);
- :data:`ARGMAX`: blends as the mean, then each cell takes the index of its largest
  score along one class axis (:meth:`Argmax.finalize`).

A new reduction is a subclass in one module: pass the object as ``reduce=``
anywhere a name is taken, or :func:`register` it under its name.

Examples
--------
>>> as_reduction("max").name, as_reduction(MEAN) is MEAN
('max', True)
>>> u8 = np.dtype("uint8")
>>> MEAN.accumulation_dtype(u8), MAX.accumulation_dtype(u8, covered=True)
(dtype('float64'), dtype('uint8'))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np

from xpatch.core.blend.dtypes import plan_covers, value_range
from xpatch.core.blend.lattice import all_positive, outer_product, product_sums
from xpatch.core.blend.placement import (
    Block,
    BlockWeights,
    Landing,
    Partial,
    Piece,
    place_patches,
)
from xpatch.core.blend.sums import (
    add_extreme,
    add_sums,
    check_wrapped,
    integer_sum_shadow,
    narrowed,
    normalise,
)
from xpatch.core.blend.vote import present_labels, vote_block, vote_partial, vote_pieces
from xpatch.core.blend.weighted import beyond_float32, weighted_sums
from xpatch.core.checks import check_choice
from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import OptionError, PredictionError
from xpatch.core.plan import Plan
from xpatch.core.windows import BlendWindow

#: The names of the reductions that blend (``reconstruct``'s ``reduce=``).
ReductionName = Literal["mean", "sum", "max", "min", "vote"]
#: ``apply``'s and ``reconstruct``'s ``reduce=``: the blends, and ``"argmax"``.
ReduceOption = ReductionName | Literal["argmax"]


class Reduction:
    """How overlapping results combine: accumulator, partials, finish and dtype.

    Attributes
    ----------
    name
        What ``reduce=`` calls it.
    weighted
        Weights (``weights=``) multiply the window.
    picks
        The result is one of the covering values: it keeps their dtype, weighted or not.
    sums, normalised
        A Σ w·x accumulator, which the lattice and batch kernels can add;
        ``normalised``: divided by Σ w (a mean).
    keeps_integers
        ``apply`` stores a blend of integers in their dtype by default.
    reduces_lead
        The result drops the one non-patched axis of the predictions (a label map).
    """

    name: str = ""
    weighted: bool = False
    picks: bool = False
    sums: bool = False
    normalised: bool = False
    keeps_integers: bool = False
    reduces_lead: bool = False

    def __repr__(self) -> str:
        return f"<reduction {self.name!r}>"

    def __dask_tokenize__(self) -> str:
        # A reduction is its name in graph names, as the string it replaced was.
        return self.name

    @property
    def blend(self) -> Reduction:
        """The reduction that overlap-add computes (itself; the mean for ``"argmax"``)."""
        return self

    # -- dtypes -------------------------------------------------------------------------

    def check_dtype(self, dtype: np.dtype) -> None:
        """Refuse predictions of ``dtype`` this reduction cannot combine."""

    def exact_integer_dtype(self, dtype: np.dtype, window: Any) -> np.dtype | None:
        """Return the integer dtype that reduces integers of ``dtype`` exactly, or None."""
        return None

    def fill(self, dtype: np.dtype) -> object:
        """Return a cell's value before anything lands on it."""
        return np.nan

    def working_dtype(
        self, acc: np.dtype, window: Any, weights: Sequence[np.ndarray] | None = None
    ) -> np.dtype:
        """Return the dtype a result in ``acc`` is computed in (cast back to ``acc``).

        ``weights``: the groups of weights that multiply the window, if any.
        """
        return np.dtype(acc)

    def accumulation_dtype(
        self, dtype: np.dtype, window: Any = None, covered: bool = False
    ) -> np.dtype:
        """Return the dtype in which ``dtype`` predictions are reduced, and the result's.

        Floats: float32 for half and single precision, else float64 (or complex).
        Integers: the :meth:`exact_integer_dtype` if every cell of the grid is
        ``covered`` (an integer holds no NaN; :meth:`result_dtype` reads that off a
        plan), else float64.
        """
        dtype = np.dtype(dtype)
        self.check_dtype(dtype)
        if np.issubdtype(dtype, np.inexact):
            return np.result_type(dtype, np.float32)
        exact = self.exact_integer_dtype(dtype, window)
        return exact if exact is not None and covered else np.dtype(np.float64)

    def result_dtype(
        self, dtype: np.dtype, window: Any, plan: Plan, weighted: bool = False
    ) -> np.dtype:
        """Return the dtype of reducing ``dtype`` predictions on ``plan``, read off the geometry.

        Integers stay integers where :meth:`exact_integer_dtype` says so and every
        cell is covered; with float ``weighted`` (``weights=``) a sum or mean is a
        float. Nothing is computed.
        """
        if weighted and not self.picks:
            return self.accumulation_dtype(dtype)
        exact = self.exact_integer_dtype(dtype, window) is not None
        covered = exact and plan_covers(plan)
        return self.accumulation_dtype(dtype, window, covered)

    def check_exact_in_float(
        self, groups: Sequence[np.ndarray], window: Any, weighted: bool = False
    ) -> None:
        """Refuse integers beyond 2**53 that an exact reduction would return rounded in float64.

        Exact reductions of integers are float64 only when some cell is covered by
        no patch (it is NaN), or with float ``weighted`` weights (then a float is
        what was asked for).
        """
        exact = self.exact_integer_dtype(groups[0].dtype, window) if groups else None
        if weighted or exact is None or exact.kind == "b" or np.iinfo(groups[0].dtype).bits < 53:
            return
        low, high = value_range(groups)
        if max(-low, high) > 2**53:
            raise PredictionError(
                f"reduce={self.name!r} of {groups[0].dtype} predictions from {low} to {high} "
                "gives float64, because some cells are covered by no patch (NaN there), and "
                "float64 holds integers exactly only up to 2**53. Cover every cell "
                f"(boundary='shift' or 'pad', stride <= size) to get an exact {exact} result."
            )

    def check_weights_allowed(self) -> None:
        """Refuse ``weights=`` when this reduction does not weigh."""
        if not self.weighted:
            allowed = [name for name, r in _REGISTRY.items() if r.weighted]
            raise OptionError(
                f"weights= with reduce={self.name!r}: it picks one covering prediction per "
                f"cell, unweighted, so a weight cannot change it. Drop weights=, or use "
                f"reduce in {allowed!r}."
            )

    # -- blending -----------------------------------------------------------------------

    def shared(self, prediction_groups: Sequence[np.ndarray]) -> object:
        """Return what every block of one eager call shares (read once from the groups)."""
        return None

    def block(
        self, out: np.ndarray, landing: Landing, shared: object = None
    ) -> np.ndarray:  # pragma: no cover - every reduction defines it
        """Reduce the patches that land on a block into ``out``: the block's result.

        ``out`` is ``(*lead, *block)`` in the :meth:`working_dtype`; its content is
        ignored. NaN where nothing valid lands (for float results).
        """
        raise NotImplementedError

    def partial(
        self, landing: Landing, box: tuple[int, ...], acc: np.dtype, reaching: np.ndarray
    ) -> Partial:  # pragma: no cover - every reduction defines it
        """Add one group's patches into its ``box`` without finishing: a :class:`Partial`.

        ``box`` is ``(*lead, *landing.shape)``, ``acc`` the :meth:`working_dtype`,
        ``reaching`` the anchors of the patches that reach the box.
        """
        raise NotImplementedError

    def combine(
        self, out_shape: tuple[int, ...], acc: np.dtype, pieces: Sequence[Piece], block: Block
    ) -> np.ndarray:  # pragma: no cover - every reduction defines it
        """Combine the partials' pieces that fall on ``block`` into its result, in ``acc``."""
        raise NotImplementedError

    def finalize(self, data: Any, axis: int) -> Any:
        """Return the stored result from the blend (itself; a label map for ``"argmax"``)."""
        return data


class WeightedSum(Reduction):
    """Σ w·x, divided by Σ w for a mean (``normalised``).

    Σ w comes from the anchors and the window alone (:class:`BlockWeights`), unless
    weights from the model multiply the window or a prediction is NaN: then Σ w
    is summed beside Σ w·x. A sum counts Σ w in float64 only to tell which cells a
    value reached, where float32 may round the smallest weights to 0.
    """

    weighted = True
    sums = True

    def __init__(self, name: str, normalised: bool) -> None:
        self.name = name
        self.normalised = normalised
        self.keeps_integers = normalised  # a mean of integers rounds back to them

    def exact_integer_dtype(self, dtype: np.dtype, window: Any) -> np.dtype | None:
        """Return int64 (uint64) for a sum of integers with whole weights; a mean is never exact."""
        if self.normalised or np.dtype(dtype).kind not in "iu" or window is None:
            return None
        window = BlendWindow.of(window)
        if all((np.mod(v, 1) == 0).all() for v in (window.values, *(window.factors or ()))):
            return np.dtype(np.uint64 if np.dtype(dtype).kind == "u" else np.int64)
        return None

    def working_dtype(
        self, acc: np.dtype, window: Any, weights: Sequence[np.ndarray] | None = None
    ) -> np.dtype:
        """Return float64 for sums float32 would lose: tiny or huge weights.

        A mean divides Σw·x by Σw. A weight below float32's smallest normal number
        divided by its epsilon (~1e-31; the tails of a narrow Gaussian, e.g. 3e-43
        at the ends of ``("gaussian", 1.5)`` over 43 cells) keeps only a few bits in
        float32, or becomes 0, so the cells only such weights reach would come back
        off by ~1e-4 or NaN. Weights from the model outside float32's range
        (:data:`~xpatch.core.blend.weighted.FLOAT32_WEIGHTS`: 1e-40 everywhere,
        or 3.5e38) are summed in float64 for a mean and a sum alike.
        """
        acc = np.dtype(acc)
        if acc.kind not in "fc" or np.finfo(acc).bits >= 64:
            return acc
        wide = np.result_type(acc, np.float64)
        if weights is not None and beyond_float32(weights):
            return wide
        info = np.finfo(acc)
        if not self.normalised or BlendWindow.of(window).values.min() >= info.tiny / info.eps:
            return acc
        return wide

    def block(self, out: np.ndarray, landing: Landing, shared: object = None) -> np.ndarray:
        """Return Σ w·x of the block, divided by Σ w for a mean; NaN where nothing valid lands."""
        exact_total = not self.normalised
        if landing.weigh is not None:  # Σ w depends on the data: summed beside Σ w·x
            total = weighted_sums(
                out, landing.placements, landing.groups, landing.weigh, exact_total
            )
            return normalise(out, total, self.normalised)
        weights, valid = add_sums(out, landing, self.normalised, exact_total)
        if out.dtype.kind in "iu":  # an integral sum
            _, shadow = integer_sum_shadow(out, weights, landing)
            if shadow is not None:
                check_wrapped(out, shadow)
            return out
        if valid is not None:
            return normalise(out, valid, self.normalised)
        everywhere = weights.covers_all()
        if not weights.normalised and self.normalised:
            with np.errstate(invalid="ignore", divide="ignore"):  # uncovered cells: NaN below
                np.divide(out, weights.total(), out=out)
        if not everywhere:
            out[..., ~weights.covered()] = np.nan
        return out

    def partial(
        self, landing: Landing, box: tuple[int, ...], acc: np.dtype, reaching: np.ndarray
    ) -> Partial:
        """Return Σ w·x over the box; Σ w too when it depends on the data (weights, NaN)."""
        out = np.empty(box, dtype=acc)
        exact_total = not self.normalised
        if landing.weigh is not None:
            total = weighted_sums(
                out, landing.placements, landing.groups, landing.weigh, exact_total
            )
            return Partial(landing.origin, out, total, reaching)
        weights, valid = add_sums(out, landing, False, exact_total)
        if out.dtype.kind not in "iu":
            return Partial(landing.origin, out, valid, reaching)
        # An integral sum wraps modulo 2**64 and is checked once the block is whole.
        bound, shadow = integer_sum_shadow(out, weights, landing)
        return Partial(landing.origin, out, valid, reaching, bound, shadow)

    def combine(
        self, out_shape: tuple[int, ...], acc: np.dtype, pieces: Sequence[Piece], block: Block
    ) -> np.ndarray:
        """Add the pieces' Σ w·x, then divide by Σ w of their anchors (or their own Σ w)."""
        # Pieces summed in float64 (weights float32 would lose) are added in float64.
        working = [self.working_dtype(acc, block.window), *(p.partial.total.dtype for p in pieces)]
        out = np.zeros(out_shape, dtype=np.result_type(*working))
        for piece in pieces:
            out[piece.region] += piece.partial.total
        if acc.kind in "iu":  # an integral sum, every cell covered: exact unless it wrapped
            if sum(piece.partial.bound for piece in pieces) >= np.iinfo(acc).max / 2:
                shadow = np.zeros(out_shape, dtype=np.float64)
                for piece in pieces:
                    part = piece.partial
                    shadow[piece.region] += part.total if part.shadow is None else part.shadow
                check_wrapped(out, shadow)
            return out
        return self._divided(out, acc, pieces, block)

    def _divided(
        self, out: np.ndarray, acc: np.dtype, pieces: Sequence[Piece], block: Block
    ) -> np.ndarray:
        """``out`` (Σ w·x) divided by Σ w for a mean, NaN where nothing landed, in ``acc``."""
        window, block_origin, block_shape = block.window, block.origin, block.shape
        k = len(block_shape)
        real = np.empty(0, dtype=out.dtype).real.dtype

        def window_sums(box_origin, box_shape, anchors) -> BlockWeights:
            placements = place_patches(box_origin, box_shape, [anchors], window.values.shape)
            return BlockWeights(box_origin, box_shape, placements, window, real, normalise=False)

        if all(piece.partial.weight is None for piece in pieces):
            anchors = np.concatenate(
                [np.empty((0, k), np.int64), *(piece.partial.anchors for piece in pieces)]
            )
            # Σw of a product grid is the outer product of per-axis sums: no loop over
            # patches, and, where it covers every cell, only the dtype the division needs.
            sums = product_sums(anchors, window.factors, block_origin, block_shape)
            if sums is not None and all_positive(sums):
                if self.normalised:
                    np.divide(out, outer_product(sums, real), out=out)
                return narrowed(out, acc)
            if sums is not None:
                total = outer_product(sums, np.dtype(np.float64))
            else:
                total = window_sums(block_origin, block_shape, anchors).total()
            if (total > 0).all():
                if self.normalised:
                    np.divide(out, total.astype(real), out=out)
                return narrowed(out, acc)
            return narrowed(normalise(out, total, self.normalised), acc)
        # A piece's Σw may be float64 where out's dtype would round it to 0 (masked sums).
        exact = [p.partial.weight.dtype for p in pieces if p.partial.weight is not None]
        weight = np.zeros(out.shape, dtype=np.result_type(real, *exact))
        for piece in pieces:
            part = piece.partial
            if part.weight is not None:
                weight[piece.region] += part.weight
            else:
                extent = part.total.shape[-k:]
                weight[piece.region] += window_sums(part.origin, extent, part.anchors).total()
        return narrowed(normalise(out, weight, self.normalised), acc)


class Extreme(Reduction):
    """The largest (``np.fmax``) or smallest (``np.fmin``) covering value, NaN skipped."""

    picks = True
    keeps_integers = True

    def __init__(self, name: str, combine: np.ufunc) -> None:
        self.name = name
        self.ufunc = combine

    def exact_integer_dtype(self, dtype: np.dtype, window: Any) -> np.dtype | None:
        """Return the integers' own dtype: the result is one of them."""
        return np.dtype(dtype) if np.dtype(dtype).kind in "iu" else None

    def fill(self, dtype: np.dtype) -> object:
        """Return NaN, or for integers the identity of the max (their minimum) or the min."""
        if np.dtype(dtype).kind not in "iu":
            return np.nan
        info = np.iinfo(dtype)
        return info.min if self.ufunc is np.fmax else info.max

    def block(self, out: np.ndarray, landing: Landing, shared: object = None) -> np.ndarray:
        """Keep the running extreme of the block's patches."""
        add_extreme(out, landing, self.ufunc, self.fill(out.dtype))
        return out

    def partial(
        self, landing: Landing, box: tuple[int, ...], acc: np.dtype, reaching: np.ndarray
    ) -> Partial:
        """Keep the running extreme over the box."""
        out = self.block(np.empty(box, dtype=acc), landing)
        return Partial(landing.origin, out, None, reaching)

    def combine(
        self, out_shape: tuple[int, ...], acc: np.dtype, pieces: Sequence[Piece], block: Block
    ) -> np.ndarray:
        """Take the extreme of the pieces."""
        out = np.full(out_shape, self.fill(acc), dtype=acc)
        for piece in pieces:
            region = out[piece.region]
            self.ufunc(region, piece.partial.total, out=region)
        return out


class Vote(Reduction):
    """Per cell, the label whose covering patches carry the largest Σ w (ties: the smaller)."""

    name = "vote"
    weighted = True
    picks = True
    keeps_integers = True

    def check_dtype(self, dtype: np.dtype) -> None:
        """Refuse float predictions: a vote counts class labels."""
        dtype = np.dtype(dtype)
        if dtype.kind not in "biu":
            raise PredictionError(
                f"reduce='vote' counts class labels, which must be bool or integers; the "
                f"predictions are {dtype}. Pass labels (pred.round().astype('uint8'), or "
                "scores.argmax(...) per patch; to apply, dtype='uint8' and fn returning "
                "labels), or blend scores with reduce='mean' and take the argmax of the result."
            )

    def exact_integer_dtype(self, dtype: np.dtype, window: Any) -> np.dtype | None:
        """Return the labels' own dtype: a vote picks one of them."""
        return np.dtype(dtype) if np.dtype(dtype).kind in "biu" else None

    def shared(self, prediction_groups: Sequence[np.ndarray]) -> np.ndarray:
        """Return the labels present anywhere: each is summed in its own pass."""
        return present_labels(prediction_groups)

    def block(self, out: np.ndarray, landing: Landing, shared: object = None) -> np.ndarray:
        """Elect per cell the label with the largest Σ w."""
        labels = shared
        if labels is None:
            groups = {p.group for p in landing.placements}
            labels = present_labels([landing.groups[g] for g in groups])
        return vote_block(
            out, landing.placements, landing.groups, landing.window.values, labels, landing.weigh
        )

    def partial(
        self, landing: Landing, box: tuple[int, ...], acc: np.dtype, reaching: np.ndarray
    ) -> Partial:
        """Return per label present in the group its Σ w over the box (float64)."""
        labels, votes = vote_partial(
            box, landing.placements, landing.groups, landing.window.values, landing.weigh
        )
        return Partial(landing.origin, votes, None, reaching, labels=labels)

    def combine(
        self, out_shape: tuple[int, ...], acc: np.dtype, pieces: Sequence[Piece], block: Block
    ) -> np.ndarray:
        """Elect per cell from the pieces' label weights."""
        out = np.empty(out_shape, dtype=acc)
        parts = [(p.partial.labels, p.partial.total, p.region) for p in pieces]
        return vote_pieces(out, parts)


class Argmax(Reduction):
    """Class scores blended as the mean, then the index of the largest along the class axis.

    Labels are in the smallest unsigned integer dtype that holds them
    (:func:`label_dtype`) where every cell has one; a cell with a NaN score has
    none (NaN, then the output's nodata). Ties go to the first index.
    """

    name = "argmax"
    weighted = True
    reduces_lead = True

    @property
    def blend(self) -> Reduction:
        """The mean: scores blend as a mean before the argmax."""
        return MEAN

    def check_dtype(self, dtype: np.dtype) -> None:
        """Take scores of any real dtype."""

    def finalize(self, data: Any, axis: int) -> Any:
        """Return the label map of blended scores (:func:`argmax_labels`)."""
        return argmax_labels(data, axis)


def label_dtype(n_classes: int) -> np.dtype:
    """Return the smallest unsigned integer dtype that holds the labels ``0 .. n_classes - 1``.

    Examples
    --------
    >>> [str(label_dtype(n)) for n in (5, 256, 257)]
    ['uint8', 'uint8', 'uint16']
    """
    for dtype in (np.uint8, np.uint16, np.uint32):
        if n_classes - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def argmax_labels(data: Any, axis: int = 0) -> Any:
    """Index of the largest score along ``axis``, as float64 with NaN where a score is NaN.

    Floats so that the nodata rules (NaN, then ``_FillValue``) apply to cells with no
    label before the stored cast makes integers; ties go to the first index, as in
    ``numpy.argmax``. Blockwise on dask, with ``axis`` rechunked to one chunk.

    Examples
    --------
    >>> argmax_labels(np.array([[0.1, np.nan, 0.5], [0.9, 0.2, 0.5]])).tolist()
    [1.0, nan, 0.0]
    """
    if is_dask_array(data):
        import dask.array as da

        data = data.rechunk({axis: -1})
        return da.map_blocks(
            argmax_labels, data, axis, drop_axis=axis, dtype=np.float64, meta=np.array((), float)
        )
    data = np.asarray(data)
    missing = np.isnan(data).any(axis=axis) if data.dtype.kind in "fc" else False
    labels = np.argmax(np.nan_to_num(data, nan=0.0), axis=axis).astype(np.float64)
    return np.where(missing, np.nan, labels)


MEAN = WeightedSum("mean", normalised=True)
SUM = WeightedSum("sum", normalised=False)
MAX = Extreme("max", np.fmax)
MIN = Extreme("min", np.fmin)
VOTE = Vote()
ARGMAX = Argmax()

#: The built-in blends by name, in the order the docs list them.
REDUCTIONS: tuple[str, ...] = get_args(ReductionName)

_REGISTRY: dict[str, Reduction] = {r.name: r for r in (MEAN, SUM, MAX, MIN, VOTE, ARGMAX)}


def accumulation_dtype(
    dtype: np.dtype,
    reduce: Reduction | ReductionName = "mean",
    *,
    window: Any = None,
    covered: bool = False,
) -> np.dtype:
    """:meth:`Reduction.accumulation_dtype` of the reduction ``reduce`` names.

    Examples
    --------
    >>> [str(accumulation_dtype(np.dtype(t))) for t in ("float16", "float32", "uint8", "int64")]
    ['float32', 'float32', 'float64', 'float64']
    >>> [str(accumulation_dtype(np.dtype("uint8"), r, window=np.ones(3), covered=True))
    ...  for r in ("max", "sum", "mean")]
    ['uint8', 'uint64', 'float64']
    """
    return as_reduction(reduce).accumulation_dtype(dtype, window, covered)


def register(reduction: Reduction) -> Reduction:
    """Make ``reduction`` known by its name to every ``reduce=`` (returns it).

    Examples
    --------
    >>> class Count(Extreme):
    ...     pass
    >>> register(Count("demo-count", np.fmax)) is as_reduction("demo-count")
    True
    """
    _REGISTRY[reduction.name] = reduction
    return reduction


def as_reduction(reduce: object, argmax: bool = False) -> Reduction:
    """Return the :class:`Reduction` that ``reduce=`` names (or ``reduce`` itself).

    ``"argmax"`` is known only where a label map can be made (``argmax=True``:
    ``apply`` and ``reconstruct``); elsewhere the blends are.

    Examples
    --------
    >>> as_reduction("vote")
    <reduction 'vote'>
    >>> as_reduction("median")
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: reduce='median' is not a known reduce; ...
    """
    if isinstance(reduce, Reduction):
        return reduce
    names = [n for n, r in _REGISTRY.items() if argmax or not r.reduces_lead]
    return _REGISTRY[check_choice("reduce", reduce, tuple(names))]
