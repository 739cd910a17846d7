"""The guard against a Dataset whose variables are not on one grid.

``xr.Dataset({"image": scene, "labels": labels})`` with a scene in metres and labels
in degrees is accepted by xarray: it joins the two coordinate sets into one (outer
join), so each variable is mostly NaN over an x/y axis that mixes both, and the grid
mapping keeps only the first variable's CRS. Patches of it are nonsense. The guard
refuses such a Dataset before any work, with the fix (:func:`xpatch.on_grid`).

Refused, and only this (the evidence must be clear; anything else passes):

- **different CRSs**: two data variables whose grid mappings (``spatial_ref`` /
  ``crs`` coordinates, as rioxarray writes them) declare different CRSs;
- **a union of grids**: a Dataset with a CRS whose y or x coordinate (numeric, 1-D)
  is not one regular grid: it repeats a label, goes back and forth, or its steps
  differ from their median by more than 1 % beyond the float rounding of its labels
  (so lat/lon labels with float noise pass; a georeferenced raster is regular by
  definition: its transform has one step).

A Dataset without a CRS is never refused for its coordinates (irregular labels of a
model grid are legitimate there), nor is a DataArray (it has one grid).

Pure xarray and numpy: importable without the ``[geo]`` extra.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import GeometryError
from xpatch.xarray.georef import crs_of, irregular_steps, raster_dims, same_crs

FIX = (
    "put them on one grid first: xpatch.on_grid(image, labels=labels) warps each other "
    "source into the image's CRS and grid (lazily, per chunk)"
)


def check_one_grid(obj: xr.DataArray | xr.Dataset) -> None:
    """Raise if a Dataset's variables are not on one grid: different CRSs, or a union of grids.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ok = xr.Dataset({"a": (("y", "x"), np.zeros((3, 3)))},
    ...                 coords={"y": [2.0, 1.0, 0.0], "x": [0.0, 1.0, 2.0]})
    >>> check_one_grid(ok) is None
    True
    """
    if not isinstance(obj, xr.Dataset):
        return
    crss = _variable_crss(obj)
    distinct: list[tuple[Any, list[Hashable]]] = []
    for name, crs in crss.items():
        for known, names in distinct:
            if same_crs(known, crs):
                names.append(name)
                break
        else:
            distinct.append((crs, [name]))
    if len(distinct) > 1:
        listed = "; ".join(
            f"{', '.join(map(repr, names))} in {_short(crs)}" for crs, names in distinct
        )
        raise GeometryError(
            f"the Dataset's variables are in different CRSs ({listed}): their x/y labels "
            f"mean different things, and patches would mix them; {FIX}."
        )
    if not crss and crs_of(obj) is None:
        return
    dims = raster_dims(obj)
    if dims is None:
        return
    for dim in dims:
        if dim not in obj.coords or obj[dim].ndim != 1:
            continue
        values = obj[dim].values
        if not np.issubdtype(values.dtype, np.number) or len(values) < 3:
            continue
        problem = _not_one_grid(values)
        if problem is not None:
            variables = sorted(map(str, (n for n in obj.data_vars if dim in obj[n].dims)))
            crs = next(iter(crss.values()), crs_of(obj))
            raise GeometryError(
                f"the Dataset's {dim!r} coordinate is not one regular grid ({problem}), "
                f"though the Dataset declares a CRS ({_short(crs)}): this is what "
                f"xr.Dataset(...) or xr.merge make of rasters on different grids (the "
                f"union of their labels, here of variables {variables}); {FIX}."
            )


def _variable_crss(ds: xr.Dataset) -> dict[Hashable, Any]:
    """CRS each data variable's own grid mapping declares (variables with none left out)."""
    found = {}
    for name in ds.data_vars:
        var = ds[name]
        named = var.encoding.get("grid_mapping") or var.attrs.get("grid_mapping")
        if named is not None and named in ds.coords:
            attrs = ds.coords[named].attrs
            crs = attrs.get("crs_wkt") or attrs.get("spatial_ref")
        else:
            crs = crs_of(var)
        if crs is not None:
            found[name] = crs
    return found


def _not_one_grid(values: np.ndarray) -> str | None:
    """Why 1-D labels are not one regular grid, or None if they are (within float noise)."""
    steps = np.diff(values.astype(np.float64))
    if np.any(steps == 0):
        return "it repeats a label"
    if np.any(np.sign(steps) != np.sign(steps[0])):
        return "it goes back and forth"
    if irregular_steps(values) is None:
        return None
    median = float(np.median(steps))
    rounding = 4 * np.finfo(values.dtype if values.dtype.kind == "f" else np.float64).eps
    noise = rounding * float(np.max(np.abs(values)))
    worst = float(np.max(np.abs(steps - median)))
    if worst > 0.01 * abs(median) + 2 * noise:
        return f"steps from {float(steps.min()):.6g} to {float(steps.max()):.6g}"
    return None


def _short(crs: Any) -> str:
    """Show a CRS as ``EPSG:32632`` when pyproj knows its code, else the start of its text."""
    try:
        import pyproj

        code = pyproj.CRS.from_user_input(crs).to_epsg()
        if code is not None:
            return f"EPSG:{code}"
    except Exception:  # pyproj missing or the text not a CRS: show the text
        pass
    text = str(crs)
    return text if len(text) <= 40 else text[:40] + "..."
