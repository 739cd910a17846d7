"""GeoTIFF output: what a GeoTIFF can hold, several outputs as its bands, and the file.

A GeoTIFF holds one 2-D ``(y, x)`` or 3-D ``(band, y, x)`` array of one numeric
dtype with one nodata value (:func:`geotiff_layout` checks a result against that,
naming the fix). :func:`stack_bands` lays the variables of a Dataset (e.g.
``apply``'s several outputs) out as such an array, exactly or not at all: the
common dtype must hold every variable's values, and cells without data stay
without data. :class:`GeoTiffOutput` is the :class:`~xpatch.io.outputs.Output`
that writes a tiled GeoTIFF on the local filesystem: blocks go into
``partial.tif`` in the record's folder (``out.tif.xpatch-progress/``), and
finishing renames it to ``out.tif``, so the final path holds a complete file or
nothing (or the previous complete file, until the new one replaces it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from dask.base import tokenize

from xpatch.core.errors import MissingDependencyError, OptionError, OutputError
from xpatch.core.plan import block_regions
from xpatch.io.block_waves import active_client
from xpatch.io.location import Location
from xpatch.io.outputs import StoreTasks
from xpatch.io.record import ProgressRecord, WriterLock
from xpatch.xarray.encoding import encoded_nodata_of, nodata_of
from xpatch.xarray.georef import X_NAMES, Y_NAMES, irregular_steps

#: Suffix of the progress record's folder beside a GeoTIFF.
GEOTIFF_RECORD_SUFFIX = ".xpatch-progress"

#: dtypes a GeoTIFF stores (GDAL's types, as rasterio writes them).
GEOTIFF_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)


def _named_dim(obj: xr.DataArray, names: Sequence[str]) -> Hashable | None:
    """Return the dim whose lower-cased name comes first in ``names`` (None if none does)."""
    found = [d for d in obj.dims if str(d).lower() in names]
    return min(found, key=lambda d: names.index(str(d).lower()), default=None)


def _spatial_dims(obj: xr.DataArray) -> tuple[Hashable, Hashable] | None:
    """Return ``(y, x)`` by name (``y`` before ``latitude``, ...), else as rioxarray has them."""
    y, x = _named_dim(obj, Y_NAMES), _named_dim(obj, X_NAMES)
    if y is None or x is None:
        try:  # CF axis attributes or a grid mapping's dims: rioxarray knows them if installed
            importlib.import_module("rioxarray")
            y, x = obj.rio.y_dim, obj.rio.x_dim
        except Exception:
            return None
    return (y, x) if y in obj.dims and x in obj.dims and y != x else None


def geotiff_layout(result: xr.DataArray) -> tuple[Hashable, Hashable, list[Hashable]]:
    """Return the ``(y dim, x dim, band dims)`` of ``result`` as a GeoTIFF, or raise naming the fix.

    A GeoTIFF holds one 2-D ``(y, x)`` or 3-D ``(band, y, x)`` array of a
    numeric dtype GDAL stores, with at least one row, column and band. The row
    and column dims are found by name (``y``/``x``, ``latitude``/``longitude``,
    ``lat``/``lon``, ``northing``/``easting``, any case), else as rioxarray
    finds them (CF axis attributes) when it is installed. Only metadata is
    read: a lazy result stays lazy.

    Parameters
    ----------
    result
        What is to be written.

    Returns
    -------
    tuple
        The row dim, the column dim, and the other dims (none, or the one band
        dim), in the order of ``result.dims``.

    Raises
    ------
    OptionError
        If ``result`` is not a DataArray, is empty, has fewer than 2 or more than
        3 dims, has no recognisable y and x dims, or has a dtype GeoTIFF cannot
        store.

    Examples
    --------
    >>> da = xr.DataArray(np.zeros((2, 3, 4), "float32"), dims=("band", "lat", "lon"))
    >>> geotiff_layout(da)
    ('lat', 'lon', ['band'])
    >>> geotiff_layout(da.rename(lat="row", lon="col"))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: GeoTIFF needs a row (y) and a column (x) dim; ...
    """
    if not isinstance(result, xr.DataArray):
        raise OptionError(
            f"GeoTIFF holds one DataArray; got a {type(result).__name__}. Write one variable "
            "(ds['name']) to GeoTIFF, or the Dataset to zarr instead."
        )
    sizes = ", ".join(f"{d}: {n}" for d, n in result.sizes.items()) or "no dims"
    if result.ndim not in (2, 3):
        spatial = _spatial_dims(result) or result.dims[-2:]
        extra = tuple(d for d in result.dims if d not in spatial)
        fix = (
            f"Select or combine the extra dims first (e.g. result.isel({{{extra[0]!r}: 0}}), "
            f"or result.stack(bands={extra!r})), or write zarr instead."
            if result.ndim > 3
            else "Write it to zarr instead."
        )
        raise OptionError(
            "GeoTIFF holds a 2-D (y, x) or 3-D (band, y, x) array; the result has "
            f"{result.ndim} dim(s) ({sizes}). {fix}"
        )
    dims = _spatial_dims(result)
    if dims is None:
        rows, cols = result.dims[-2], result.dims[-1]
        raise OptionError(
            "GeoTIFF needs a row (y) and a column (x) dim; the result's dims "
            f"{list(result.dims)!r} ({sizes}) have no recognisable pair (y: one of {Y_NAMES}, "
            f"x: one of {X_NAMES}, any case). Rename them first, e.g. "
            f"result.rename({{{rows!r}: 'y', {cols!r}: 'x'}}), or write zarr instead."
        )
    y_dim, x_dim = dims
    for dim in dims:
        coord = result.coords.get(dim)
        numeric = coord is not None and coord.ndim == 1 and coord.dtype.kind in "iuf"
        uneven = irregular_steps(coord.values) if numeric else None
        if uneven is not None:
            raise OptionError(
                f"GeoTIFF holds a regular grid (one pixel size along {dim!r}), and the result's "
                f"{dim!r} labels are not regularly spaced (steps from {uneven[0]:g} to "
                f"{uneven[1]:g}): its pixel size would be their average, and most cells would "
                "be written in the wrong place. Write zarr instead (a .zarr path), which keeps "
                f"the labels, or regrid first (result.interp({dim}=<regular labels>))."
            )
    band_dims = [d for d in result.dims if d not in dims]
    empty = [d for d in result.dims if result.sizes[d] == 0]
    if empty:
        raise OptionError(
            f"the result is empty along {empty!r} ({sizes}): a GeoTIFF needs at least one row, "
            "one column and one band. Check that the input is not empty and that "
            "output_dims declares sizes >= 1."
        )
    if result.dtype not in GEOTIFF_DTYPES:
        cast = "uint8" if result.dtype.kind == "b" else "float32"
        raise OptionError(
            f"GeoTIFF cannot store the result's dtype {result.dtype}; cast it first "
            f"(result.astype({cast!r}), or declare dtype={cast!r} in apply), or write zarr "
            "instead."
        )
    return y_dim, x_dim, band_dims


# -- several outputs as bands -------------------------------------------------------------

#: Name of the stacked dim, as rioxarray names a GeoTIFF's bands.
BAND_DIM = "band"


def common_dtype(dataset: xr.Dataset) -> np.dtype:
    """Return the dtype that holds every variable's values exactly, or raise naming them.

    Examples
    --------
    >>> ds = xr.Dataset({"a": ("x", np.zeros(2, "uint8")), "b": ("x", np.zeros(2, "float32"))})
    >>> common_dtype(ds)
    dtype('float32')
    """
    dtypes = {name: var.dtype for name, var in dataset.data_vars.items()}
    common = np.result_type(*dtypes.values())
    # numpy counts int64 -> float64 as safe; it rounds integers beyond 2**53.
    inexact = [
        name
        for name, dtype in dtypes.items()
        if not np.can_cast(dtype, common, "safe")
        or (common.kind in "fc" and dtype.kind in "iu" and dtype.itemsize * 8 > 53)
    ]
    if inexact:
        raise OptionError(
            f"the variables {inexact!r} ({', '.join(str(dtypes[n]) for n in inexact)}) do not "
            f"fit the one dtype a GeoTIFF holds ({common}) exactly; declare narrower dtypes "
            "(out_dtype=...), write each variable to its own GeoTIFF, or write zarr."
        )
    return common


def stack_bands(dataset: xr.Dataset) -> xr.DataArray:
    """Lay a Dataset's variables out as the ``(band, y, x)`` array of one GeoTIFF.

    Each variable gives one band (a ``(y, x)`` variable) or one per entry of its
    other dim (``(class, y, x)``), in the Dataset's order; band ``i`` is
    described as ``"name"`` or ``"name:class=value"`` (``long_name``, which the
    GeoTIFF writer stores as band descriptions). The dtype is the one that holds
    every variable exactly (:func:`common_dtype`). Cells without data keep none:
    with a float dtype every variable's nodata becomes NaN, the file's nodata;
    with an integer dtype the variables must share their nodata value. Lazy
    stays lazy.

    Raises
    ------
    OptionError
        Variables on different grids, of more than 3 dims, with no common exact
        dtype, or with integer nodata values that differ.

    Examples
    --------
    >>> ds = xr.Dataset({
    ...     "seg": (("class", "y", "x"), np.zeros((2, 3, 4), "uint8")),
    ...     "unc": (("y", "x"), np.ones((3, 4), "float32")),
    ... })
    >>> bands = stack_bands(ds)
    >>> bands.dims, bands.dtype, bands.attrs["long_name"]
    (('band', 'y', 'x'), dtype('float32'), ('seg:class=0', 'seg:class=1', 'unc'))
    """
    if not dataset.data_vars:
        raise OptionError("the Dataset has no data variable: there is nothing to write.")
    dtype = common_dtype(dataset)
    floating = dtype.kind == "f"
    pieces, descriptions, fills = [], [], {}
    grid: tuple[Hashable, Hashable, dict] | None = None
    for name, var in dataset.data_vars.items():
        y, x, others = geotiff_layout(var)
        here = (y, x, {y: var.sizes[y], x: var.sizes[x]})
        if grid is None:
            grid = here
        elif here != grid:
            raise OptionError(
                f"variable {name!r} lies on a grid {here[2]} and the first on {grid[2]}: one "
                "GeoTIFF holds one grid. Write them to separate GeoTIFFs, or to zarr."
            )
        fill = nodata_of(var)
        fill = encoded_nodata_of(var) if fill is None else fill
        if others:
            (dim,) = others
            labels = var[dim].values if dim in var.coords else np.arange(var.sizes[dim])
            descriptions += [f"{name}:{dim}={label}" for label in labels.tolist()]
            var = var.transpose(dim, y, x).drop_vars(dim, errors="ignore").rename({dim: BAND_DIM})
        else:
            descriptions.append(str(name))
            var = var.expand_dims(BAND_DIM)
        if floating and fill is not None and not np.isnan(fill):
            var = var.where(var != fill)  # its nodata, in the file's: NaN
        elif not floating:
            fills[name] = fill
        pieces.append(var.astype(dtype).variable)
    if len({None if f is None else float(f) for f in fills.values()}) > 1:
        raise OptionError(
            f"the variables' nodata values differ ({fills}; None: it has none), and a GeoTIFF "
            "has one; give every variable the same (apply's nodata=, or "
            "var.assign_attrs(_FillValue=...)), or write zarr."
        )
    data = xr.Variable.concat(pieces, dim=BAND_DIM)
    coords = {n: c.variable for n, c in dataset.coords.items() if set(c.dims) <= set(data.dims)}
    coords[BAND_DIM] = xr.Variable(BAND_DIM, np.arange(1, len(descriptions) + 1))
    data.attrs = {}  # concat keeps the first variable's: its units or scale would misread others
    out = xr.DataArray(data, coords=coords, name="bands")
    out.attrs["long_name"] = tuple(descriptions)
    nodata = np.nan if floating else next((f for f in fills.values() if f is not None), None)
    if nodata is not None:
        out.attrs["_FillValue"] = nodata
    return out


# -- the file ------------------------------------------------------------------------------


def _store_geotiff_block(
    block: np.ndarray, path: str, window: tuple, lock: Any, marker: str, nodata: Any
) -> int:
    import rasterio
    from rasterio.windows import Window

    rows, cols = window
    if block.ndim == 2:
        block = block[np.newaxis]
    if nodata is not None and np.issubdtype(block.dtype, np.floating):
        block = np.where(np.isnan(block), nodata, block)
    with lock, rasterio.open(path, "r+") as dst:
        width, height = cols.stop - cols.start, rows.stop - rows.start
        dst.write(block, window=Window(cols.start, rows.start, width, height))
    Path(marker).touch()
    return 1


def require_rasterio() -> Any:
    """Import rasterio and rioxarray, or say what to install."""
    try:
        import rasterio
        import rioxarray  # noqa: F401  (registers .rio)
    except ImportError:
        raise MissingDependencyError(
            "writing GeoTIFF needs rioxarray and rasterio: pip install 'xarray-patch[geo]'."
        ) from None
    return rasterio


class GeoTiffOutput:  # an Output (xpatch.io.outputs)
    """A tiled GeoTIFF at a local ``location``, written through ``partial.tif``.

    Parameters
    ----------
    result
        A 2-D ``(y, x)`` or 3-D ``(band, y, x)`` DataArray.
    location
        A local path.
    nodata
        The nodata value stored in the file (NaN cells of float data become it).
    """

    def __init__(self, result: xr.DataArray, location: Location, nodata: Any) -> None:
        import dask.array as da

        y_dim, x_dim, band_dims = geotiff_layout(result)
        self.result = result.transpose(*band_dims, y_dim, x_dim)
        self.band_dims = band_dims
        data = self.result.data
        data = data if isinstance(data, da.Array) else da.from_array(data)
        self.data = data.rechunk({0: -1} if band_dims else {})
        self.nodata = nodata
        self.location = location
        self.path = Path(location.root)
        folder = location.root + GEOTIFF_RECORD_SUFFIX
        self.record = ProgressRecord(location.fs, folder, location.name)
        self.lock = WriterLock(location.fs, folder, location.name)
        self.partial = Path(folder) / "partial.tif"

    @property
    def dataset(self) -> xr.Dataset:
        """The result as the Dataset the fingerprint describes."""
        return self.result.to_dataset(name="band_data")

    def exists(self) -> bool:
        """Tell whether the final path holds a file."""
        return self.path.exists()

    def looks_finished(self) -> bool:
        """Tell whether the final path holds a file: only a finished write puts one there."""
        return self.path.is_file()

    def prepare(self, overwrite: bool) -> None:
        """Nothing to do: the final path is replaced only by a complete file."""

    def wipe(self) -> None:
        """Remove a partial file left by an earlier run."""
        self.partial.unlink(missing_ok=True)

    def create(self) -> None:
        """Create ``partial.tif`` with the result's size, CRS, transform and nodata."""
        rasterio = require_rasterio()
        y_dim, x_dim = self.result.dims[-2], self.result.dims[-1]
        # Named spatial dims, so that rioxarray finds the grid under any names (lat/lon).
        result = self.result.rio.set_spatial_dims(x_dim=x_dim, y_dim=y_dim, inplace=False)
        try:
            transform = result.rio.transform(recalc=True)
        except Exception:  # no regular x/y coordinates: pixel space
            transform = rasterio.Affine.identity()
        profile = {
            "driver": "GTiff",
            "height": result.sizes[y_dim],
            "width": result.sizes[x_dim],
            "count": result.sizes[self.band_dims[0]] if self.band_dims else 1,
            "dtype": str(result.dtype),
            "crs": result.rio.crs,
            "transform": transform,
            "nodata": self.nodata,
            "tiled": True,
            "blockxsize": 256,
            "blockysize": 256,
            "BIGTIFF": "IF_SAFER",
        }
        descriptions = result.attrs.get("long_name")
        with rasterio.open(self.partial, "w", **profile) as dst:
            # One name per band (xpatch.io.bands.stack_bands names the outputs it stacks).
            if isinstance(descriptions, tuple | list) and len(descriptions) == profile["count"]:
                for band, text in enumerate(descriptions, start=1):
                    dst.set_band_description(band, str(text))

    def check_readable(self) -> None:
        """Refuse a resume whose partial file is missing or damaged."""
        rasterio = require_rasterio()
        try:
            with rasterio.open(self.partial, "r+"):
                pass
        except Exception as error:
            raise OutputError(
                f"the unfinished GeoTIFF {str(self.partial)!r} of {self.location.name!r} is "
                f"missing or damaged ({error}); start again with overwrite=True (xpatch apply "
                "--restart)."
            ) from None

    def variables(self) -> list[Hashable]:
        """Return the variables that get block markers."""
        return ["band_data"]

    def store_tasks(self, done: set[str]) -> StoreTasks:
        """Return the tasks that write the blocks without a marker."""
        data = self.data
        tasks = StoreTasks(tokenize(data, self.location.name))
        tasks.dependencies.append(data)
        lock = _block_lock(str(self.path), Path(self.record.folder) / "blocks.lock")
        floating = np.issubdtype(data.dtype, np.floating)
        nodata = self.nodata
        fill = nodata if floating and nodata is not None and not np.isnan(nodata) else None
        for index, region in block_regions(data.chunks):
            marker = self.record.marker("band_data", index)
            if marker in done:
                continue
            key = (tasks.name, *index)
            tasks.indices[key] = index
            tasks.tasks[key] = (
                _store_geotiff_block,
                (data.name, *index),
                str(self.partial),
                region[-2:],
                lock,
                marker,
                fill,
            )
        return tasks

    def finish(self) -> None:
        """Move the complete file into place (one atomic rename)."""
        if self.partial.exists():
            os.replace(self.partial, self.path)
        (Path(self.record.folder) / "blocks.lock").unlink(missing_ok=True)

    def tidy(self) -> None:
        """Remove the record's folder once nothing is left in it.

        Only an empty folder goes: another writer may have put its lock there since.
        """
        with contextlib.suppress(OSError):
            os.rmdir(self.record.folder)


