"""Where patches land on a block: placements, the block's weights, and a group's partial.

A block is a box of the output grid (an output chunk, a band of rows, or the box
a group of patches spans). :func:`place_patches` lists the patches that touch it
and where; :class:`BlockWeights` gives their total window weight Σw from the
geometry alone; a :class:`Partial` is what one group of patches adds to its box
before the block it falls on normalises. The reductions
(:mod:`xpatch.core.blend.reductions`) and their kernels read these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from xpatch.core.plan import reaching
from xpatch.core.windows import BlendWindow


class Placement(NamedTuple):
    """Where one patch lands in a block."""

    group: int
    row: int
    anchor: tuple[int, ...]
    block_index: tuple[slice, ...]
    patch_index: tuple[slice, ...]


def place_patches(
    origin: Sequence[int],
    block_shape: Sequence[int],
    anchor_groups: Sequence[np.ndarray],
    size: Sequence[int],
) -> list[Placement]:
    """List the patches that touch a block, in lexicographic order of their anchors."""
    origin = np.asarray(origin, dtype=np.int64)
    end = origin + np.asarray(block_shape, dtype=np.int64)
    o = origin.tolist()
    placements = []
    for g, anchors in enumerate(anchor_groups):
        lo = np.maximum(anchors, origin)
        hi = np.minimum(anchors + np.asarray(size), end)
        rows = np.flatnonzero((hi > lo).all(axis=1))
        for i, a, lo_i, hi_i in zip(
            rows.tolist(), anchors[rows].tolist(), lo[rows].tolist(), hi[rows].tolist()
        ):
            block = tuple(slice(x - b, y - b) for x, y, b in zip(lo_i, hi_i, o))
            patch = tuple(slice(x - s, y - s) for x, y, s in zip(lo_i, hi_i, a))
            placements.append(Placement(g, i, tuple(a), block, patch))
    placements.sort(key=lambda p: p.anchor)
    return placements


def _is_product(anchors: Sequence[tuple[int, ...]], k: int) -> bool:
    """Whether the anchors are exactly the cartesian product of their per-axis starts."""
    if not anchors:
        return False
    count = 1
    for j in range(k):
        count *= len({a[j] for a in anchors})
        if count > len(anchors):
            return False
    return count == len(anchors) == len(set(anchors))


class BlockWeights:
    """The weights of the patches that touch one block, from geometry alone.

    The total weight Σw of a cell depends only on the anchors and the window, never
    on the data. When the window is separable and the anchors form a product grid
    (every regular grid does, and so does any box cut out of one), Σw is the outer
    product of per-axis sums; ``"mean"`` then folds 1/Σw into per-axis weight
    vectors, so each patch costs one multiply (and one add where it overlaps an
    earlier patch) and there is no division pass. Otherwise Σw is summed over the
    block, one window per patch.
    """

    def __init__(
        self,
        origin: Sequence[int],
        block_shape: Sequence[int],
        placements: Sequence[Placement],
        window: BlendWindow,
        dtype: np.dtype,
        normalise: bool,
    ) -> None:
        self.origin = [int(o) for o in origin]
        self.block_shape = tuple(int(s) for s in block_shape)
        self.window = window.values.astype(dtype, copy=False)
        self.exact_window = window.values  # for the validity weights of masked sums
        self.dtype = dtype
        k = len(self.block_shape)
        anchors = [p.anchor for p in placements]
        self.separable = window.factors is not None and _is_product(anchors, k)
        self.normalised = normalise and self.separable
        self._cache: dict[tuple[int, ...], np.ndarray] = {}
        if self.separable:
            starts = [sorted({a[j] for a in anchors}) for j in range(k)]
            self._axis_sums = [
                self._axis_sum(j, s, f) for j, (s, f) in enumerate(zip(starts, window.factors))
            ]
            self._patterns = [
                self._axis_patterns(j, s, f) for j, (s, f) in enumerate(zip(starts, window.factors))
            ]
            self.factors = window.factors
            self.starts = [np.asarray(s, dtype=np.int64) for s in starts]
        else:
            self._total = np.zeros(self.block_shape, dtype=np.float64)
            for p in placements:
                self._total[p.block_index] += window.values[p.patch_index]

    def _axis_sum(self, axis: int, starts: Sequence[int], factor: np.ndarray) -> np.ndarray:
        total = np.zeros(self.block_shape[axis], dtype=np.float64)
        o = self.origin[axis]
        for s in starts:
            lo, hi = max(s, o), min(s + len(factor), o + len(total))
            total[lo - o : hi - o] += factor[lo - s : hi - s]
        return total

    def _axis_patterns(self, axis: int, starts: Sequence[int], factor: np.ndarray) -> dict:
        """Per start, an id and the 1-D weights it contributes (deduplicated)."""
        o, n = self.origin[axis], self.block_shape[axis]
        ids: dict[tuple[int, bytes], int] = {}
        patterns = {}
        for s in starts:
            lo, hi = max(s, o), min(s + len(factor), o + n)
            line = factor[lo - s : hi - s]
            if self.normalised:
                line = line / self._axis_sums[axis][lo - o : hi - o]
            line = line.astype(self.dtype)
            patterns[s] = (ids.setdefault((lo - s, line.tobytes()), len(ids)), line)
        return patterns

    def patch_weight(self, placement: Placement) -> np.ndarray:
        """Return the weights a patch adds to the block (normalised if ``normalised``)."""
        if not self.separable:
            return self.window[placement.patch_index]
        lines = [self._patterns[j][s] for j, s in enumerate(placement.anchor)]
        key = tuple(line_id for line_id, _ in lines)
        weight = self._cache.get(key)
        if weight is None:
            weight = functools.reduce(np.multiply.outer, [line for _, line in lines])
            self._cache[key] = weight
        return weight

    def fresh_offsets(self, placements: Sequence[Placement]) -> list[list[int]]:
        """Per patch and axis, where its cells no earlier patch reached begin.

        Offsets are within the patch's slice of the block. Along an axis, cells
        past the end of the previous start's patch are reached by no patch with a
        smaller start; with patches in lexicographic order of their anchors (and a
        product grid), cells past that end on every axis are reached by no earlier
        patch at all.
        """
        anchors = np.array([p.anchor for p in placements], dtype=np.int64)
        offsets = np.zeros_like(anchors)
        for j, (factor, starts) in enumerate(zip(self.factors, self.starts)):
            column = anchors[:, j]
            position = np.searchsorted(starts, column)
            previous_end = np.where(position > 0, starts[position - 1] + len(factor), column)
            lo = np.maximum(column, self.origin[j])
            extent = np.minimum(column + len(factor), self.origin[j] + self.block_shape[j]) - lo
            offsets[:, j] = np.clip(previous_end - lo, 0, extent)
        return offsets.tolist()

    def total(self) -> np.ndarray:
        """Σw over the block (float64)."""
        if self.separable:
            return functools.reduce(np.multiply.outer, self._axis_sums)
        return self._total

    def max_total(self) -> float:
        """Return the largest Σw of the block (0 where nothing lands)."""
        if self.separable:
            return float(np.prod([s.max(initial=0.0) for s in self._axis_sums]))
        return float(self._total.max(initial=0.0))

    def covers_all(self) -> bool:
        """Whether every cell of the block is covered by at least one patch."""
        if self.separable:
            return all(bool((s > 0).all()) for s in self._axis_sums)
        return bool((self._total > 0).all())

    def covered(self) -> np.ndarray:
        """Cells of the block that at least one patch covers."""
        if self.separable:
            return functools.reduce(np.logical_and.outer, [s > 0 for s in self._axis_sums])
        return self._total > 0


@dataclass(frozen=True, eq=False)
class Partial:
    """What some patches add to a box of the grid, before normalising.

    A lazy reconstruction adds each group of patches into the box they span (a
    ``Partial``), cuts the box into the pieces that fall on each output block and
    sums the pieces of a block. Where a group overhangs its block the pieces are
    thin strips: only they, never whole groups of predictions, wait for the
    neighbouring block.

    Attributes
    ----------
    origin
        Start of the box along the patched axes.
    total
        ``(*lead, *box)``: Σ w·x for ``"mean"`` and ``"sum"`` (0 where nothing
        landed), or the running max / min (NaN, or for integers the identity
        of the max / min, where nothing landed). For ``"vote"``,
        ``(n_labels, *lead, *box)``: per label of :attr:`labels`, the Σ w of the
        patches voting it (-1 where none does; :mod:`xpatch.core.blend.vote`).
    weight
        Σ w of the valid values when some value was NaN; None when all were valid,
        and the window sums of :attr:`anchors` apply.
    anchors
        Anchors of the patches that reach the box.
    bound, shadow
        For an integer sum: a bound on ``|total|`` and, when that bound does not
        rule out that the sum wraps, Σ w·x in float64 (else None), from which
        the block's sum is checked.
    labels
        For ``"vote"``: the sorted labels present in the group (else None).
    """

    origin: tuple[int, ...]
    total: np.ndarray
    weight: np.ndarray | None
    anchors: np.ndarray
    bound: float = 0.0
    shadow: np.ndarray | None = None
    labels: np.ndarray | None = None

    def crop(self, origin: Sequence[int], shape: Sequence[int], size: Sequence[int]):
        """Return a copy of the part inside ``[origin, origin + shape)``, or None.

        ``size`` is the patch size, to keep the anchors of the patches that reach
        the part. A copy does not keep the whole box alive.
        """
        part = self.view(origin, shape, size)
        if part is None:
            return None
        weight = None if part.weight is None else part.weight.copy()
        shadow = None if part.shadow is None else part.shadow.copy()
        return replace(part, total=part.total.copy(), weight=weight, shadow=shadow)

    def lead_part(self, index: Sequence[slice]) -> Partial:
        """Return a copy of the part at ``index`` along the lead axes (the box whole).

        Lets one group's partial feed output blocks that split the lead axes.
        """
        labels = (slice(None),) if self.labels is not None else ()  # votes: labels first
        total = self.total[(*labels, *index)].copy()
        weight = None if self.weight is None else self.weight[tuple(index)].copy()
        shadow = None if self.shadow is None else self.shadow[tuple(index)].copy()
        return replace(self, total=total, weight=weight, shadow=shadow)

    def view(self, origin: Sequence[int], shape: Sequence[int], size: Sequence[int]):
        """Return the part inside ``[origin, origin + shape)`` (views), or None."""
        k = len(self.origin)
        extent = self.total.shape[-k:]
        lo = [max(a, b) for a, b in zip(self.origin, origin)]
        hi = [min(a + n, b + m) for a, n, b, m in zip(self.origin, extent, origin, shape)]
        if any(h <= low for low, h in zip(lo, hi)):
            return None
        index = (Ellipsis, *(slice(a - o, b - o) for a, b, o in zip(lo, hi, self.origin)))
        reach = reaching(self.anchors, size, lo, hi)
        weight = None if self.weight is None else self.weight[index]
        shadow = None if self.shadow is None else self.shadow[index]
        return Partial(
            tuple(lo),
            self.total[index],
            weight,
            self.anchors[reach],
            self.bound,
            shadow,
            self.labels,
        )


#: ``placement -> window * weights`` over the patch's cells in the block (or None).
Weigh = Callable[[Placement], np.ndarray] | None


class Landing:
    """The patches that land on one block (or a group's box), and how they weigh.

    Attributes
    ----------
    origin, shape
        The block along the patched axes.
    placements
        The patches that touch it (:func:`~xpatch.core.blend.placement.place_patches`).
    groups
        The predictions, one array per group, ``(n_g, *lead, *patch)``.
    window
        The blending window.
    weigh
        ``placement -> window * weights`` when weights multiply the window, else None.
    """

    __slots__ = ("groups", "origin", "placements", "shape", "weigh", "window")

    def __init__(
        self,
        origin: Sequence[int],
        shape: Sequence[int],
        groups: Sequence[np.ndarray],
        placements: Sequence[Placement],
        window: BlendWindow,
        weigh: Weigh = None,
    ) -> None:
        self.origin = tuple(int(o) for o in origin)
        self.shape = tuple(int(n) for n in shape)
        self.groups = groups
        self.placements = placements
        self.window = window
        self.weigh = weigh


class Block:
    """An output block of the patched axes, and the window its pieces were blended with."""

    __slots__ = ("origin", "shape", "window")

    def __init__(self, origin: Sequence[int], shape: Sequence[int], window: BlendWindow) -> None:
        self.origin = [int(o) for o in origin]
        self.shape = [int(n) for n in shape]
        self.window = window


class Piece:
    """A part of a :class:`Partial` that falls on one output block, and where in it."""

    __slots__ = ("partial", "region")

    def __init__(self, partial: Partial, region: tuple) -> None:
        self.partial = partial
        self.region = region
