"""A compiled overlap-add kernel for 2-D lattices, used when numba is installed.

``pip install "xarray-patch[fast]"`` adds numba. The kernel fuses what numpy does in
three passes (multiply by the window, add, move on): for every output row, every
patch row that lands on it is multiplied by its row and column weights and added
in one loop, so the predictions are read once and each output row stays in cache
while the patches covering it add into it. It releases the GIL: threads take
disjoint bands of output rows, so no two of them write the same cell.

Without numba, :data:`AVAILABLE` is False and :mod:`xpatch.core.lattice` uses its
numpy passes: the results are the same to rounding.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class Pool(ThreadPoolExecutor):
    """A thread pool that says how many threads it has (the kernels split work by it)."""

    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        self.threads = int(threads)


#: Whether the compiled kernel can run (numba, the optional [fast] extra, is installed).
#: numba itself is imported at the first blend, not with xpatch (it takes a second).
AVAILABLE = importlib.util.find_spec("numba") is not None


def _blend_rows(out, values, starts_y, starts_x, weights_y, weights_x, row_lo, row_hi):
    """Add ``values[p, l, r, c] * weights_y[i, r] * weights_x[j, c]`` into rows [lo, hi) of ``out``.

    ``out`` is ``(L, H, W)``; patch ``p = i * len(starts_x) + j`` starts at
    ``(starts_y[i], starts_x[j])`` (within ``out``); ``values`` is ``(P, L, h, w)``.
    Row views let the compiler vectorise the innermost loop (2.4x a fully indexed one).
    """
    size_y, size_x = values.shape[2], values.shape[3]
    count_x = starts_x.shape[0]
    for y in range(row_lo, row_hi):
        for i in range(starts_y.shape[0]):
            r = y - starts_y[i]
            if r < 0 or r >= size_y:
                continue
            row_weight = weights_y[i, r]
            for j in range(count_x):
                p = i * count_x + j
                x0 = starts_x[j]
                column_weights = weights_x[j]
                for lead in range(values.shape[1]):
                    target = out[lead, y, x0 : x0 + size_x]
                    source = values[p, lead, r]
                    for c in range(size_x):
                        target[c] += source[c] * (row_weight * column_weights[c])


def _blend_patches(out, values, ys, xs, iy, ix, weights_y, weights_x, row_lo, row_hi):
    """As :func:`_blend_rows` for any list of patches: patch ``p`` at ``(ys[p], xs[p])``.

    Its weights are rows ``iy[p]`` and ``ix[p]`` of ``weights_y`` and ``weights_x``;
    only its rows within [lo, hi) are added.
    """
    size_y, size_x = values.shape[2], values.shape[3]
    for p in range(values.shape[0]):
        y0, x0 = ys[p], xs[p]
        first = max(row_lo - y0, 0)
        last = min(row_hi - y0, size_y)
        column_weights = weights_x[ix[p]]
        for r in range(first, last):
            row_weight = weights_y[iy[p], r]
            for lead in range(values.shape[1]):
                target = out[lead, y0 + r, x0 : x0 + size_x]
                source = values[p, lead, r]
                for c in range(size_x):
                    target[c] += source[c] * (row_weight * column_weights[c])


def supports(dtype: np.dtype) -> bool:
    """Whether the kernel reads predictions of ``dtype`` (numba has no float16, for one)."""
    dtype = np.dtype(dtype)
    return AVAILABLE and (dtype.kind in "iu" or (dtype.kind == "f" and dtype.itemsize >= 4))


@functools.cache
def _compiled(name: str):
    """Return the numba-compiled kernel ``name`` (compiled once per dtype, cached on disk)."""
    numba = importlib.import_module("numba")
    return numba.njit(nogil=True, cache=True)(globals()[name])


def blend_2d(
    out: np.ndarray,
    origin: tuple[int, int],
    starts: list[np.ndarray],
    values: np.ndarray,
    axis_weights: list[np.ndarray],
    pool: Pool | None = None,
) -> None:
    """Add a 2-D product grid of patches into ``out`` (``(*lead, H, W)``, holding them whole).

    ``values`` is ``(n, *lead, h, w)`` in the grid's C order; ``axis_weights`` the
    per-start ``(count, size)`` weights along y and x (as :mod:`xpatch.core.lattice`
    builds them). Threads of ``pool`` take bands of rows.
    """
    if not out.flags.c_contiguous:
        raise ValueError("blend_2d adds into a C-contiguous buffer (a reshape must be a view)")
    flat_out = out.reshape(-1, *out.shape[-2:])
    flat_values = np.ascontiguousarray(values).reshape(values.shape[0], -1, *values.shape[-2:])
    starts_y = (np.asarray(starts[0], dtype=np.int64) - origin[0]).copy()
    starts_x = (np.asarray(starts[1], dtype=np.int64) - origin[1]).copy()
    weights_y = np.ascontiguousarray(axis_weights[0], dtype=out.dtype)
    weights_x = np.ascontiguousarray(axis_weights[1], dtype=out.dtype)
    first = max(int(starts_y.min()), 0)
    last = min(int(starts_y.max()) + values.shape[-2], out.shape[-2])
    workers = 1 if pool is None else pool.threads
    edges = np.linspace(first, last, workers + 1).astype(np.int64).tolist()
    bands = [(lo, hi) for lo, hi in itertools.pairwise(edges) if hi > lo]

    kernel = _compiled("_blend_rows")

    def run(band: tuple[int, int]) -> None:
        kernel(flat_out, flat_values, starts_y, starts_x, weights_y, weights_x, *band)

    if pool is None or len(bands) == 1:
        for band in bands:
            run(band)
    else:
        list(pool.map(run, bands))


def blend_patches(
    out: np.ndarray,
    origin: tuple[int, int],
    anchors: np.ndarray,
    values: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray],
    axis_weights: list[np.ndarray],
    pool: Pool | None = None,
) -> None:
    """Add any list of 2-D patches into ``out`` (``(*lead, H, W)``, holding them whole).

    ``values`` is ``(n, *lead, h, w)`` for the ``(n, 2)`` ``anchors``; patch ``p``
    takes row ``rows[0][p]`` of ``axis_weights[0]`` and ``rows[1][p]`` of
    ``axis_weights[1]``. Threads of ``pool`` take bands of rows.
    """
    if not out.flags.c_contiguous:
        raise ValueError("blend_patches adds into a C-contiguous buffer")
    if len(anchors) == 0:
        return
    flat_out = out.reshape(-1, *out.shape[-2:])
    flat_values = np.ascontiguousarray(values).reshape(values.shape[0], -1, *values.shape[-2:])
    ys = np.ascontiguousarray(anchors[:, 0] - origin[0], dtype=np.int64)
    xs = np.ascontiguousarray(anchors[:, 1] - origin[1], dtype=np.int64)
    iy = np.ascontiguousarray(rows[0], dtype=np.int64)
    ix = np.ascontiguousarray(rows[1], dtype=np.int64)
    weights_y = np.ascontiguousarray(axis_weights[0], dtype=out.dtype)
    weights_x = np.ascontiguousarray(axis_weights[1], dtype=out.dtype)
    first, last = int(ys.min()), int(ys.max()) + values.shape[-2]
    workers = 1 if pool is None else pool.threads
    edges = np.linspace(first, last, workers + 1).astype(np.int64).tolist()
    bands = [(lo, hi) for lo, hi in itertools.pairwise(edges) if hi > lo]

    kernel = _compiled("_blend_patches")

    def run(band: tuple[int, int]) -> None:
        kernel(flat_out, flat_values, ys, xs, iy, ix, weights_y, weights_x, *band)

    if pool is None or len(bands) == 1:
        for band in bands:
            run(band)
    else:
        list(pool.map(run, bands))
