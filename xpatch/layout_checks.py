"""Checks of :class:`~xpatch.Patcher` arguments that read the object: size, labels, coverage."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping

import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, OptionError, UncoveredCellsWarning
from xpatch.core.geometry import Geometry
from xpatch.core.samplers import index_positions


def size_mapping(size: Mapping[Hashable, int] | None, size_kwargs: Mapping[str, int]) -> dict:
    """Return the patch size given as ``size=`` or as keyword arguments, checked."""
    if size is not None and size_kwargs:
        raise OptionError(
            f"the patch size was given twice: size={size!r} and keyword arguments "
            f"{dict(size_kwargs)!r}; use one of them."
        )
    size = size_kwargs if size is None else size
    if not isinstance(size, Mapping):
        raise OptionError(
            f"size={size!r} must map dimension names to patch extents, "
            "e.g. size={'y': 256, 'x': 256} or .patch(y=256, x=256)."
        )
    if not size:
        raise OptionError("no patch size given: pass size={'y': 256, 'x': 256} or y=256, x=256.")
    return dict(size)


def label_locator(obj: xr.DataArray | xr.Dataset):
    """Return a function that finds the positions of coordinate labels (for ``AtLabels``)."""

    def locate(dim: Hashable, labels: np.ndarray, method: str | None) -> np.ndarray:
        if dim not in obj.indexes:
            raise DimensionError(
                f"AtLabels: dimension {dim!r} has no coordinate to look labels up in; "
                "give start indices with xpatch.Anchors instead."
            )
        return index_positions(obj.indexes[dim], dim, labels, method)

    return locate


def warn_uncovered(geometry: Geometry) -> None:
    """Warn with an :class:`~xpatch.UncoveredCellsWarning` if some cells get no patch."""
    uncovered = geometry.uncovered_grid_cells()
    if not uncovered:
        return
    total = int(np.prod(geometry.shape, dtype=np.float64))
    size = dict(zip(geometry.dims, geometry.size))
    stride = dict(zip(geometry.dims, geometry.stride))
    warnings.warn(
        f"{uncovered} of {total} cells ({uncovered / total:.1%}) along "
        f"{list(geometry.dims)!r} are covered by no patch (boundary={geometry.boundary!r}, "
        f"size={size}, stride={stride}); they reconstruct to NaN. "
        "Use boundary='shift' or 'pad', or a stride <= size, to cover every cell.",
        UncoveredCellsWarning,
        stacklevel=4,
    )
