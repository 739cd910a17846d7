"""The two output formats of :func:`xpatch.write`: what each step means for zarr and GeoTIFF.

:mod:`xpatch.io` drives a write through the same steps for both formats (lock,
record, create, write blocks, finish); an output class here says what each step
does to its format:

- :class:`ZarrOutput` writes into a zarr store, local or on an object store. Its
  record and lock live inside the store (``out.zarr/.xpatch/``), which zarr
  ignores. Creation is ``to_zarr(compute=False)``; finishing consolidates the
  metadata. Every key zarr writes is replaced atomically (a rename locally, one
  ``PUT`` on an object store).
- :class:`GeoTiffOutput` writes a tiled GeoTIFF on the local filesystem. Blocks go
  into ``partial.tif`` in the record's folder (``out.tif.xpatch-progress/``), and
  finishing renames it to ``out.tif``: the final path holds a complete file or
  nothing (or the previous complete file, until the new one replaces it).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from xpatch.core.errors import MissingDependencyError, OutputError, OutputExistsError
from xpatch.core.plan import block_regions
from xpatch.record import ProgressRecord, WriterLock, read_bytes, write_marker
from xpatch.stores import Location
from xpatch.waves import STORE_TASK_PREFIX, active_client

#: Folder of the progress record inside a zarr store.
ZARR_RECORD_FOLDER = ".xpatch"
#: Suffix of the progress record's folder beside a GeoTIFF.
GEOTIFF_RECORD_SUFFIX = ".xpatch-progress"


class StoreTasks:
    """The store tasks of the blocks still to write, ready for :func:`xpatch.io.run_store_tasks`.

    Attributes
    ----------
    name
        The graph layer's name.
    tasks
        Store task key -> task.
    indices
        Store task key -> the index of the block it writes (for the waves).
    dependencies
        The dask arrays the tasks read.
    """

    def __init__(self, token: str) -> None:
        self.name = f"{STORE_TASK_PREFIX}{token}"
        self.tasks: dict = {}
        self.indices: dict = {}
        self.dependencies: list = []


def wave_order(dataset: Any) -> Any:
    """Return ``order(dims, index)``: a block's place in the write's waves.

    The index is taken along every dim of ``dataset`` (0 where a variable lacks
    one), the dims most variables share first: the blocks of several variables
    over the same region (the outputs of one ``apply``, which share their patch
    groups) are then written in the same wave, and each group is computed once.
    One data variable keeps the order of its block indices.

    Examples
    --------
    >>> import xarray as xr, numpy as np
    >>> ds = xr.Dataset({"a": (("c", "y"), np.zeros((2, 3))), "b": ("y", np.zeros(3))})
    >>> order = wave_order(ds)
    >>> order(("c", "y"), (0, 2)), order(("y",), (2,))
    ((2, 0), (2, 0))
    """
    shared: dict = {}
    for var in dataset.data_vars.values():
        for dim in var.dims:
            shared[dim] = shared.get(dim, 0) + 1
    for dim in dataset.dims:
        shared.setdefault(dim, 0)
    dims = sorted(shared, key=lambda d: -shared[d])  # stable: first seen first among ties

    def order(var_dims: tuple, index: tuple) -> tuple:
        where = dict(zip(var_dims, index))
        return tuple(where.get(d, 0) for d in dims)

    return order


@contextlib.contextmanager
def _record_ignored() -> Any:
    """Silence zarr's notice that the record's folder is not part of the hierarchy."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=f"Object at {ZARR_RECORD_FOLDER} is not recognized",
            category=UserWarning,
        )
        # zarr 3 notes that consolidated metadata is not in its spec yet; xarray reads it.
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        yield


def _store_zarr_block(block: np.ndarray, target: Any, region: tuple, fs: Any, marker: str) -> int:
    target[region] = block
    write_marker(fs, marker)  # after the bytes: a marker means the block is stored
    return 1


