"""Blend ``apply``'s batches as ``fn`` returns them, so that no prediction waits in memory.

A batch is added into the output right after ``fn`` returns it, and then dropped:
``fn``'s next result reuses its memory instead of taking fresh pages (on these
machines a fresh page costs more than the arithmetic on it: keeping 32 MiB of
predictions made ``b * 2`` 10x slower), and a task holds one batch, not its group's
predictions. Eager arrays are blended by numba's compiled kernel
(:mod:`xpatch.core.blend.compiled`), dask tasks by its numpy twin
(:func:`~xpatch.core.blend.lattice.blend_patches_numpy`), to the same bits:
:func:`batch_kernel` says why.

NaN in a prediction is skipped, as everywhere else (:mod:`xpatch.core.blend.overlap_add`):
from the first batch that holds one, the valid values' Σw is tracked beside the sums,
and the batches blended before it count whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from xpatch.core.blend import compiled
from xpatch.core.blend.dtypes import holds_nan
from xpatch.core.blend.lattice import Kernel, LatticeBox, covering_starts
from xpatch.core.blend.reductions import Reduction, ReductionName, as_reduction
from xpatch.core.windows import BlendWindow

#: Smallest patch (cells times lead) whose batches ``apply`` blends one by one.
BATCH_BLEND_CELLS = 4096

#: Bytes of smaller patches (with their predictions) above which a dask task cuts, runs
#: and blends its group in slabs of :data:`SLAB_BYTES` rather than whole
#: (:func:`slab_kernel`).
GROUP_PATCH_BYTES = 16 * 2**20

#: Bytes of patches and predictions in one slab (:func:`slab_patches`).
SLAB_BYTES = 4 * 2**20


def batch_kernel(
    reduce: Reduction | ReductionName,
    acc: np.dtype,
    window: BlendWindow,
    values: np.dtype,
    patch_cells: int,
    in_task: bool,
) -> Kernel | None:
    """Choose the kernel that blends ``apply``'s batches one by one, or None for whole groups.

    Batches are blended where they are for a float mean or sum with a separable
    2-D window, of large patches only (:data:`BATCH_BLEND_CELLS`): small ones cost
    more per batch than the copy of their predictions that a whole group spares.
    Per-patch weights take the other path (the callers check them).

    In dask tasks the kernel of large patches is numpy's: there the blend is a small
    part of a task (reading, computing and storing chunks take the rest: a 1 GiB
    write took 6.2-6.5 s with it and 6.6-7.0 s with numba's), and loading numba's
    LLVM adds about 105 MiB to every process that runs the tasks (122 -> 227 MiB),
    a quarter of a 400 MiB budget. (Small patches load numba anyway, for the lattice
    kernel, and large groups of them take its patch kernel: :func:`slab_kernel`.)
    Eager arrays take numba's, where it is installed; without
    it they keep whole groups, whose blend two threads share (best 19 ms against
    22 ms batch by batch with numpy, for a 2048² ``apply``). Both kernels give the
    same bits.
    """
    reduce = as_reduction(reduce)
    if patch_cells < BATCH_BLEND_CELLS or not _on_2d_lattice(reduce, acc, window):
        return None
    if in_task:
        return "numpy"
    return "compiled" if _compiled_takes(values, reduce, acc, window) else None


def _on_2d_lattice(reduce: Reduction, acc: np.dtype, window: BlendWindow) -> bool:
    """Whether batches can be added into a box: a float mean or sum, a separable 2-D window."""
    return (
        reduce.sums
        and np.dtype(acc).kind == "f"
        and window.factors is not None
        and window.values.ndim == 2
    )


def _compiled_takes(
    values: np.dtype, reduce: Reduction, acc: np.dtype, window: BlendWindow
) -> bool:
    """Whether numba's kernel reads ``values`` and adds them in the sums' dtype."""
    sums = reduce.working_dtype(acc, window)
    return compiled.supports(values) and compiled.supports(sums)


def slab_kernel(
    reduce: Reduction | ReductionName,
    acc: np.dtype,
    window: BlendWindow,
    values: np.dtype,
    group_bytes: int,
) -> Kernel | None:
    """Choose the kernel that blends a task's small patches by slabs, or None to take them whole.

    A group of small patches (under :data:`BATCH_BLEND_CELLS`) is cut whole, then
    blended on the lattice: fastest while it is small (a lazy 16x16 ``apply``
    took 1.27 us per patch whole against 1.44-1.66 in slabs, for groups of
    4 MiB). Past :data:`GROUP_PATCH_BYTES` (``group_bytes``: its patches and
    predictions) it is cut, run and blended a slab of whole batches at a time by
    numba's patch kernel, so that a task holds one slab: a 1 GiB write of 16x16
    patches at stride 8 (64 MiB of patches per 1024² chunk of 4 bands) peaked at
    408 MiB instead of 495-508, in 7.8 s instead of 9.8. Without numba, for
    integer predictions (whose float sums the whole group's path checks for
    rounding), or off a float mean or sum with a separable 2-D window, None.
    """
    reduce = as_reduction(reduce)
    fits = (
        group_bytes > GROUP_PATCH_BYTES
        and np.dtype(values).kind == "f"
        and _on_2d_lattice(reduce, acc, window)
        and _compiled_takes(values, reduce, acc, window)
    )
    return "compiled" if fits else None


def slab_patches(batch_size: int, patch_bytes: int) -> int:
    """Patches per slab: whole batches of ``batch_size``, about :data:`SLAB_BYTES` in all.

    ``fn`` sees the same batches as without slabs, since a slab starts on a batch.

    Examples
    --------
    >>> slab_patches(64, 1024), slab_patches(64, 2**20)
    (4096, 64)
    """
    return batch_size * max(SLAB_BYTES // max(batch_size * patch_bytes, 1), 1)


class BatchBlend:
    """Σ w·x of a 2-D lattice's patches into a box, batch by batch.

    Parameters
    ----------
    anchors
        ``(n, 2)`` every anchor the batches will bring (a product grid, any order).
    origin, box_shape
        The box the sums are wanted on.
    factors
        The window's per-axis factors.
    normalise
        Fold Σw into the weights (a ``"mean"``): the sums are the weighted mean.
    lead, dtype
        The predictions' non-patched shape, and the dtype of the sums.
    kernel
        Which code adds the batches (:func:`batch_kernel`); the bits are the same.

    Examples
    --------
    >>> blend = BatchBlend.start(np.array([[0, 0], [0, 2]]), [0, 0], [2, 6],
    ...                          [np.ones(2), np.ones(4)], True, (), np.dtype("f8"), "numpy")
    >>> blend.add(np.array([[0, 0]]), np.ones((1, 2, 4)))
    >>> blend.add(np.array([[0, 2]]), np.full((1, 2, 4), 3.0))
    >>> total, valid = blend.finish([0, 0], [2, 6])
    >>> total[0].tolist(), valid
    ([1.0, 1.0, 2.0, 2.0, 3.0, 3.0], None)
    """

    def __init__(
        self, box: LatticeBox, lead: Sequence[int], dtype: np.dtype, kernel: Kernel
    ) -> None:
        self.box = box
        self.kernel = kernel
        self.lead = len(lead)
        # Zeroed a band of rows at a time, just before the first batch that reaches
        # it: those rows are then in cache for the blend, and a zeroing pass of the
        # whole buffer up front (or np.zeros' page by page) would only evict them.
        self.total = np.empty((*lead, *box.extent), dtype=dtype)
        self.zeroed = 0  # rows [0, zeroed) of the buffer are zeroed
        self.valid: np.ndarray | None = None  # Σw of the valid values, once a NaN came
        self.blended: list[np.ndarray] = []  # anchors added while every value was valid

    @classmethod
    def start(
        cls,
        anchors: np.ndarray,
        origin: Sequence[int],
        box_shape: Sequence[int],
        factors: Sequence[np.ndarray],
        normalise: bool,
        lead: Sequence[int],
        dtype: np.dtype,
        kernel: Kernel,
    ) -> BatchBlend | None:
        """Start a blend into the box; None if ``anchors`` are no product grid."""
        anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, 2)
        starts = covering_starts(anchors) if len(anchors) else None
        if starts is None:
            return None
        box = LatticeBox.around(starts, origin, box_shape, factors, normalise)
        return cls(box, lead, dtype, kernel)

    def _zero_to(self, row: int) -> None:
        if row > self.zeroed:
            self.total[(Ellipsis, slice(self.zeroed, row), slice(None))] = 0
            self.zeroed = row

    def add(self, anchors: np.ndarray, values: np.ndarray) -> None:
        """Add the ``(n, *lead, h, w)`` predictions of the patches at ``anchors``."""
        anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, 2)
        if not len(anchors):
            return
        if self.valid is None and self.kernel == "compiled" and values.dtype.kind == "f":
            # One read of each patch for NaN and its add, and rows zeroed as they are
            # first reached: 0.4-1.4 ms of a 9-10 ms 2048² eager apply.
            added, self.zeroed = self.box.blend_clean(self.total, anchors, values, self.zeroed)
            self.blended.append(anchors[:added])
            if added == len(anchors):
                return
            anchors, values = anchors[added:], values[added:]
        self._zero_to(int(anchors[:, 0].max()) - self.box.lo[0] + values.shape[-2])
        if self.valid is None and not holds_nan(values):
            self.box.blend(self.total, anchors, values, kernel=self.kernel)
            self.blended.append(anchors)
            return
        if self.valid is None:
            self.valid = np.zeros(self.total.shape, dtype=np.float64)
            for earlier in self.blended:
                ones = np.ones((len(earlier), *values.shape[1:]), dtype=np.float64)
                self.box.blend(self.valid, earlier, ones, kernel=self.kernel)
            self.blended = []
        missing = np.isnan(values)
        self.box.blend(self.total, anchors, np.where(missing, 0, values), kernel=self.kernel)
        self.box.blend(self.valid, anchors, (~missing).astype(np.float64), kernel=self.kernel)

    def finish(
        self, origin: Sequence[int], box_shape: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Return the sums on the box and, if some value was NaN, the valid values' Σw there."""
        self._zero_to(self.total.shape[-2])  # rows no patch reached
        total = self.box.cut(self.total, origin, box_shape)
        valid = None if self.valid is None else self.box.cut(self.valid, origin, box_shape)
        return total, valid

    def reduced(self, origin: Sequence[int], box_shape: Sequence[int]) -> np.ndarray:
        """Return the result on the box: the sums, over Σw of the valid values if some were NaN.

        Where no valid value landed (or no patch), NaN. Without NaN the blend's
        weights say whether it is a mean (``normalise``) or a sum.
        """
        total, valid = self.finish(origin, box_shape)
        if valid is None:
            self.box.mark_uncovered(total, origin, box_shape)
            return total
        landed = valid > 0
        if self.box.normalised:
            with np.errstate(invalid="ignore", divide="ignore"):
                np.divide(total, valid, out=total, where=landed)
        total[~landed] = np.nan
        return total


class SharedCut:
    """Cut one batch's patches from both ends: this thread from the front, a helper from the back.

    The blending thread, once its blend is done, helps cut the next batch, so
    that the two threads share the copying whichever of them is free first.
    ``cut(i)`` copies patch ``i``; :meth:`run` returns when every patch is cut.
    """

    def __init__(self, count: int, cut: Callable[[int], None]) -> None:
        self._cut = cut
        self._front, self._back, self._busy = 0, count, 0
        self._changed = threading.Condition()
        self._error: BaseException | None = None

    def _take(self, from_back: bool) -> int | None:
        with self._changed:
            if self._front >= self._back or self._error is not None:
                return None
            self._busy += 1
            if from_back:
                self._back -= 1
                return self._back
            self._front += 1
            return self._front - 1

    def _work(self, from_back: bool) -> None:
        while (i := self._take(from_back)) is not None:
            try:
                self._cut(i)
            except BaseException as error:
                with self._changed:
                    self._error = self._error or error
            finally:
                with self._changed:
                    self._busy -= 1
                    self._changed.notify_all()

    def help(self) -> None:
        """Cut patches from the back until none is left (the helper's part)."""
        self._work(from_back=True)

    def run(self) -> None:
        """Cut patches from the front, wait for the helper's, and raise its error if any."""
        self._work(from_back=False)
        with self._changed:
            self._changed.wait_for(lambda: self._busy == 0)
        if self._error is not None:
            raise self._error


def blend_as_they_come(
    batches: Iterable[tuple[np.ndarray, Callable[[], np.ndarray], SharedCut | None]],
    run: Callable[[np.ndarray], np.ndarray],
    blend: BatchBlend,
    overlap: bool,
) -> None:
    """``blend.add(anchors, run(cut()))`` for each batch of ``batches``, in order.

    A batch is its output anchors, a function that returns its patches, and,
    if they are copied patch by patch, the :class:`SharedCut` that copies them.
    With ``overlap`` each batch is blended on a second thread while this one
    cuts and runs the next, and that thread then helps cut it. ``run`` (``fn``)
    is always called here, one batch at a time, and the batches are added in
    order, so the sums are the same to the bit either way.
    """
    if not overlap:
        for anchors, patches, _ in batches:
            blend.add(anchors, run(patches()))
        return
    with ThreadPoolExecutor(1, thread_name_prefix="xpatch-blend") as blender:
        pending: list[Future] = []
        for anchors, patches, shared in batches:
            if shared is not None:
                pending.append(blender.submit(shared.help))
            result = run(patches())
            # The previous batch's blend ends before this one's starts: at most two
            # batches of results exist, however much slower than fn the blend is.
            for future in pending:
                future.result()  # a failed blend stops the run here
            pending = [blender.submit(blend.add, anchors, result)]
        for future in pending:
            future.result()
