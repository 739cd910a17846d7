"""Compiled overlap-add kernels for 2-D lattices, used when numba is installed.

``pip install "xarray-patch[fast]"`` adds numba. The kernels fuse what numpy does in
three passes (multiply by the window, add, move on). The row kernel
(:func:`blend_2d`) takes every output row in turn and adds every patch row that
lands on it, so the predictions are read once and each output row stays in cache
while the patches covering it add into it; it can also zero each row first (into a
fresh buffer) and read it for NaN last, sparing two passes over the output. The patch
kernel (:func:`blend_patches`) adds patches one after another in any order: batches
as they come, and patches whose rows are too short for the row kernel's reads
(:data:`xpatch.core.blend.lattice.PATCH_MAJOR_BYTES`). Both release the GIL: threads take
disjoint bands of output rows, so no two of them write the same cell.

Without numba, :data:`AVAILABLE` is False and :mod:`xpatch.core.blend.lattice` uses its
numpy passes: the results are the same to rounding.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from xpatch.core.blend.dtypes import holds_nan


class Pool(ThreadPoolExecutor):
    """A thread pool that says how many threads it has (the kernels split work by it)."""

    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        self.threads = int(threads)


#: Whether the compiled kernel can run (numba, the optional [fast] extra, is installed).
#: numba itself is imported at the first blend, not with xpatch (it takes a second).
AVAILABLE = importlib.util.find_spec("numba") is not None


def _blend_rows(
    out, values, starts_y, starts_x, weights_y, weights_x, fresh, bits, sign_off, row_lo, row_hi
):
    """Add ``values[p, l, r, c] * weights_y[i, r] * weights_x[j, c]`` into rows [lo, hi) of ``out``.

    ``out`` is ``(L, H, W)``; patch ``p = i * len(starts_x) + j`` starts at
    ``(starts_y[i], starts_x[j])`` (within ``out``); ``values`` is ``(P, L, h, w)``.
    Row views let the compiler vectorise the innermost loop (2.4x a fully indexed one).

    With ``fresh`` each row is zeroed just before its patches add into it, by the
    thread that owns it: no zeroing pass, and the fresh pages fault in on both
    threads. ``bits`` is ``out`` seen as integers of its width (floats), or None;
    then the largest ``bits & sign_off`` (the sign bit cleared) of the finished
    rows is returned, read while they are in cache: a NaN's exceeds infinity's
    (:func:`blend_2d` compares).
    """
    size_y, size_x = values.shape[2], values.shape[3]
    count_x = starts_x.shape[0]
    width = out.shape[2]
    top = 0
    for y in range(row_lo, row_hi):
        if fresh:
            for lead in range(out.shape[0]):
                out[lead, y, :] = 0
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
        if bits is not None:
            for lead in range(out.shape[0]):
                row_bits = bits[lead, y]
                for c in range(width):
                    top = max(top, row_bits[c] & sign_off)
    return top


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


def _blend_clean_patches(
    out, values, bits, sign_off, infinity, ys, xs, iy, ix, weights_y, weights_x, zeroed
):
    """As :func:`_blend_patches` (all rows) for patches free of NaN, in order, zeroing rows first.

    Patch ``p`` is read for NaN (its ``bits``, as in :func:`_blend_rows`) just
    before it is added, while it is on its way into cache; the first patch that
    holds one is not added, and its index is returned: the caller adds it and the
    rest with the valid values' weights. Rows ``[zeroed, y]`` of ``out`` are zeroed
    just before a patch first adds into row ``y``. Returns the count of patches
    added and the new ``zeroed``.
    """
    size_y, size_x = values.shape[2], values.shape[3]
    for p in range(values.shape[0]):
        top = 0
        for lead in range(values.shape[1]):
            for r in range(size_y):
                row_bits = bits[p, lead, r]
                for c in range(size_x):
                    top = max(top, row_bits[c] & sign_off)
        if top > infinity:
            return p, zeroed
        y0, x0 = ys[p], xs[p]
        column_weights = weights_x[ix[p]]
        for r in range(size_y):
            while zeroed <= y0 + r:
                for lead in range(out.shape[0]):
                    out[lead, zeroed, :] = 0
                zeroed += 1
            row_weight = weights_y[iy[p], r]
            for lead in range(values.shape[1]):
                target = out[lead, y0 + r, x0 : x0 + size_x]
                source = values[p, lead, r]
                for c in range(size_x):
                    target[c] += source[c] * (row_weight * column_weights[c])
    return values.shape[0], zeroed


def supports(dtype: np.dtype) -> bool:
    """Whether the kernel reads predictions of ``dtype``: integers, float32 and float64.

    numba has no float16 and no long double (float128), for two.
    """
    dtype = np.dtype(dtype)
    return AVAILABLE and (dtype.kind in "iu" or (dtype.kind == "f" and dtype.itemsize in (4, 8)))


@functools.cache
def _compiled(name: str):
    """Return the numba-compiled kernel ``name`` (compiled once per dtype, cached on disk)."""
    numba = importlib.import_module("numba")
    return numba.njit(nogil=True, cache=True)(globals()[name])


def _in_bands(name: str, out, values, rows: tuple[int, int], pool, *arrays) -> list:
    """Run kernel ``name`` on ``out`` and ``values`` (lead flattened) and ``arrays``, by row bands.

    ``rows`` are the first and past-the-last rows of ``out`` the patches reach;
    each thread of ``pool`` takes a band of them. Returns each band's result.
    """
    flat_out = _flat(out, name)
    flat_values = np.ascontiguousarray(values).reshape(values.shape[0], -1, *values.shape[-2:])
    workers = 1 if pool is None else pool.threads
    edges = np.linspace(*rows, workers + 1).astype(np.int64).tolist()
    bands = [(lo, hi) for lo, hi in itertools.pairwise(edges) if hi > lo]
    kernel = _compiled(name)

    def run(band: tuple[int, int]):
        return kernel(flat_out, flat_values, *arrays, *band)

    if pool is None or len(bands) == 1:
        return [run(band) for band in bands]
    return list(pool.map(run, bands))


def _flat(out: np.ndarray, name: str) -> np.ndarray:
    """``out`` as ``(L, H, W)``, a view (the kernels add into it)."""
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} adds into a C-contiguous buffer (a reshape must be a view)")
    return out.reshape(-1, *out.shape[-2:])


def _weights(axis_weights: list[np.ndarray], dtype: np.dtype) -> list[np.ndarray]:
    return [np.ascontiguousarray(w, dtype=dtype) for w in axis_weights]


def blend_2d(
    out: np.ndarray,
    origin: tuple[int, int],
    starts: list[np.ndarray],
    values: np.ndarray,
    axis_weights: list[np.ndarray],
    pool: Pool | None = None,
    fresh: bool = False,
    tell_nan: bool = False,
) -> bool:
    """Add a 2-D product grid of patches into ``out`` (``(*lead, H, W)``, holding them whole).

    ``values`` is ``(n, *lead, h, w)`` in the grid's C order; ``axis_weights`` the
    per-start ``(count, size)`` weights along y and x (as :mod:`xpatch.core.blend.lattice`
    builds them). Threads of ``pool`` take bands of rows. With ``fresh``, ``out``
    holds garbage and is overwritten: the kernel zeroes each row the patches reach
    just before adding into it, and the other rows are zeroed first.

    With ``tell_nan``, returns whether ``out`` (all of it) holds a NaN after the
    adds, the rows the patches reach read while they are in cache rather than in
    a pass of their own; without it, True (not read).
    """
    flat = _flat(out, "blend_2d")
    starts_y = np.asarray(starts[0], dtype=np.int64) - origin[0]
    starts_x = np.asarray(starts[1], dtype=np.int64) - origin[1]
    height = out.shape[-2]
    rows = (max(int(starts_y.min()), 0), min(int(starts_y.max()) + values.shape[-2], height))
    if fresh:  # rows no patch reaches
        flat[:, : rows[0]] = 0
        flat[:, rows[1] :] = 0
    bits, sign_off, infinity = _float_bits(flat) if tell_nan else (None, None, 0)
    tops = _in_bands(
        "_blend_rows",
        out,
        values,
        rows,
        pool,
        starts_y,
        starts_x,
        *_weights(axis_weights, out.dtype),
        fresh,
        bits,
        sign_off,
    )
    if not tell_nan:
        return True
    if bits is None:  # integers
        return False
    if max(tops, default=0) > infinity:
        return True
    return not fresh and any(holds_nan(part) for part in (flat[:, : rows[0]], flat[:, rows[1] :]))


def _float_bits(flat: np.ndarray) -> tuple[np.ndarray | None, object, int]:
    """``flat`` seen as integers of its width, the mask that clears the sign, infinity's bits."""
    if flat.dtype.kind != "f":
        return None, None, 0
    integer = np.dtype(f"i{flat.dtype.itemsize}")
    infinity = int(np.array(np.inf, dtype=flat.dtype).view(integer))
    return flat.view(integer), integer.type(np.iinfo(integer).max), infinity


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
    if len(anchors) == 0:
        return
    ys, xs, indices = _places(anchors, origin, rows)
    reached = (int(ys.min()), int(ys.max()) + values.shape[-2])
    _in_bands(
        "_blend_patches",
        out,
        values,
        reached,
        pool,
        ys,
        xs,
        *indices,
        *_weights(axis_weights, out.dtype),
    )


