"""The numpy/dask core of xpatch: geometry, windows, extraction, overlap-add, caching.

Also the samplers, and the chunk cache and chunk-local shuffle behind the Grain source.

Nothing in this package imports xarray; the modules above it (``xpatch.patcher``
and its views) are the layer that
knows about dimension names' coordinates and attributes.
"""

from xpatch.core.errors import (
    DimensionError,
    GeometryError,
    OptionError,
    PredictionError,
    UncoveredCellsWarning,
    XPatchError,
)
from xpatch.core.geometry import BOUNDARIES, Boundary, Geometry
from xpatch.core.overlap_add import REDUCTIONS, Reduction, overlap_add
from xpatch.core.partials import overlap_add_dask
from xpatch.core.samplers import (
    Anchors,
    AtLabels,
    JitteredGrid,
    RandomAnchors,
    RegularGrid,
    Sampler,
)
from xpatch.core.windows import WindowSpec, make_window, window_1d

__all__ = [
    "BOUNDARIES",
    "REDUCTIONS",
    "Anchors",
    "AtLabels",
    "Boundary",
    "DimensionError",
    "Geometry",
    "GeometryError",
    "JitteredGrid",
    "OptionError",
    "PredictionError",
    "RandomAnchors",
    "Reduction",
    "RegularGrid",
    "Sampler",
    "UncoveredCellsWarning",
    "WindowSpec",
    "XPatchError",
    "make_window",
    "overlap_add",
    "overlap_add_dask",
    "window_1d",
]
