"""Weighted majority vote of class labels (``reduce="vote"``).

Per cell, the label whose covering patches carry the largest summed window weight
wins; ties go to the smallest label. The labels are only known when the
predictions are, so each label present is summed in its own pass
(:func:`label_weight`) and elected against the running winner
(:func:`elect`), labels in ascending order: the eager path holds two float64
arrays of the block beside the result, whatever the number of labels. A lazy
partial (:func:`vote_partial`) holds one float64 array of its box per label
present in its group, ``O(labels x box)``, which the output block then combines
label by label (:func:`vote_pieces`).

A label's weight is ``-1`` (:data:`ABSENT`) where no patch votes for it, so that a
label that some patch votes for with a zero weight (``weights=0``) still beats no
label at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from xpatch.core.blend.placement import Placement

#: A label's weight where no patch votes for it.
ABSENT = -1.0
#: Weights this close (relative) are a tie: the eager and lazy paths add the same
#: weights in another order, which may change their last bits.
TIE_RTOL = 1e-9
#: The running winner's weight before any label: below any label's weight (>= 0).
NO_WINNER = -0.5


def present_labels(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Return the sorted distinct values of some arrays.

    Examples
    --------
    >>> present_labels([np.array([3, 1, 3]), np.array([2, 1])]).tolist()
    [1, 2, 3]
    """
    found = [np.unique(a) for a in arrays if a.size]
    if not found:
        return np.empty(0, dtype=arrays[0].dtype if len(arrays) else np.int64)
    return np.unique(np.concatenate(found))


def label_weight(
    out: np.ndarray,
    label: object,
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    window: np.ndarray,
    weigh: Callable[[Placement], np.ndarray] | None = None,
) -> np.ndarray:
    """Write into ``out`` the summed weight of the patches that vote ``label``, per cell.

    ``out`` is float64 ``(*lead, *box)``; it is :data:`ABSENT` where no patch votes
    ``label``. A patch's weight is ``window`` at its cells, or ``weigh(placement)``
    when given (the window times per-patch or per-cell weights).

    Examples
    --------
    >>> from xpatch.core.blend.placement import place_patches
    >>> pl = place_patches([0], [4], [np.array([[0], [2]])], [2])
    >>> votes = [np.array([[1, 1], [1, 2]])]
    >>> label_weight(np.empty(4), 1, pl, votes, np.ones(2)).tolist()
    [1.0, 1.0, 1.0, -1.0]
    """
    k = window.ndim
    lead_index = (slice(None),) * (out.ndim - k)
    out.fill(ABSENT)
    for p in placements:
        values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
        match = values == label
        if not match.any():
            continue
        region = out[lead_index + p.block_index]
        weight = window[p.patch_index] if weigh is None else weigh(p)
        np.maximum(region, 0.0, out=region, where=match)
        np.add(region, weight, out=region, where=match)
    return out


def elect(out: np.ndarray, best: np.ndarray, weight: np.ndarray, label: object) -> None:
    """Make ``label`` the winner where its ``weight`` beats the running ``best``.

    Called with labels in ascending order, so a tie keeps the smaller label.
    """
    better = weight > best + TIE_RTOL * np.abs(best)
    np.copyto(best, weight, where=better)
    np.copyto(out, label, where=better, casting="unsafe")  # label is one of out's values


def finish(out: np.ndarray, best: np.ndarray) -> np.ndarray:
    """NaN where no label won (no patch covers the cell) when ``out`` is a float."""
    if out.dtype.kind == "f":
        out[best < 0] = np.nan
    return out


def vote_block(
    out: np.ndarray,
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    window: np.ndarray,
    labels: np.ndarray,
    weigh: Callable[[Placement], np.ndarray] | None = None,
) -> np.ndarray:
    """Elect, per cell of ``out``, the label with the largest summed weight (eager).

    ``labels`` are the sorted labels that may occur (:func:`present_labels`). Cells
    no patch covers are NaN if ``out`` is a float (else 0: the plan rules them out).
    """
    best = np.full(out.shape, NO_WINNER)
    weight = np.empty(out.shape, dtype=np.float64)
    out.fill(0)
    for label in labels:
        label_weight(weight, label, placements, prediction_groups, window, weigh)
        elect(out, best, weight, label)
    return finish(out, best)


def vote_partial(
    box: Sequence[int],
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    window: np.ndarray,
    weigh: Callable[[Placement], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per label present in the groups, its summed weight over the box ``(*lead, *box)``.

    Returns the sorted labels and a float64 ``(n_labels, *lead, *box)`` array.
    """
    labels = present_labels(prediction_groups)
    weights = np.empty((len(labels), *box), dtype=np.float64)
    for i, label in enumerate(labels):
        label_weight(weights[i], label, placements, prediction_groups, window, weigh)
    return labels, weights


def vote_pieces(
    out: np.ndarray, pieces: Sequence[tuple[np.ndarray, np.ndarray, tuple]]
) -> np.ndarray:
    """Elect per cell of ``out`` from the partial label weights that fall on it (lazy).

    ``pieces`` are ``(labels, weights, region)``: :func:`vote_partial`'s answer
    cropped to the block, and where in ``out`` it lies.

    Examples
    --------
    >>> a = (np.array([1, 2]), np.array([[2.0, 1.0], [1.0, -1.0]]), (slice(0, 2),))
    >>> b = (np.array([2]), np.array([[1.0, 3.0]]), (slice(1, 3),))
    >>> vote_pieces(np.empty(3, dtype=np.uint8), [a, b]).tolist()  # a tie at 1: label 1
    [1, 1, 2]
    """
    best = np.full(out.shape, NO_WINNER)
    weight = np.empty(out.shape, dtype=np.float64)
    out.fill(0)
    for label in present_labels([labels for labels, _, _ in pieces]):
        weight.fill(ABSENT)
        for labels, weights, region in pieces:
            i = int(np.searchsorted(labels, label))
            if i == len(labels) or labels[i] != label:
                continue
            target, piece = weight[region], weights[i]
            voted = piece >= 0
            np.maximum(target, 0.0, out=target, where=voted)
            np.add(target, piece, out=target, where=voted)
        elect(out, best, weight, label)
    return finish(out, best)
