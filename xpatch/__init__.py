"""xpatch: lazy patch views of xarray objects and exact weighted overlap-add.

``import xpatch`` registers the ``.patch`` accessor on DataArray and Dataset.

Examples
--------
>>> import numpy as np, xarray as xr, xpatch
>>> da = xr.DataArray(np.random.default_rng(0).random((3, 64, 64)), dims=("band", "y", "x"))
>>> p = da.patch(y=32, x=32, stride=24, window="hann")
>>> len(p)
9
>>> bool(np.allclose(p.reconstruct(p.patches()), da))
True
"""

from xpatch import accessor as _accessor  # noqa: F401  (registers .patch)
from xpatch.core.errors import (
    DimensionError,
    GeometryError,
    MissingDependencyError,
    NodataCollisionWarning,
    OptionError,
    OutputError,
    OutputExistsError,
    OutputLockedError,
    PredictionError,
    UncoveredCellsWarning,
    XPatchError,
)
from xpatch.core.samplers import Anchors, AtLabels, JitteredGrid, RandomAnchors, RegularGrid
from xpatch.forecast.stencil import Forecast
from xpatch.io.writer import write
from xpatch.patcher import Patcher, patch
from xpatch.scenes.patcher import ScenePatcher, patch_scenes
from xpatch.tree.patcher import TreePatcher
from xpatch.version import VERSION as __version__
from xpatch.xarray.samplers import AtPoints, InBounds, WeightedAnchors, balanced_weights


def __getattr__(name: str):
    # on_grid needs the [geo] extra (rasterio, geopandas): imported when first asked for.
    if name == "on_grid":
        from xpatch.grid.warp import on_grid

        return on_grid
    raise AttributeError(f"module 'xpatch' has no attribute {name!r}")


__all__ = [
    "Anchors",
    "AtLabels",
    "AtPoints",
    "DimensionError",
    "Forecast",
    "GeometryError",
    "InBounds",
    "JitteredGrid",
    "MissingDependencyError",
    "NodataCollisionWarning",
    "OptionError",
    "OutputError",
    "OutputExistsError",
    "OutputLockedError",
    "Patcher",
    "PredictionError",
    "RandomAnchors",
    "RegularGrid",
    "ScenePatcher",
    "TreePatcher",
    "UncoveredCellsWarning",
    "WeightedAnchors",
    "XPatchError",
    "__version__",
    "balanced_weights",
    "on_grid",
    "patch",
    "patch_scenes",
    "write",
]
