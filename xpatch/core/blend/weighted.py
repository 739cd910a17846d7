"""Per-patch and per-cell weights from the model, multiplied into the blending window.

``reconstruct(pred, weights=...)`` weighs patch ``i``'s cell ``c`` by
``window(c - a_i) * weights_i(c - a_i)`` (an inverse variance, a confidence), so the
mean is ``Σ w·v·x / Σ w·v``. The total weight then depends on the data, not on the
geometry alone: each block (or lazy partial) sums it beside Σ w·v·x
(:func:`weighted_sums`), and a cell whose total weight is 0 is NaN, as is a cell no
patch covers. Weights arrive as ``(n, *lead, *patch)`` arrays with size-1 axes where
they repeat (per-patch weights are ``(n, 1, ..., 1)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from xpatch.core.blend.placement import Placement
from xpatch.core.errors import PredictionError


def check_weights(weights: np.ndarray) -> np.ndarray:
    """Return ``weights`` as float64 if all are finite and >= 0, else raise naming one.

    Examples
    --------
    >>> check_weights(np.array([0.5, 2])).tolist()
    [0.5, 2.0]
    >>> check_weights(np.array([1.0, -2.0]))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: weights hold -2.0 (at index (1,)); ...
    """
    weights = np.asarray(weights)
    if weights.dtype.kind not in "biuf":
        raise PredictionError(
            f"weights are {weights.dtype}; they must be real numbers (finite, >= 0), e.g. "
            "1 / variance. Pass weights.astype('float64')."
        )
    weights = weights.astype(np.float64, copy=False)
    bad = ~(np.isfinite(weights) & (weights >= 0))
    if bad.any():
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), weights.shape))
        raise PredictionError(
            f"weights hold {float(weights[where])} (at index {where}); weights must be finite and "
            ">= 0 (a cell whose weights are all 0 reconstructs to NaN). Clip or replace them, "
            "e.g. np.nan_to_num(1 / var, posinf=0.0), or np.clip(w, 0, None)."
        )
    return weights


#: Weights that float32 weighs with: from its smallest normal number over its epsilon
#: (below, a weight keeps a few bits, or is 0) to 2**64 (above, Σ w·x of values past
#: 2**64 overflows float32). Outside, float32 sums run in float64. (The window's own
#: small tails are the mean's concern: :meth:`WeightedSum.working_dtype`.)
FLOAT32_WEIGHTS = (np.finfo(np.float32).tiny / np.finfo(np.float32).eps, 2.0**64)


def beyond_float32(weight_groups: Sequence[np.ndarray]) -> bool:
    """Whether the weights hold values float32 cannot weigh with (tiny or huge, not 0).

    Examples
    --------
    >>> [beyond_float32([np.array([v])]) for v in (1.0, 1e-40, 3.5e38, 0.0)]
    [False, True, True, False]
    """
    low, high = FLOAT32_WEIGHTS
    for weights in weight_groups:
        positive = weights[weights > 0]
        if positive.size and (positive.min() < low or positive.max() > high):
            return True
    return False


def weigher(
    window: np.ndarray, weight_groups: Sequence[np.ndarray], prediction_groups: Sequence[np.ndarray]
) -> Callable[[Placement], np.ndarray]:
    """Return ``placement -> window * weights`` over the patch's cells that fall in the block.

    Each weight group is broadcast (as a view) to its predictions' shape, so a
    per-patch weight costs no memory.
    """
    k = window.ndim
    broadcast = [np.broadcast_to(w, p.shape) for w, p in zip(weight_groups, prediction_groups)]

    def weigh(p: Placement) -> np.ndarray:
        cells = broadcast[p.group][p.row]
        lead_index = (slice(None),) * (cells.ndim - k)
        return cells[(*lead_index, *p.patch_index)] * window[p.patch_index]

    return weigh


def weighted_sums(
    out: np.ndarray,
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    weigh: Callable[[Placement], np.ndarray],
    exact_total: bool = False,
) -> np.ndarray:
    """Write Σ w·v·x into ``out`` (``(*lead, *box)``); return Σ w·v, NaN values skipped.

    Σ w·v is summed in ``out``'s real dtype, or with ``exact_total`` in float64: a
    sum uses it only to tell which cells a value reached, and ``out``'s dtype may
    round the smallest weights (a narrow Gaussian's tails in float32) to 0.

    Examples
    --------
    >>> from xpatch.core.blend.placement import place_patches
    >>> pl = place_patches([0], [3], [np.array([[0], [1]])], [2])
    >>> preds, v = [np.array([[1.0, 1.0], [4.0, 4.0]])], [np.array([[1.0], [3.0]])]
    >>> out = np.empty(3)
    >>> weighted_sums(out, pl, preds, weigher(np.ones(2), v, preds)).tolist(), out.tolist()
    ([1.0, 4.0, 3.0], [1.0, 13.0, 12.0])
    """
    k = len(placements[0].patch_index) if placements else 0
    lead_index = (slice(None),) * (out.ndim - k)
    real = np.empty(0, dtype=out.dtype).real.dtype
    total = np.zeros(out.shape, dtype=np.float64 if exact_total else real)
    out.fill(0)
    inexact = np.issubdtype(out.dtype, np.inexact)
    for p in placements:
        values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
        exact = weigh(p)
        weight = np.broadcast_to(exact.astype(real, copy=False), values.shape)
        counted = np.broadcast_to(exact, values.shape) if exact_total else weight
        product = values * weight
        if inexact and np.isnan(product).any():
            valid = ~np.isnan(values)
            product = np.where(valid, product, 0)
            counted = np.where(valid, counted, 0)
        out[lead_index + p.block_index] += product
        total[lead_index + p.block_index] += counted
    return total