class ZarrOutput:
    """A zarr output at ``location``: a group holding ``dataset``'s variables."""

    def __init__(self, dataset: xr.Dataset, location: Location) -> None:
        self.dataset = dataset
        self.location = location
        folder = location.join(ZARR_RECORD_FOLDER)
        self.record = ProgressRecord(location.fs, folder, location.name)
        self.lock = WriterLock(location.fs, folder, location.name)
        self.store = location.zarr_store()

    def _entries(self) -> list[str]:
        fs = self.location.fs
        try:
            entries = fs.ls(self.location.root, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return [self.location.root] if fs.isfile(self.location.root) else []
        return [e for e in entries if e.rstrip("/").rsplit("/", 1)[-1] != ZARR_RECORD_FOLDER]

    def exists(self) -> bool:
        """Tell whether the store holds anything besides the record."""
        return bool(self._entries())

    def looks_finished(self) -> bool:
        """Tell whether the store's metadata was consolidated, as a finished write does."""
        data = read_bytes(self.location.fs, self.location.join("zarr.json"))
        try:
            return bool(json.loads(data or b"{}").get("consolidated_metadata"))
        except (ValueError, AttributeError):  # not JSON, or not an object
            return False

    def prepare(self, overwrite: bool) -> None:
        """Make room for the record: a plain file at the output's path is not a store."""
        fs, root = self.location.fs, self.location.root
        if fs.isfile(root):
            if not overwrite:
                raise OutputExistsError(
                    f"{self.location.name!r} is a file, not a zarr store; pass overwrite=True "
                    "to replace it, or choose another output path."
                )
            fs.rm_file(root)

    def wipe(self) -> None:
        """Remove everything in the store but the record (and the lock it holds)."""
        for entry in self._entries():
            self.location.fs.rm(entry, recursive=True)

    def create(self) -> None:
        """Write the metadata and the eager variables; dask-backed ones are allocated."""
        # mode="a": the store already holds the record and lock, which "w-" would refuse
        # and "w" would delete.
        with _record_ignored():
            self.dataset.to_zarr(self.store, mode="a", compute=False, consolidated=False)

    def check_readable(self) -> None:
        """Refuse a resume whose zarr metadata is missing or damaged."""
        import zarr

        try:
            with _record_ignored():
                group = zarr.open_group(self.store, mode="r+")
                for var_name in self.dataset.variables:
                    group[str(var_name)]
        except Exception as error:  # zarr raises KeyError, JSON and format errors alike
            raise OutputError(
                f"the zarr metadata of {self.location.name!r} is missing or damaged "
                f"({type(error).__name__}: {error}); its blocks cannot be resumed. Start again "
                "with overwrite=True (xpatch apply --restart)."
            ) from None

    def store_tasks(self, done: set[str]) -> StoreTasks:
        """Return the tasks that write the blocks without a marker."""
        import zarr

        group = zarr.open_group(self.store, mode="r+")
        tasks = StoreTasks(tokenize(self.dataset, self.location.name))
        fs = self.location.fs
        order = wave_order(self.dataset)
        # Data variables, and coordinates backed by dask, which to_zarr(compute=False)
        # leaves unwritten.
        for var_name, var in self.dataset.variables.items():
            data = var.data
            if not isinstance(data, da.Array):
                continue
            tasks.dependencies.append(data)
            target = group[str(var_name)]
            for index, region in block_regions(data.chunks):
                marker = self.record.marker(var_name, index)
                if marker in done:
                    continue
                key = (tasks.name, str(var_name), *index)
                tasks.indices[key] = order(var.dims, index)
                tasks.tasks[key] = (
                    _store_zarr_block,
                    (data.name, *index),
                    target,
                    region,
                    fs,
                    marker,
                )
        return tasks

    def variables(self) -> list[Hashable]:
        """Return the variables that get block markers."""
        return [n for n, v in self.dataset.variables.items() if isinstance(v.data, da.Array)]

    def finish(self) -> None:
        """Consolidate the metadata, so that readers open the store with one read."""
        import zarr

        with _record_ignored():
            zarr.consolidate_metadata(self.store)

    def tidy(self) -> None:
        """Remove empty folders: the record's, and the store's if creation failed.

        Object stores have no folders; local ones keep them after their files go.
        """
        if self.location.local:
            for folder in (self.record.folder, self.location.root):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
        elif "memory" in self.location.fs.protocol:
            # fsspec's memory filesystem keeps empty folders too.
            with contextlib.suppress(OSError):
                self.location.fs.rmdir(self.record.folder)


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


class GeoTiffOutput:
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
        from xpatch.geo import geotiff_layout

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

    def dataset(self) -> xr.Dataset:
        """Return the result as the Dataset the fingerprint describes."""
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
            # One name per band (xpatch.bands.stack_bands names the outputs it stacks).
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