_THREAD_LOCK = threading.Lock()


def _block_lock(name: str, path: Path) -> Any:
    """Return a lock that serialises writes to one file across the scheduler's workers.

    distributed's lock on a cluster (its workers may share no filesystem lock);
    otherwise an ``flock`` on a file, which serialises threads and processes alike.
    """
    if active_client() is not None:
        from distributed import Lock

        return Lock(f"xpatch-{name}")
    return FileLock(path)


class FileLock:
    """An exclusive ``flock`` on a file: holds across threads and processes, and pickles.

    Serialises the block writes into one GeoTIFF (GDAL does not write one file from
    several handles at once).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> lock = FileLock(pathlib.Path(tempfile.mkdtemp()) / "demo.lock")
    >>> with lock:
    ...     pass
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._handle: Any = None

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self._handle = None

    def __enter__(self) -> FileLock:
        handle = open(self.path, "a")
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on Unix: serialise threads only
            self._handle = (handle, _THREAD_LOCK)
            _THREAD_LOCK.acquire()
            return self
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._handle = (handle, None)
        return self

    def __exit__(self, *args: object) -> None:
        handle, thread_lock = self._handle
        self._handle = None
        if thread_lock is not None:  # pragma: no cover - not on Unix
            thread_lock.release()
        handle.close()  # closing releases the flock
