"""The kernels of the reductions that add: Σ w·x into a block, and the running max / min.

:func:`add_sums` adds the placed patches weighted by the window (Σ w·x, with 1/Σw
folded into the weights of a mean where the layout allows); :func:`add_extreme`
keeps the running max or min. NaN predictions are skipped: a block that holds one
is summed again with per-cell validity (:func:`masked_sums`). An integer sum is
exact modulo 2**64; :func:`integer_sum_shadow` and :func:`check_wrapped` tell
whether it wrapped. :mod:`xpatch.core.blend.reductions` decides which kernel runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xpatch.core.blend.dtypes import holds_nan, value_range
from xpatch.core.blend.placement import BlockWeights, Landing, Placement
from xpatch.core.errors import PredictionError


def add_extreme(out: np.ndarray, landing: Landing, combine: np.ufunc, fill: object) -> None:
    """Keep in ``out`` the running ``combine`` (``np.fmax`` / ``np.fmin``) of the patches.

    ``out`` starts at ``fill`` (NaN, or an integer max's / min's identity), which
    stays where nothing landed; ``combine`` skips NaN.
    """
    lead_index = (slice(None),) * (out.ndim - len(landing.shape))
    out.fill(fill)
    for p in landing.placements:
        region = out[lead_index + p.block_index]
        values = landing.groups[p.group][(p.row, *lead_index, *p.patch_index)]
        combine(region, values, out=region)


def add_sums(
    out: np.ndarray, landing: Landing, normalise: bool, exact_total: bool
) -> tuple[BlockWeights, np.ndarray | None]:
    """Add Σ w·x of the patches that land on the block into ``out`` (its content is ignored).

    0 where nothing landed, with the weights folded in already normalised when
    ``normalise`` and the layout allows it. Returns the block's weights and, if
    some value was NaN, the Σ w of the valid values (``out`` then holds Σ w·x
    over valid values only), counted in float64 with ``exact_total``
    (:func:`masked_sums`).
    """
    placements, prediction_groups, window = landing.placements, landing.groups, landing.window
    lead_index = (slice(None),) * (out.ndim - len(landing.shape))
    real = np.empty(0, dtype=out.dtype).real.dtype
    weights = BlockWeights(landing.origin, landing.shape, placements, window, real, normalise)
    if weights.separable:
        _add_fresh_first(out, weights, placements, prediction_groups, lead_index)
    else:
        out.fill(0)
        scratch = np.empty((*out.shape[: len(lead_index)], *window.values.shape), dtype=out.dtype)
        for p in placements:
            values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
            _add_product(out[lead_index + p.block_index], values, weights.patch_weight(p), scratch)
    if holds_nan(out):
        # Rare: some prediction holds NaN. Redo the sums with per-cell validity so
        # NaN values are skipped rather than spread.
        valid = masked_sums(out, weights, placements, prediction_groups, exact_total)
        return weights, valid
    return weights, None


def _add_product(region: np.ndarray, values: np.ndarray, weight: np.ndarray, scratch) -> None:
    """``region += values * weight`` through a reused scratch buffer (no temporaries)."""
    product = scratch[tuple(slice(0, n) for n in region.shape)]
    np.multiply(values, weight, out=product)
    np.add(region, product, out=region)


def _add_fresh_first(out, weights, placements, prediction_groups, lead_index) -> None:
    """Separable weights: write each patch's fresh cells, add the rest.

    Patches arrive in lexicographic order of their anchors, so the cells of a
    patch that no earlier patch reached (:meth:`BlockWeights.fresh_offsets`) are
    written (``out = x·w``) instead of added, which spares zeroing the block and a
    read-add pass over most of it.
    """
    lead = out.shape[: len(lead_index)]
    scratch = np.empty((*lead, *weights.window.shape), dtype=out.dtype)
    if not weights.covers_all():
        out[..., ~weights.covered()] = 0
    if not placements:
        return
    for p, offsets in zip(placements, weights.fresh_offsets(placements)):
        values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
        weight = weights.patch_weight(p)
        region = out[lead_index + p.block_index]
        fresh = tuple(slice(off, None) for off in offsets)
        np.multiply(values[lead_index + fresh], weight[fresh], out=region[lead_index + fresh])
        # The already-reached cells: box j is fresh before axis j, stale on axis j.
        for j, off in enumerate(offsets):
            if off == 0:
                continue
            box = (*fresh[:j], slice(0, off), *(slice(None),) * (len(offsets) - j - 1))
            _add_product(region[lead_index + box], values[lead_index + box], weight[box], scratch)


def masked_sums(
    out: np.ndarray,
    weights: BlockWeights,
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    exact_total: bool = False,
) -> np.ndarray:
    """Σ w·x into ``out`` over valid (non-NaN) values only; return Σ w of those values.

    Σ w is summed in the window's dtype for ``out``, or with ``exact_total`` in
    float64: a sum counts Σw only to tell which cells a value reached, and
    ``out``'s dtype may round the smallest weights (a narrow Gaussian's tails in
    float32) to 0, as :func:`~xpatch.core.blend.weighted.weighted_sums` does.
    """
    k = len(weights.block_shape)
    lead_index = (slice(None),) * (out.ndim - k)
    out.fill(0)
    window = weights.window
    counted = weights.exact_window if exact_total else window
    weight = np.zeros(out.shape, dtype=np.float64 if exact_total else window.dtype)
    for p in placements:
        values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
        valid = ~np.isnan(values)
        out[lead_index + p.block_index] += np.where(valid, values * window[p.patch_index], 0)
        weight[lead_index + p.block_index] += valid * counted[p.patch_index]
    return weight


def normalise(out: np.ndarray, weight: np.ndarray, divide: bool) -> np.ndarray:
    """Divide by the total weight (with ``divide``: a mean) and make uncovered cells NaN."""
    covered = weight > 0
    if divide:
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(out, weight, out=out, where=covered)
    uncovered = ~np.broadcast_to(covered, out.shape)
    if uncovered.any():
        out[uncovered] = np.nan
    return out


def integer_sum_shadow(
    out: np.ndarray, weights: BlockWeights, landing: Landing
) -> tuple[float, np.ndarray | None]:
    """Bound ``|Σ w·x|`` in an integer sum's block; if it may not fit, return Σ w·x in float64 too.

    Integer sums wrap modulo 2**64: the result is exact when the true sum fits, which
    the float64 sum tells (:func:`check_wrapped`) where max|x| · max Σw does not.
    """
    prediction_groups = landing.groups
    info, limit = np.iinfo(prediction_groups[0].dtype), np.iinfo(out.dtype).max / 2
    most = max(-int(info.min), int(info.max))  # first from the dtype alone, without a pass
    if most * weights.max_total() >= limit:
        groups = {p.group for p in landing.placements}
        low, high = value_range([prediction_groups[g] for g in groups])
        most = max(-low, high)
    bound = most * weights.max_total()
    if bound < limit:
        return bound, None
    shadow = np.empty(out.shape, dtype=np.float64)
    add_sums(shadow, landing, False, True)
    return bound, shadow


def check_wrapped(out: np.ndarray, shadow: np.ndarray) -> None:
    """Raise if an integer sum wrapped: it then differs from its float64 sum by about 2**64."""
    wrapped = np.abs(out.astype(np.float64) - shadow) >= 2.0**63
    if wrapped.any():
        raise PredictionError(
            f"reduce='sum' of integer predictions reaches {shadow[wrapped].flat[0]:.6g}, outside "
            f"the range of {out.dtype}, in which an integral window sums them exactly. Pass "
            "float predictions (pred.astype('float64')), or a dtype='float64' to apply, to "
            "sum in float64, or use reduce='mean'."
        )


def narrowed(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Return ``out`` cast to the result's ``dtype``, refusing finite values it cannot hold.

    Sums computed in float64 (weights float32 would lose) come back to float32:
    a sum past float32's range would turn to inf there.

    Examples
    --------
    >>> narrowed(np.array([1.0, 2.0]), np.dtype("float32")).dtype
    dtype('float32')
    """
    dtype = np.dtype(dtype)
    if out.dtype == dtype:
        return out
    with np.errstate(over="ignore"):
        cast = out.astype(dtype)
    if dtype.kind in "fc" and out.dtype.kind in "fc":
        lost = np.isinf(cast) & np.isfinite(out)
        if lost.any():
            raise PredictionError(
                f"the blend reaches {np.abs(out[lost]).max():.6g}, past the range of {dtype} "
                "(the predictions' precision, which the result keeps): the weights are too "
                "large for it. Scale the weights down (a mean is the same for weights times a "
                "constant), or pass float64 predictions (pred.astype('float64'), or "
                "dtype='float64' in apply)."
            )
    return cast
