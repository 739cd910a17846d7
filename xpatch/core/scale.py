"""Results at another resolution than the input: scale factors and the scaled plan.

A model may return patches ``f`` times the input patch's size along a patched
dim: ``f = 2`` or ``4`` for super-resolution, ``1/4`` for a segmentation head
that downsamples. The result then lands on the input's extent at the new
resolution: cell ``j`` of the output covers input cells ``[j / f, (j + 1) / f)``.

Everything scales exactly or not at all: the patch size, the grid's extent and
every anchor times ``f`` must be whole numbers of cells, or the factor is refused
with the numbers. The scaled :class:`~xpatch.core.plan.Plan` keeps the input
plan's groups and order, so the patches a task cuts from the input are the ones
whose results it blends on the output.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from fractions import Fraction
from numbers import Rational, Real

import numpy as np

from xpatch.core.errors import DimensionError, OptionError
from xpatch.core.plan import ChunkGrid, Plan, frozen_in_place

#: ``scale=``: one factor for every patched dim, or ``{dim: factor}`` (others: 1).
ScaleSpec = Real | str | Mapping[Hashable, Real | str]

#: Largest denominator a float factor is read with: 1/3 given as 0.333... is 1/3.
MAX_DENOMINATOR = 1000


def as_fraction(value: object, label: str) -> Fraction:
    """Return a scale factor as an exact positive Fraction, or raise :class:`~xpatch.OptionError`.

    Ints, Fractions and strings such as ``"1/4"`` are exact; a float is read as
    the nearest fraction with a denominator up to :data:`MAX_DENOMINATOR`.

    Examples
    --------
    >>> as_fraction(0.25, "scale"), as_fraction("1/3", "scale"), as_fraction(1 / 3, "scale")
    (Fraction(1, 4), Fraction(1, 3), Fraction(1, 3))
    """
    bad = OptionError(
        f"{label}={value!r} is not a positive scale factor; pass e.g. 2, 4, 0.25 or "
        "fractions.Fraction(1, 4) (output cells per input cell)."
    )
    if isinstance(value, bool | np.bool_):
        raise bad
    try:
        if isinstance(value, Rational | int | np.integer):
            factor = Fraction(int(value.numerator), int(value.denominator))
        elif isinstance(value, str):
            factor = Fraction(value.strip())
        elif isinstance(value, Real | np.floating) and math.isfinite(float(value)):
            factor = Fraction(float(value)).limit_denominator(MAX_DENOMINATOR)
        else:
            raise bad
    except (ValueError, ZeroDivisionError):
        raise bad from None
    if factor <= 0:
        raise bad
    return factor


def check_scale(
    scale: ScaleSpec | None,
    dims: Sequence[Hashable],
    size: Sequence[int],
    shape: Sequence[int],
    anchors: np.ndarray,
) -> tuple[Fraction, ...]:
    """Return one factor per patched dim, checked to scale the layout exactly.

    Parameters
    ----------
    scale
        ``scale=`` as given: None (1 everywhere), one factor, or ``{dim: factor}``.
    dims, size, shape
        The patched dims, the patch size and the grid's extent along them.
    anchors
        ``(n, k)`` anchors of the patches.

    Examples
    --------
    >>> check_scale({"x": 2}, ["y", "x"], [4, 4], [8, 8], np.array([[0, 2]]))
    (Fraction(1, 1), Fraction(2, 1))
    >>> check_scale(0.25, ["x"], [8], [16], np.array([[2]]))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: scale=0.25 puts the anchor 2 along 'x' at output cell 1/2, ...
    """
    if scale is None:
        return (Fraction(1),) * len(dims)
    if isinstance(scale, Mapping):
        unknown = [d for d in scale if d not in dims]
        if unknown:
            raise DimensionError(
                f"scale names {unknown!r}, which are not patched dims; the patched dims are "
                f"{list(dims)!r} (the others keep their size)."
            )
        factors = tuple(as_fraction(scale.get(d, 1), f"scale[{d!r}]") for d in dims)
    else:
        factors = (as_fraction(scale, "scale"),) * len(dims)
    anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, len(dims))
    for j, (dim, f, n, extent) in enumerate(zip(dims, factors, size, shape)):
        if f == 1:
            continue
        given = f"scale={scale!r}"
        if (n * f).denominator != 1:
            raise OptionError(
                f"{given} makes the patch size {n} along {dim!r} {n * f} cells at the output, "
                f"not a whole number; pass a factor f with {n} * f whole (e.g. 1/2, 2, 4)."
            )
        if (extent * f).denominator != 1:
            raise OptionError(
                f"{given} makes the extent of {dim!r} ({extent} cells) {extent * f} cells at "
                f"the output, not a whole number; crop or pad the input along {dim!r} to a "
                f"multiple of {f.denominator} cells (e.g. .isel({dim}=slice(0, "
                f"{extent - extent % f.denominator}))."
            )
        off = np.flatnonzero(anchors[:, j] % f.denominator)
        if off.size:
            a = int(anchors[off[0], j])
            raise OptionError(
                f"{given} puts the anchor {a} along {dim!r} at output cell {a * f}, not a whole "
                f"cell: every anchor must be a multiple of {f.denominator} there. Use a stride "
                f"(and size) along {dim!r} that is a multiple of {f.denominator}, and an "
                "extent that is too with boundary='shift'."
            )
    return factors


def times(value: int, factor: Fraction) -> int:
    """``value * factor`` for a product known to be whole."""
    return int(value * factor.numerator // factor.denominator)


def scale_plan(plan: Plan, factors: Sequence[Fraction]) -> Plan:
    """Return the plan on the output grid: anchors, size and chunk starts times the factors.

    Groups and orders are the input plan's, so group ``g`` of both holds the same
    patches. A chunk boundary ``s`` becomes ``ceil(s * f)``: an anchor ``a`` lies
    in ``[s0, s1)`` exactly when ``a * f`` (whole) lies in ``[ceil(s0 f), ceil(s1 f))``,
    so every group stays within one output chunk. Chunks that shrink to nothing
    are left out (no anchor lies in them). Factors checked by :func:`check_scale`.

    Examples
    --------
    >>> plan = Plan.compile(np.array([[0], [4]]), ChunkGrid.from_chunks([(4, 4)]), [4],
    ...                     keep_order=True)
    >>> up = scale_plan(plan, [Fraction(2)])
    >>> up.anchors.ravel().tolist(), up.size, up.grid.chunks, up.groups == plan.groups
    ([0, 8], (8,), ((8, 8),), True)
    """
    if all(f == 1 for f in factors):
        return plan
    starts = tuple(
        tuple(sorted({-(-s * f.numerator // f.denominator) for s in axis}))
        for axis, f in zip(plan.grid.starts, factors)
    )
    numerators = np.array([f.numerator for f in factors], dtype=np.int64)
    denominators = np.array([f.denominator for f in factors], dtype=np.int64)
    return Plan(
        ChunkGrid(starts),
        tuple(times(n, f) for n, f in zip(plan.size, factors)),
        frozen_in_place(plan.anchors * numerators // denominators),
        plan.order,
        plan.groups,
    )
