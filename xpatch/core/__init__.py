"""The numpy/dask core of xpatch: geometry, windows, extraction, overlap-add, caching.

Also the samplers, sliding-window inference (:mod:`xpatch.core.apply`), and the
chunk cache and chunk-local shuffle behind the Grain sources. Blending results back
onto the grid is the sub-folder :mod:`xpatch.core.blend` (the reductions and their
kernels).

Nothing in this package imports xarray; the layer above it (:mod:`xpatch.xarray`)
knows about dimension names, coordinates and attributes.
"""

from xpatch.core.blend.overlap_add import overlap_add
from xpatch.core.blend.partials import overlap_add_dask
from xpatch.core.blend.reductions import REDUCTIONS, Reduction, ReductionName
from xpatch.core.errors import (
    DimensionError,
    GeometryError,
    OptionError,
    PredictionError,
    UncoveredCellsWarning,
    XPatchError,
)
from xpatch.core.geometry import BOUNDARIES, Boundary, Geometry
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
    "ReductionName",
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
