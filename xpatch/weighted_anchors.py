"""A sampler that centres patches on cells drawn in proportion to a weight map.

:class:`WeightedAnchors` is MONAI's ``RandWeightedCrop`` for labelled arrays
larger than memory: the weight map is read chunk by chunk, once, while the
draw runs (:func:`xpatch.core.weighted_draw.weighted_cells`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, OptionError
from xpatch.core.geometry import Geometry, as_positive_int
from xpatch.core.plan import chunk_starts
from xpatch.core.shuffle import check_seed
from xpatch.core.weighted_draw import weighted_cells
from xpatch.variables import is_dask_backed


@dataclass(frozen=True)
class WeightedAnchors:
    """``count`` patches whose centre cell is drawn in proportion to a weight map.

    The centre of a patch is its cell ``anchor + size // 2``. Centres are drawn
    with replacement, each cell with probability ``weight / sum(weights)``; a
    centre closer to the edge than half a patch moves the patch inward (the
    cell then stays inside its patch, off-centre), as :class:`~xpatch.AtPoints`
    does. Class-balanced sampling is a weight map built from a label map (say
    ``xr.where(labels == 1, 0.5 / n_pos, 0.5 / n_neg)``); "where the cloud mask is
    clear" is ``(~cloud).astype(float)``.

    Building the patcher reads the weight map once, chunk by chunk in C order,
    never whole: a Dask-backed map is computed one block at a time. The draw
    depends on the seed and on the map's chunks (not on the process): the same
    in every worker.

    Parameters
    ----------
    weights
        A DataArray with exactly the patched dims, on the array's grid (same
        sizes, and the same coordinates where both have them). Values finite and
        >= 0; cells of weight 0 are never drawn.
    count
        Number of patches.
    seed
        Seed of the generator, ``0 <= seed < 2**32``.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> image = xr.DataArray(np.zeros((32, 32)), dims=("y", "x"))
    >>> weights = xr.zeros_like(image)
    >>> weights[20, 5] = 1.0  # the only cell with weight
    >>> p = image.patch(y=8, x=8, sampler=xpatch.WeightedAnchors(weights, count=3, seed=0))
    >>> p.anchors().values.tolist()
    [[16, 1], [16, 1], [16, 1]]
    """

    weights: xr.DataArray = field(hash=False, repr=False)
    count: int
    seed: int = 0

    def resolve(self, obj: xr.DataArray | xr.Dataset, geometry: Geometry) -> DrawnAnchors:
        """Draw the anchors on ``obj``'s patch geometry (reads the weight map once)."""
        count = as_positive_int(self.count, "WeightedAnchors(count=...)")
        seed = check_seed(self.seed)
        weights = aligned_weights(self.weights, obj, geometry)
        centres = weighted_cells(weight_chunks(weights), count, seed)
        size = np.asarray(geometry.size, dtype=np.int64)
        top = np.maximum(np.asarray(geometry.shape, dtype=np.int64) - size, 0)
        anchors = np.clip(centres - size // 2, 0, top)
        return DrawnAnchors(anchors)

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Refuse: a weight map needs the array's grid, so pass the sampler to ``.patch(...)``."""
        raise OptionError(
            "WeightedAnchors needs the array's grid; pass it as sampler= to .patch(...), "
            "which draws the anchors."
        )


@dataclass(frozen=True)
class DrawnAnchors:
    """The anchors a :class:`WeightedAnchors` drew (a sampler, for the Patcher)."""

    indices: np.ndarray = field(hash=False, repr=False)

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the drawn anchors, checked against the geometry."""
        return geometry.check_anchors(self.indices, "anchors")

    def __repr__(self) -> str:
        return f"<{len(self.indices)} anchors drawn from a weight map>"


def aligned_weights(
    weights: xr.DataArray, obj: xr.DataArray | xr.Dataset, geometry: Geometry
) -> xr.DataArray:
    """Check that ``weights`` lies on ``obj``'s grid; return it in the patched dims' order."""
    if not isinstance(weights, xr.DataArray):
        raise OptionError(
            f"WeightedAnchors(weights=...) must be an xarray.DataArray on the array's grid; "
            f"got {type(weights).__name__}. Wrap it: xr.DataArray(w, dims={list(geometry.dims)!r})."
        )
    dims = list(geometry.dims)
    if set(weights.dims) != set(dims):
        raise DimensionError(
            f"WeightedAnchors: the weights have dims {list(weights.dims)!r}; they need exactly "
            f"the patched dims {dims!r} (reduce others first, e.g. weights.max('band'))."
        )
    for d, n in zip(dims, geometry.shape):
        if weights.sizes[d] != n:
            raise DimensionError(
                f"WeightedAnchors: the weights have {weights.sizes[d]} cells along {d!r} and "
                f"the array {n}; build the weight map on the array's grid."
            )
        if d in weights.coords and d in obj.coords:
            if not np.array_equal(weights[d].values, obj[d].values):
                raise DimensionError(
                    f"WeightedAnchors: the weights' {d!r} coordinate differs from the array's; "
                    "build the weight map on the array's grid (e.g. weights.reindex_like(obj))."
                )
    real = np.issubdtype(weights.dtype, np.integer) or np.issubdtype(weights.dtype, np.floating)
    if not (real or weights.dtype == bool):
        raise OptionError(
            f"WeightedAnchors: the weights have dtype {weights.dtype}; they must be real "
            "numbers (int, float or bool)."
        )
    return weights.transpose(*dims)


def weight_chunks(weights: xr.DataArray) -> Iterator[tuple[list[int], np.ndarray]]:
    """Yield ``(origin, values)`` of every chunk in C order; a Dask block is computed alone."""
    if not is_dask_backed(weights.variable):
        yield [0] * weights.ndim, np.asarray(weights.values)
        return
    data = weights.data
    starts = [chunk_starts(c) for c in data.chunks]
    for index in itertools.product(*(range(len(c)) for c in data.chunks)):
        (values,) = dask.compute(data.blocks[index])
        yield [s[i] for s, i in zip(starts, index)], np.asarray(values)


def balanced_weights(labels: xr.DataArray, classes: Sequence[Any] | None = None) -> xr.DataArray:
    """Build a weight map giving each class the same total weight, for :class:`WeightedAnchors`.

    A cell of class ``c`` weighs ``1 / (k * n_c)``, where ``n_c`` counts the
    cells of class ``c`` and ``k`` the classes: patches then centre on each class
    equally often (MONAI's ``RandCropByPosNegLabel`` with equal ratios). Cells of
    labels not in ``classes`` weigh 0.

    Counting reads the labels once (one Dask computation for lazy labels); the
    map itself is as lazy as the labels.

    Parameters
    ----------
    labels
        Integer or boolean class labels on the array's grid.
    classes
        The classes to balance (default: every label present). Each must have at
        least one cell.

    Returns
    -------
    xarray.DataArray
        float64, the dims and coordinates of ``labels``, summing to 1.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> labels = xr.DataArray(np.array([[0, 0, 0], [0, 0, 1]]), dims=("y", "x"))
    >>> xpatch.balanced_weights(labels).values.round(2).tolist()
    [[0.1, 0.1, 0.1], [0.1, 0.1, 0.5]]
    """
    if not isinstance(labels, xr.DataArray) or not (
        np.issubdtype(labels.dtype, np.integer) or labels.dtype == bool
    ):
        dtype = getattr(labels, "dtype", type(labels).__name__)
        raise OptionError(
            f"balanced_weights(labels=...) needs a DataArray of integer or boolean class "
            f"labels; got {dtype}. Round or cast float labels first: labels.astype(int)."
        )
    if is_dask_backed(labels.variable):
        (found, counts) = dask.compute(*da.unique(labels.data.ravel(), return_counts=True))
    else:
        found, counts = np.unique(labels.values, return_counts=True)
    present = dict(zip(found.tolist(), counts.tolist()))
    chosen = list(present) if classes is None else list(dict.fromkeys(classes))
    absent = [c for c in chosen if c not in present]
    if absent or not chosen:
        raise OptionError(
            f"balanced_weights: classes {absent or chosen!r} have no cells in the labels "
            f"(present: {sorted(present)}); leave them out of classes=."
        )
    keys = np.asarray(sorted(chosen))
    per_cell = np.array([1.0 / (len(keys) * present[c]) for c in keys.tolist()])

    def lookup(values: np.ndarray) -> np.ndarray:
        where = np.clip(np.searchsorted(keys, values), 0, len(keys) - 1)
        return np.where(keys[where] == values, per_cell[where], 0.0)

    return xr.apply_ufunc(lookup, labels, dask="parallelized", output_dtypes=[np.float64])