def blend_clean_patches(
    out: np.ndarray,
    origin: tuple[int, int],
    anchors: np.ndarray,
    values: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray],
    axis_weights: list[np.ndarray],
    zeroed: int,
) -> tuple[int, int]:
    """Add float patches into ``out`` in order, up to the first that holds a NaN.

    As :func:`blend_patches` on one thread, but each patch is read for NaN just
    before it is added, which spares a pass over ``values`` (``holds_nan``), and
    the rows of ``out`` from ``zeroed`` on are zeroed as the patches first reach
    them, which spares a pass over ``out``: rows ``[0, zeroed)`` are zeroed, the
    others may hold garbage. Returns how many patches were added (``len(values)``
    unless patch ``added`` holds a NaN) and the new ``zeroed``.

    Examples
    --------
    >>> out = np.full((1, 2, 4), 7.0)  # garbage past row 0
    >>> out[:, 0] = 0
    >>> weights = [np.ones((1, 2)), np.ones((2, 2))]
    >>> values = np.array([[[[1.0, 1], [1, 1]]], [[[2.0, np.nan], [2, 2]]]])
    >>> rows = (np.array([0, 0]), np.array([0, 1]))
    >>> blend_clean_patches(out, (0, 0), np.array([[0, 0], [0, 2]]), values, rows, weights, 1)
    (1, 2)
    >>> out[0].tolist()
    [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    """
    if values.dtype.kind != "f":
        raise TypeError(f"blend_clean_patches reads float predictions, not {values.dtype}")
    flat = _flat(out, "blend_clean_patches")
    flat_values = np.ascontiguousarray(values).reshape(values.shape[0], -1, *values.shape[-2:])
    bits, sign_off, infinity = _float_bits(flat_values)
    ys, xs, indices = _places(anchors, origin, rows)
    added, zeroed = _compiled("_blend_clean_patches")(
        flat,
        flat_values,
        bits,
        sign_off,
        infinity,
        ys,
        xs,
        *indices,
        *_weights(axis_weights, out.dtype),
        zeroed,
    )
    return int(added), int(zeroed)


def _places(anchors: np.ndarray, origin: tuple[int, int], rows: tuple[np.ndarray, np.ndarray]):
    """Return the patches' first rows and columns in ``out`` and their rows of the axis weights."""
    ys = np.ascontiguousarray(anchors[:, 0] - origin[0], dtype=np.int64)
    xs = np.ascontiguousarray(anchors[:, 1] - origin[1], dtype=np.int64)
    return ys, xs, [np.ascontiguousarray(r, dtype=np.int64) for r in rows]
