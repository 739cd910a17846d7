"""Overlap-add on a lattice: one strided pass per phase, not a loop over patches.

Patches whose anchors form a product grid (every regular grid does, and every
chunk's share of one) are added phase by phase. Along an axis the starts split
into **runs**, arithmetic progressions whose members lie at least a patch apart
(stride 8 and size 16: the even and the odd patches; a shifted last patch: a run
of its own); a **phase** takes one run per axis. The patches of a phase do not
overlap, so the output cells they cover are a strided view of the output, and the
phase is one vectorised multiply-add of the predictions (also a view) into it,
cut into row chunks that stay in cache and that threads share (the rows of a
phase are disjoint). The cost is a few numpy calls per phase and chunk, whatever
the number of patches: small patches (8 x 8) no longer pay Python's cost per
patch, and large ones pass over memory once per phase.

Weights are separable: per axis a ``(count, size)`` array gives the weight of each
offset of each start, the window's factor, or for a ``"mean"`` that factor over
the axis' total weight Σw (the total of a product grid is the outer product of
per-axis sums), so no division pass follows.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from xpatch.core.blend import compiled
from xpatch.core.blend.dtypes import holds_nan

#: Most runs per axis before the layout counts as irregular (the loop over patches then).
MAX_RUNS = 16

#: Bytes of predictions handled per numpy call: a piece stays in cache.
CHUNK_BYTES = 512 * 2**10

#: Patch rows shorter than this are blended patch by patch, longer ones row by row of
#: the output (measured on lazy reconstructions: 32x32 float32 patches 3.0 against 3.9
#: us each patch by patch, 64x64 the same either way).
PATCH_MAJOR_BYTES = 256

#: Which code adds a batch of patches (:meth:`LatticeBox.blend`): numba's compiled
#: kernel, or its numpy twin (:func:`blend_patches_numpy`), which gives the same bits.
Kernel = Literal["compiled", "numpy"]


def unique_inverse(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the sorted distinct values of ``column`` and each value's rank among them.

    ``np.unique(column, return_inverse=True)``, by a table of the values' range where
    it is not much longer than the column (a group's anchors on a grid: 10x faster
    than a sort, which a lazy reconstruction paid per group and per output block).

    Examples
    --------
    >>> [a.tolist() for a in unique_inverse(np.array([8, 0, 8, 4]))]
    [[0, 4, 8], [2, 0, 2, 1]]
    """
    column = np.asarray(column)
    # The table needs the offsets exact in int64: not for uint64, which may pass 2**63.
    tabled = column.dtype.kind == "i" or (column.dtype.kind == "u" and column.itemsize <= 4)
    if len(column) and tabled:
        low, high = int(column.min()), int(column.max())
        if high - low <= 4 * len(column) + 64:
            offsets = column.astype(np.int64) - low  # in the column's dtype, int8 would wrap
            present = np.zeros(high - low + 1, dtype=bool)
            present[offsets] = True
            values = (np.flatnonzero(present) + low).astype(column.dtype)
            return values, np.cumsum(present, dtype=np.intp)[offsets] - 1
    values, ranks = np.unique(column, return_inverse=True)
    return values, ranks.reshape(-1)


def product_starts(anchors: np.ndarray) -> list[np.ndarray] | None:
    """Return the per-axis starts if ``anchors`` are exactly their product, in C order.

    Examples
    --------
    >>> [s.tolist() for s in product_starts(np.array([[0, 0], [0, 4], [2, 0], [2, 4]]))]
    [[0, 2], [0, 4]]
    >>> product_starts(np.array([[0, 4], [0, 0]])) is None
    True
    """
    anchors = np.asarray(anchors)
    if anchors.ndim != 2 or len(anchors) == 0:
        return None
    starts = [unique_inverse(anchors[:, j])[0] for j in range(anchors.shape[1])]
    if int(np.prod([len(s) for s in starts], dtype=np.int64)) != len(anchors):
        return None
    k = len(starts)
    grid = anchors.reshape(*(len(s) for s in starts), k)
    for j, s in enumerate(starts):
        if not (grid[..., j] == s.reshape([-1 if i == j else 1 for i in range(k)])).all():
            return None
    return starts


