"""Write lazy results out of core, block by block, resumably, with progress.

:func:`write` streams a (dask-backed) DataArray or Dataset to zarr or to a tiled
GeoTIFF, each block as soon as it is ready, and :func:`compute` computes other
results with a progress bar that fits the scheduler. This module owns the output
formats, the progress record and the choice of how the store tasks run. On the
local threaded (or synchronous) scheduler they run in waves of a few blocks
(:mod:`xpatch.waves`), so that for results whose blocks follow the patch layout
(``p.apply(...)``, ``p.reconstruct(...)``, renamed, transposed or combined
pointwise) each patch is computed once and peak memory stays at a few blocks,
their patch groups and one row of overhangs, whatever the size of the output. A
result whose blocks need distant blocks (``r / r.max()``), the process scheduler
and ``dask.distributed`` (whose memory management applies) get one computation.
A progress record beside the output (``<output>.xpatch-progress/``) lists the
blocks written; a run that was interrupted and is started again redoes only the
others. The record is removed when the output is complete.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import warnings
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from xpatch import waves
from xpatch.cf import file_nodata
from xpatch.core.checks import check_choice
from xpatch.core.errors import OptionError
from xpatch.core.plan import block_regions
from xpatch.waves import STORE_TASK_PREFIX

Format = Literal["auto", "zarr", "geotiff"]
FORMATS = ("auto", "zarr", "geotiff")
GEOTIFF_SUFFIXES = (".tif", ".tiff")


def progress_record(path: str | Path) -> Path:
    """Return the folder that records which blocks of ``path`` are written."""
    path = Path(path)
    return path.with_name(path.name + ".xpatch-progress")


def output_format(path: str | Path, format: Format = "auto") -> Literal["zarr", "geotiff"]:
    """Return the format to write ``path`` in: ``format``, or guessed from the suffix.

    Examples
    --------
    >>> output_format("seg.tif"), output_format("seg.zarr")
    ('geotiff', 'zarr')
    """
    check_choice("format", format, FORMATS)
    if format != "auto":
        return format  # type: ignore[return-value]
    suffix = Path(path).suffix.lower()
    if suffix in GEOTIFF_SUFFIXES:
        return "geotiff"
    if suffix == ".zarr":
        return "zarr"
    raise OptionError(
        f"cannot tell the format of {str(path)!r} from its suffix; name it *.zarr or *.tif, "
        "or pass format='zarr' / format='geotiff'."
    )


def _active_client() -> Any:
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:
        return None


def compute(*collections: Any, progress: bool = True) -> tuple:
    """``dask.compute`` with a progress bar that fits the scheduler.

    On a ``dask.distributed`` client (if one is active) the futures run on the
    cluster with distributed's progress bar; otherwise dask's local scheduler
    runs them under :class:`dask.diagnostics.ProgressBar`.

    Examples
    --------
    >>> import dask.array as da
    >>> compute(da.ones(4, chunks=2).sum(), progress=False)
    (np.float64(4.0),)
    """
    client = _active_client()
    if client is not None:
        futures = client.compute(list(collections))
        if progress:
            from distributed import progress as distributed_progress

            distributed_progress(futures)
        return tuple(client.gather(futures))
    if progress:
        from dask.diagnostics import ProgressBar

        with ProgressBar(dt=0.5):
            return dask.compute(*collections)
    return dask.compute(*collections)


def _marker(record: Path, name: Hashable, index: Sequence[int]) -> Path:
    return record / "done" / f"{name}.{'.'.join(map(str, index))}"


def _store_block(block: np.ndarray, target: Any, region: tuple, marker: str) -> int:
    target[region] = block
    Path(marker).touch()
    return 1


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


def _plan(dataset: xr.Dataset) -> dict:
    """Describe what a progress record must match for a resumed run to continue it."""
    return {
        str(name): {
            "dims": [str(d) for d in var.dims],
            "shape": list(var.shape),
            "dtype": str(var.dtype),
            "chunks": [list(c) for c in var.chunks] if var.chunks else None,
        }
        for name, var in dataset.data_vars.items()
    }


def _start(path: Path, plan: dict, resume: bool, overwrite: bool) -> tuple[Path, bool]:
    """Prepare the progress record; return it and whether the output must be created."""
    record = progress_record(path)
    if path.exists() and record.exists() and resume and not overwrite:
        saved = json.loads((record / "plan.json").read_text())
        if saved != plan:
            raise OptionError(
                f"{str(path)!r} holds an interrupted run of a different result (shape, chunks "
                "or dtype differ); pass overwrite=True to start again, or write elsewhere."
            )
        return record, False
    if path.exists() and not overwrite:
        if record.exists():
            raise FileExistsError(
                f"{str(path)!r} holds an unfinished run; pass resume=True to continue it, or "
                "overwrite=True to start again."
            )
        raise FileExistsError(
            f"{str(path)!r} already exists and has no progress record of an unfinished run; "
            "pass overwrite=True to replace it, or choose another output path."
        )
    for stale in (path, record):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    (record / "done").mkdir(parents=True)
    (record / "plan.json").write_text(json.dumps(plan))
    return record, True


@contextlib.contextmanager
def _removed_on_failure(path: Path, record: Path) -> Iterator[None]:
    """Remove a half-created output and its record if creating it fails.

    Otherwise a retry would find a record of a run that never wrote a block.
    """
    try:
        yield
    except BaseException:
        for leftover in (path, record):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            elif leftover.exists():
                leftover.unlink()
        raise


_THREAD_LOCK = threading.Lock()


def _finish(tasks: dict, indices: dict, name: str, dependencies: list, progress: bool) -> int:
    """Run the store tasks: locally in waves of a few blocks when that pays, else at once."""
    if not tasks:
        return 0
    final = (name,)
    graph = HighLevelGraph.from_collections(
        name, {**tasks, final: (sum, list(tasks))}, dependencies=dependencies
    )
    if _active_client() is None and waves.waves_fit_the_scheduler():
        plan = waves.plan_waves(dict(graph), indices)  # waves cull to the store tasks
        if plan is not None:
            return waves.run_in_waves(*plan, progress=progress)
    # A cluster manages its workers' memory (limits, spilling); other graphs and
    # schedulers run as one computation.
    (written,) = compute(Delayed(final, graph, layer=name), progress=progress)
    return int(written)


def write(
    result: xr.DataArray | xr.Dataset,
    path: str | Path,
    *,
    format: Format = "auto",
    name: Hashable | None = None,
    resume: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    nodata: float | None = None,
) -> int:
    """Write a (lazy) result to zarr or GeoTIFF block by block; return the blocks written.

    Parameters
    ----------
    result
        What to write, typically ``p.apply(...)`` or ``p.reconstruct(...)``. Dask
        blocks become zarr chunks or GeoTIFF windows.
    path
        ``*.zarr`` or ``*.tif`` (or give ``format``).
    format
        ``"auto"`` (from the suffix), ``"zarr"`` or ``"geotiff"``.
    name
        Variable name of a DataArray in the zarr store; default its name, or
        ``"data"``.
    resume
        If ``path`` holds an interrupted run of the same result (its progress
        record exists), write only the blocks it had not written.
    overwrite
        Replace an existing ``path``.
    progress
        Show a progress bar (dask's locally, distributed's on a cluster).
    nodata
        GeoTIFF only: the nodata value stored in the file; NaN cells of float
        output are written as it. Default: the result's ``_FillValue`` /
        ``nodata`` attribute, else NaN for float output.

    Returns
    -------
    int
        Number of blocks written by this call (0 if nothing was left to do).

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np, xarray as xr, xpatch
    >>> da = xr.DataArray(np.ones((4, 6)), dims=("y", "x")).chunk(2)
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "ones.zarr"
    >>> xpatch.write(da, out, progress=False)
    6
    >>> xr.open_zarr(out)["data"].shape
    (4, 6)
    """
    if isinstance(result, xr.DataArray):
        dataset = result.to_dataset(name=name if name is not None else result.name or "data")
    elif isinstance(result, xr.Dataset):
        dataset = result
    else:
        raise OptionError(
            f"result is a {type(result).__name__}; write takes an xarray DataArray or Dataset."
        )
    kind = output_format(path, format)
    path = Path(path)
    if kind == "geotiff":
        return _write_geotiff(result, path, resume, overwrite, progress, nodata)
    # Eager variables go through the same block path: counted, resumable, with progress.
    dataset = dataset.copy()
    for var_name, var in dataset.data_vars.items():
        if not isinstance(var.data, da.Array):
            dataset[var_name] = var.copy(data=da.from_array(np.asarray(var.data), chunks="auto"))
    plan = _plan(dataset)
    record, create = _start(path, plan, resume, overwrite)
    if create:
        with _removed_on_failure(path, record):
            dataset.to_zarr(path, mode="w", compute=False, consolidated=False)
    import zarr

    group = zarr.open_group(str(path), mode="r+")
    tasks: dict = {}
    indices: dict = {}
    dependencies = []
    token = tokenize(dataset, str(path))
    # Data variables, and coordinates backed by dask, which to_zarr(compute=False)
    # leaves unwritten.
    for var_name, var in dataset.variables.items():
        data = var.data
        if not isinstance(data, da.Array):
            continue
        dependencies.append(data)
        target = group[str(var_name)]
        for index, region in block_regions(data.chunks):
            marker = _marker(record, var_name, index)
            if marker.exists():
                continue
            indices[(f"{STORE_TASK_PREFIX}{token}", str(var_name), *index)] = index
            tasks[(f"{STORE_TASK_PREFIX}{token}", str(var_name), *index)] = (
                _store_block,
                (data.name, *index),
                target,
                region,
                str(marker),
            )
    written = _finish(tasks, indices, f"{STORE_TASK_PREFIX}{token}", dependencies, progress)
    with warnings.catch_warnings():
        # zarr 3 notes that consolidated metadata is not in its spec yet; xarray reads it.
        warnings.simplefilter("ignore", UserWarning)
        zarr.consolidate_metadata(str(path))
    shutil.rmtree(record)
    return written


def _write_geotiff(
    result: xr.DataArray | xr.Dataset,
    path: Path,
    resume: bool,
    overwrite: bool,
    progress: bool,
    nodata: float | None,
) -> int:
    try:
        import rasterio
        import rioxarray  # noqa: F401  (registers .rio)
    except ImportError:
        raise ImportError(
            "writing GeoTIFF needs rioxarray and rasterio: pip install 'xarray-patch[geo]'."
        ) from None
    if not isinstance(result, xr.DataArray) or result.ndim not in (2, 3):
        raise OptionError(
            "GeoTIFF holds one 2-D or 3-D (band, y, x) DataArray; write a Dataset, or arrays "
            "with more dims, to zarr instead."
        )
    y_dim, x_dim = result.rio.y_dim, result.rio.x_dim
    band_dims = [d for d in result.dims if d not in (y_dim, x_dim)]
    result = result.transpose(*band_dims, y_dim, x_dim)
    data = result.data if isinstance(result.data, da.Array) else da.from_array(result.data)
    data = data.rechunk({0: -1} if band_dims else {})
    if nodata is None:
        nodata = file_nodata(result)
    plan = _plan(result.to_dataset(name="band_data"))
    record, create = _start(path, plan, resume, overwrite)
    if create:
        crs = result.rio.crs
        try:
            transform = result.rio.transform(recalc=True)
        except Exception:  # no regular x/y coordinates: pixel space
            transform = rasterio.Affine.identity()
        profile = {
            "driver": "GTiff",
            "height": result.sizes[y_dim],
            "width": result.sizes[x_dim],
            "count": result.sizes[band_dims[0]] if band_dims else 1,
            "dtype": str(result.dtype),
            "crs": crs,
            "transform": transform,
            "nodata": nodata,
            "tiled": True,
            "blockxsize": 256,
            "blockysize": 256,
            "BIGTIFF": "IF_SAFER",
        }
        with _removed_on_failure(path, record), rasterio.open(path, "w", **profile):
            pass
    lock = _write_lock(str(path), record)
    token = tokenize(data, str(path))
    indices: dict = {}
    floating = np.issubdtype(result.dtype, np.floating)
    fill = nodata if floating and nodata is not None and not np.isnan(nodata) else None
    tasks: dict = {}
    for index, region in block_regions(data.chunks):
        marker = _marker(record, "band_data", index)
        if marker.exists():
            continue
        indices[(f"{STORE_TASK_PREFIX}{token}", *index)] = index
        tasks[(f"{STORE_TASK_PREFIX}{token}", *index)] = (
            _store_geotiff_block,
            (data.name, *index),
            str(path),
            region[-2:],
            lock,
            str(marker),
            fill,
        )
    written = _finish(tasks, indices, f"{STORE_TASK_PREFIX}{token}", [data], progress)
    shutil.rmtree(record)
    return written


def _write_lock(name: str, record: Path) -> Any:
    """Return a lock that serialises writes to one file across the scheduler's workers.

    distributed's lock on a cluster; otherwise a lock file in the progress record,
    which serialises threads and processes alike.
    """
    if _active_client() is not None:
        from distributed import Lock

        return Lock(f"xpatch-{name}")
    return FileLock(record / "write.lock")


class FileLock:
    """An exclusive ``flock`` on a file: holds across threads and processes, and pickles.

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
