"""Per-patch sums over a cell grid (valid-cell counts) via a summed-area table.

The sum over any box is 2**k lookups in the k-D cumulative sum, so the count of
valid cells for a million patches costs one pass over the grid plus a gather.
For dask input the cumulative sum is lazy and only the looked-up corners are
computed, in a single ``dask.compute``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import dask
import numpy as np

from xpatch.core.dask_arrays import is_dask_array

if TYPE_CHECKING:
    import dask.array as da


def window_sums(
    cells: np.ndarray | da.Array, anchors: np.ndarray, size: Sequence[int]
) -> np.ndarray:
    """Sum ``cells`` over the box of every patch (cells past the edge count 0).

    Parameters
    ----------
    cells
        k-D numpy or dask array over the patched axes (e.g. valid-cell counts).
    anchors
        ``(n, k)`` anchors.
    size
        Patch size per axis.

    Examples
    --------
    >>> cells = np.ones((4, 4), dtype=int)
    >>> window_sums(cells, np.array([[0, 0], [3, 3]]), [2, 2]).tolist()
    [4, 1]
    """
    lazy = is_dask_array(cells)
    k = cells.ndim
    table = cells.astype(np.int64)
    for axis in range(k):
        table = table.cumsum(axis=axis)
    # A leading zero row/column per axis turns inclusive sums into box sums.
    pad = [(1, 0)] * k
    if lazy:
        import dask.array as da

        table = da.pad(table, pad)
    else:
        table = np.pad(table, pad)
    extent = np.asarray(cells.shape)
    lo = np.clip(anchors, 0, extent)
    hi = np.clip(anchors + np.asarray(size), 0, extent)
    corners = []
    signs = []
    for pick_hi in itertools.product((False, True), repeat=k):
        index = tuple(np.where(p, hi[:, j], lo[:, j]) for j, p in enumerate(pick_hi))
        corners.append(table.vindex[index] if lazy else table[index])
        signs.append((-1) ** (k - sum(pick_hi)))
    if lazy:
        corners = dask.compute(*corners)
    return sum(s * np.asarray(c) for s, c in zip(signs, corners))