def covering_starts(anchors: np.ndarray) -> list[np.ndarray] | None:
    """Return the per-axis starts if ``anchors`` are their whole product, each once (any order).

    Examples
    --------
    >>> [s.tolist() for s in covering_starts(np.array([[2, 0], [0, 0], [0, 5], [2, 5]]))]
    [[0, 2], [0, 5]]
    >>> covering_starts(np.array([[0, 0], [0, 0], [1, 1], [1, 0]])) is None
    True
    """
    anchors = np.asarray(anchors)
    starts, ranks = zip(*(unique_inverse(anchors[:, j]) for j in range(anchors.shape[1])))
    count = int(np.prod([len(st) for st in starts], dtype=np.int64))
    if count != len(anchors):
        return None
    index = np.ravel_multi_index(ranks, [len(st) for st in starts])
    seen = np.zeros(count, dtype=bool)
    seen[index] = True
    return list(starts) if seen.all() else None


def axis_runs(starts: np.ndarray, size: int) -> list[slice] | None:
    """Split sorted ``starts`` into runs of members at least ``size`` apart (index slices).

    None if that takes more than :data:`MAX_RUNS` runs (an irregular layout).

    Examples
    --------
    >>> axis_runs(np.array([0, 8, 16, 24, 28]), 16)
    [slice(0, 4, 2), slice(1, 4, 2), slice(4, 5, 1)]
    """
    runs: list[slice] = []
    i, count = 0, len(starts)
    while i < count:
        j = i
        if i + 1 < count:
            step = int(starts[i + 1] - starts[i])
            j = i + 1
            while j + 1 < count and starts[j + 1] - starts[j] == step:
                j += 1
            apart = 1 if step >= size else -(-size // step)
        else:
            apart = 1
        runs += [slice(i + r, j + 1, apart) for r in range(min(apart, j - i + 1))]
        if len(runs) > MAX_RUNS:
            return None
        i = j + 1
    return runs


def axis_sums(starts: np.ndarray, factor: np.ndarray, origin: int, extent: int) -> np.ndarray:
    """Σ of ``factor`` placed at every start, over ``[origin, origin + extent)`` (float64).

    Examples
    --------
    >>> axis_sums(np.array([0, 2]), np.ones(3), 0, 5).tolist()
    [1.0, 1.0, 2.0, 1.0, 1.0]
    """
    total = np.zeros(extent + len(factor), dtype=np.float64)
    offsets = np.asarray(starts, dtype=np.int64) - origin
    inside = (offsets > -len(factor)) & (offsets < extent)
    index = offsets[inside, None] + np.arange(len(factor))
    keep = index >= 0
    np.add.at(total, index[keep], np.broadcast_to(factor, index.shape)[keep])
    return total[:extent]


def lattice_add(
    out: np.ndarray,
    origin: Sequence[int],
    starts: Sequence[np.ndarray],
    predictions: np.ndarray,
    axis_weights: Sequence[np.ndarray],
    pool: compiled.Pool | None = None,
) -> bool:
    """Add ``Σ w·x`` of a product grid of patches into ``out``; False if the layout is irregular.

    Parameters
    ----------
    out
        ``(*lead, *extent)`` at ``origin``; it must hold every patch whole.
    starts
        Per axis, the sorted starts of the product grid.
    predictions
        ``(n, *lead, *patch)`` in the C order of the grid (row-major over ``starts``).
    axis_weights
        Per axis, ``(len(starts[j]), patch[j])`` weights of each offset of each start.
    pool
        Threads that share the pieces of each phase (default: this thread).

    Examples
    --------
    >>> out = np.zeros(6)
    >>> w = [np.ones((2, 4))]
    >>> lattice_add(out, [0], [np.array([0, 2])], np.ones((2, 4)), w)
    True
    >>> out.tolist()
    [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    """
    k = len(starts)
    size = predictions.shape[predictions.ndim - k :]
    runs = [axis_runs(s, n) for s, n in zip(starts, size)]
    if any(r is None for r in runs):
        return False
    lead = predictions.shape[1 : predictions.ndim - k]
    n_lead = len(lead)
    grid = predictions.reshape(*(len(s) for s in starts), *lead, *size)
    # (c_1, ..., c_k, *lead, n_1, ..., n_k) -> (*lead, c_1, n_1, ..., c_k, n_k)
    order = [*range(k, k + n_lead)]
    for j in range(k):
        order += [j, k + n_lead + j]
    phases = [tuple(p) for p in np.ndindex(*(len(r) for r in runs))]
    for phase in phases:
        chosen = [runs[j][phase[j]] for j in range(k)]
        values = grid[tuple(chosen)].transpose(order)
        counts = [len(range(*c.indices(len(s)))) for c, s in zip(chosen, starts)]
        firsts = [int(s[c.start]) - int(o) for c, s, o in zip(chosen, starts, origin)]
        steps = [
            int(s[c.start + c.step] - s[c.start]) if n > 1 else 1
            for c, s, n in zip(chosen, starts, counts)
        ]
        base = out[(Ellipsis, *(slice(f, None) for f in firsts))]
        shape, strides = list(out.shape[:n_lead]), list(out.strides[:n_lead])
        for j in range(k):
            stride = out.strides[n_lead + j]
            shape += [counts[j], size[j]]
            strides += [steps[j] * stride, stride]
        target = as_strided(base, shape=shape, strides=strides, writeable=True)
        weights = [axis_weights[j][chosen[j]].astype(out.dtype, copy=False) for j in range(k)]
        _add_phase(target, values, weights, n_lead, pool)
    return True


def _add_phase(target, values, weights, n_lead: int, pool: compiled.Pool | None) -> None:
    """``target += values * weights`` over one phase, in pieces that stay in cache.

    A piece is a run of rows of the phase's first axis (or, for large patches, a
    band of one row), multiplied by the other axes' weights, then by its own.
    """
    rest = functools.reduce(np.multiply.outer, weights[1:], np.ones((), dtype=target.dtype))
    rows, size = values.shape[n_lead], values.shape[n_lead + 1]
    line_bytes = max(values[(slice(None),) * n_lead + (0, 0)].nbytes, 1)  # one offset of a row
    lines = max(1, CHUNK_BYTES // line_bytes)  # offsets of the first axis per piece
    if lines >= size:  # whole rows per piece
        per = min(rows, lines // size)
        pieces = [(slice(r, min(r + per, rows)), slice(0, size)) for r in range(0, rows, per)]
    else:  # bands of one row
        pieces = [
            (slice(r, r + 1), slice(a, min(a + lines, size)))
            for r in range(rows)
            for a in range(0, size, lines)
        ]
    lead_index = (slice(None),) * n_lead
    trailing = (1,) * rest.ndim

    def work(mine: list[tuple[slice, slice]]) -> None:
        scratch = None
        for row, band in mine:
            index = (*lead_index, row, band)
            part = values[index]
            if scratch is None or scratch.shape != part.shape:
                scratch = np.empty(part.shape, dtype=target.dtype)
            np.multiply(part, rest, out=scratch)
            first = weights[0][row, band]
            scratch *= first.reshape(*first.shape, *trailing)
            region = target[index]
            np.add(region, scratch, out=region)

    workers = 1 if pool is None else min(pool.threads, len(pieces))
    if workers <= 1:
        work(pieces)
        return
    list(pool.map(work, [pieces[t::workers] for t in range(workers)]))


def lattice_weights(
    starts: Sequence[np.ndarray],
    factors: Sequence[np.ndarray],
    origin: Sequence[int],
    extent: Sequence[int],
    normalise: bool,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per axis, the ``(count, size)`` weights of each start's offsets, and Σw over the extent.

    With ``normalise`` each factor is divided by the axis' Σw where it lands, so
    that the sum of the weighted patches is their weighted mean.
    """
    sums, weights = [], []
    for s, f, o, n in zip(starts, factors, origin, extent):
        total = axis_sums(s, f, o, n)
        sums.append(total)
        w = np.broadcast_to(f, (len(s), len(f)))
        if normalise:
            index = (np.asarray(s, dtype=np.int64) - o)[:, None] + np.arange(len(f))
            with np.errstate(divide="ignore", invalid="ignore"):
                w = np.where(
                    total[np.clip(index, 0, n - 1)] > 0, w / total[np.clip(index, 0, n - 1)], 0
                )
        weights.append(np.asarray(w))
    return weights, sums


def product_sums(
    anchors: np.ndarray, factors: Sequence[np.ndarray] | None, origin, extent
) -> list[np.ndarray] | None:
    """Per axis, Σw over a box of the patches at ``anchors``; None if they are no product grid.

    The box's Σw is the outer product of these (:func:`outer_product`).

    Examples
    --------
    >>> [s.tolist() for s in product_sums(np.array([[0], [2]]), [np.ones(3)], [0], [5])]
    [[1.0, 1.0, 2.0, 1.0, 1.0]]
    """
    if factors is None or len(anchors) == 0:
        return None
    starts = covering_starts(anchors)
    if starts is None:
        return None
    return [axis_sums(s, f, o, n) for s, f, o, n in zip(starts, factors, origin, extent)]


def outer_product(sums: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Return the outer product of float64 ``sums``, rounded once to ``dtype``.

    Rounded as ``np.multiply.outer`` then ``astype`` would, without the float64 copy.

    Examples
    --------
    >>> outer_product([np.array([1.0, 2.0]), np.array([0.5, 3.0])], np.dtype("f4"))
    array([[0.5, 3. ],
           [1. , 6. ]], dtype=float32)
    """
    head = functools.reduce(np.multiply.outer, sums[:-1], np.ones((), dtype=np.float64))
    out = np.empty((*head.shape, *sums[-1].shape), dtype=dtype)
    np.multiply(head[..., None], sums[-1], out=out)
    return out


def all_positive(sums: Sequence[np.ndarray]) -> bool:
    """Whether every cell of the float64 outer product of ``sums`` (each >= 0) is > 0.

    Rounding is monotone, so the smallest cell is the product of the smallest sums.

    Examples
    --------
    >>> all_positive([np.array([1.0, 2.0]), np.array([0.0, 3.0])])
    False
    """
    smallest = (float(s.min(initial=np.inf)) for s in sums)  # an empty axis: no cell
    return functools.reduce(operator.mul, smallest, 1.0) > 0


def lattice_overlap_add(
    anchor_groups: Sequence[np.ndarray],
    prediction_groups: Sequence[np.ndarray],
    box: tuple[Sequence[int], Sequence[int]],
    factors: Sequence[np.ndarray],
    normalise: bool,
    dtype: np.dtype,
    threads: int = 1,
    nan_uncovered: bool = True,
) -> np.ndarray | None:
    """Σ w·x (or the weighted mean) of groups of patches over a box, on the lattice.

    All anchors together must be a product grid (a regular grid is), and each
    group's one in C order (as a regular grid cut into chunks is) unless the
    compiled kernel takes them (2-D, numba); otherwise None, and so for
    predictions holding NaN (which need per-cell weights). ``box`` is the
    ``(origin, shape)`` of the box. Cells no patch covers are NaN with
    ``nan_uncovered``, else 0.

    Examples
    --------
    >>> groups = [np.array([[0], [2]])], [np.array([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])]
    >>> lattice_overlap_add(*groups, ([0], [5]), [np.ones(3)], True, np.dtype("f8")).tolist()
    [1.0, 1.0, 2.0, 3.0, 3.0]
    """
    origin, box_shape = box
    k = len(box_shape)
    size = [len(f) for f in factors]
    anchor_groups = [np.asarray(a, dtype=np.int64).reshape(-1, k) for a in anchor_groups]
    union = np.concatenate(anchor_groups)
    if not len(union) or any(len(a) != len(v) for a, v in zip(anchor_groups, prediction_groups)):
        return None  # not one prediction per anchor: the loop over patches says what it does
    # The compiled kernel takes any groups (batches, too) of a 2-D lattice; the numpy
    # passes need each group a product grid in C order.
    fused = k == 2 and compiled.supports(dtype)
    fused = fused and all(compiled.supports(v.dtype) for v in prediction_groups)
    group_starts = [product_starts(a) for a in anchor_groups]
    if not fused and any(s is None for s in group_starts):
        return None
    if len(anchor_groups) == 1 and group_starts[0] is not None:
        starts = group_starts[0]
    else:
        starts = covering_starts(union)
    if starts is None:
        return None
    if not fused and any(axis_runs(s, n) is None for gs in group_starts for s, n in zip(gs, size)):
        return None
    box = LatticeBox.around(starts, origin, box_shape, factors, normalise)
    lead = prediction_groups[0].shape[1 : prediction_groups[0].ndim - k]
    out = np.empty((*lead, *box.extent), dtype=dtype)
    # Short patch rows: per output row, the row kernel reads a few bytes of each of
    # many patches, an order the prefetcher does not follow once they are out of cache
    # (lazy 16x16 patches: 0.88 against 1.07 us each); patch by patch reads them in order.
    by_patch = fused and size[-1] * prediction_groups[0].dtype.itemsize < PATCH_MAJOR_BYTES
    # One product grid into a fresh buffer: the row kernel zeroes each row as it
    # reaches it, on the thread that owns the row, and reads it for NaN while it is
    # in cache (two passes over ``out`` spared; page faults in parallel).
    single = fused and not by_patch and len(anchor_groups) == 1 and group_starts[0] is not None
    may_hold_nan = True
    if not single:
        out.fill(0)
    pool = compiled.Pool(threads) if threads > 1 else None
    try:
        for anchors, anchors_starts, values in zip(anchor_groups, group_starts, prediction_groups):
            if anchors_starts is None or by_patch:  # fused: any list of patches
                box.blend(out, anchors, values, pool)
                continue
            rows = [np.searchsorted(s, gs) for s, gs in zip(starts, anchors_starts)]
            own = [w[r] for w, r in zip(box.weights, rows)]
            if fused:
                may_hold_nan = compiled.blend_2d(
                    out,
                    (box.lo[0], box.lo[1]),
                    anchors_starts,
                    values,
                    own,
                    pool,
                    fresh=single,
                    tell_nan=single,
                )
            else:
                lattice_add(out, box.lo, anchors_starts, values, own, pool)
    finally:
        if pool is not None:
            pool.shutdown()
    out = box.cut(out, origin, box_shape)
    if may_hold_nan and holds_nan(out):
        return None
    if nan_uncovered:
        box.mark_uncovered(out, origin, box_shape)
    return out


class LatticeBox(NamedTuple):
    """A buffer's place and weights for a product grid of patches: it holds every patch whole.

    ``lo`` and ``extent`` reach from the box's origin (or the first start, if
    earlier) to its end (or past the last patch); ``weights`` and ``sums`` are
    :func:`lattice_weights` over that extent (``normalised``: over Σw).
    """

    starts: list[np.ndarray]
    lo: list[int]
    extent: list[int]
    weights: list[np.ndarray]
    sums: list[np.ndarray]
    normalised: bool

    @classmethod
    def around(
        cls,
        starts: Sequence[np.ndarray],
        origin: Sequence[int],
        box_shape: Sequence[int],
        factors: Sequence[np.ndarray],
        normalise: bool,
    ) -> LatticeBox:
        """Place the buffer for patches at the product of ``starts`` blended into a box."""
        size = [len(f) for f in factors]
        lo = [min(int(o), int(s[0])) for o, s in zip(origin, starts)]
        hi = [
            max(int(o) + int(n), int(s[-1]) + m)
            for o, n, s, m in zip(origin, box_shape, starts, size)
        ]
        extent = [h - low for h, low in zip(hi, lo)]
        weights, sums = lattice_weights(starts, factors, lo, extent, normalise)
        return cls(list(starts), lo, extent, weights, sums, normalise)

    def blend(
        self,
        out: np.ndarray,
        anchors: np.ndarray,
        values: np.ndarray,
        pool: compiled.Pool | None = None,
        kernel: Kernel = "compiled",
    ) -> None:
        """Add 2-D patches (any of the grid's, any order) into ``out`` with ``kernel``.

        The numpy kernel runs on the calling thread (``pool`` is the compiled one's).
        """
        rows = self.rows_of(anchors)
        if kernel == "compiled":
            compiled.blend_patches(out, tuple(self.lo), anchors, values, rows, self.weights, pool)
        elif kernel == "numpy":
            blend_patches_numpy(out, tuple(self.lo), anchors, values, rows, self.weights)
        else:
            raise ValueError(f"kernel={kernel!r}: use 'compiled' or 'numpy'")

    def rows_of(self, anchors: np.ndarray) -> tuple[np.ndarray, ...]:
        """Return the rows of ``weights`` (along each axis) of the patches at ``anchors``."""
        return tuple(np.searchsorted(s, anchors[:, j]) for j, s in enumerate(self.starts))

    def blend_clean(
        self, out: np.ndarray, anchors: np.ndarray, values: np.ndarray, zeroed: int
    ) -> tuple[int, int]:
        """Add float patches in order, up to the first holding a NaN; zero rows as they are reached.

        :func:`xpatch.core.blend.compiled.blend_clean_patches` on ``out``'s rows
        ``[zeroed, ...)``: returns the count of patches added and the new ``zeroed``.
        """
        rows = self.rows_of(anchors)
        return compiled.blend_clean_patches(
            out, tuple(self.lo), anchors, values, rows, self.weights, zeroed
        )

    def cut(self, out: np.ndarray, origin: Sequence[int], box_shape: Sequence[int]) -> np.ndarray:
        """``out`` cut to the box (a copy if it reaches past it)."""
        box = (
            Ellipsis,
            *(
                slice(int(o) - low, int(o) - low + int(n))
                for o, low, n in zip(origin, self.lo, box_shape)
            ),
        )
        if list(self.lo) != [int(o) for o in origin] or self.extent != [int(n) for n in box_shape]:
            out = out[box].copy()
        return out

    def mark_uncovered(
        self, out: np.ndarray, origin: Sequence[int], box_shape: Sequence[int]
    ) -> None:
        """Set the cells of ``out`` (cut to the box) that no patch covers to NaN."""
        # Σw is a product: a cell is covered where every axis' sum is > 0.
        axes = [
            s[int(o) - low : int(o) - low + int(n)] > 0
            for s, o, low, n in zip(self.sums, origin, self.lo, box_shape)
        ]
        if not all(a.all() for a in axes):
            out[..., ~functools.reduce(np.logical_and.outer, axes)] = np.nan


def blend_patches_numpy(
    out: np.ndarray,
    origin: tuple[int, int],
    anchors: np.ndarray,
    values: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray],
    axis_weights: Sequence[np.ndarray],
) -> None:
    """:func:`~xpatch.core.blend.compiled.blend_patches` in numpy, to the same bits.

    Each cell gets ``value * (row_weight * column_weight)`` added, the weights
    rounded to ``out``'s dtype, the product in the dtype numba gives it (float64 for
    integers of 4 bytes or more, and for uint16, into float32 sums), and the
    patches in the given order, as the compiled kernel does. Two passes over each
    patch: one into a scratch, one adding it.

    Examples
    --------
    >>> out = np.zeros((1, 3, 4))
    >>> weights = [np.array([[1.0, 0.5]]), np.array([[1.0, 1.0, 2.0]])]
    >>> blend_patches_numpy(out, (0, 0), np.array([[1, 1]]), np.ones((1, 1, 2, 3)),
    ...                     (np.array([0]), np.array([0])), weights)
    >>> out[0].tolist()
    [[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 2.0], [0.0, 0.5, 0.5, 1.0]]
    """
    weights_y, weights_x = (np.asarray(w, dtype=out.dtype) for w in axis_weights)
    size_y, size_x = values.shape[-2:]
    wide = values.dtype.kind in "iu" and (values.dtype.itemsize >= 4 or values.dtype == np.uint16)
    product = np.dtype(np.float64) if wide else np.result_type(values.dtype, out.dtype)
    scratch = np.empty(values.shape[1:], dtype=product)
    # Silent, as the compiled kernel is: inf + -inf is NaN, an overflow inf.
    with np.errstate(invalid="ignore", over="ignore"):
        for p in range(len(anchors)):
            y0, x0 = int(anchors[p, 0]) - origin[0], int(anchors[p, 1]) - origin[1]
            weight = np.multiply.outer(weights_y[rows[0][p]], weights_x[rows[1][p]])
            np.multiply(values[p], weight, out=scratch, dtype=product)
            target = out[..., y0 : y0 + size_y, x0 : x0 + size_x]
            np.add(target, scratch, out=target)
