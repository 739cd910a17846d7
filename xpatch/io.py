"""Write lazy results out of core, block by block, resumably, safely, with progress.

:func:`write` streams a (dask-backed) DataArray or Dataset to zarr (a local path,
an fsspec URL such as ``s3://bucket/out.zarr``, or a zarr store) or to a tiled
local GeoTIFF, each block as soon as it is ready, and :func:`compute` computes
other results with a progress bar that fits the scheduler.

A write goes through the same steps for both formats (:mod:`xpatch.outputs` says
what each means for a format; :mod:`xpatch.record` keeps the record and the lock):

1. take the output's lock (one writer at a time);
2. read the progress record: none (a new output, or a complete one), ``creating``
   (creation never finished: start again), ``writing`` (resume, if the record's
   fingerprint of the computation matches this one), ``finishing``;
3. create the output, then mark the record ``writing``;
4. write the blocks without a marker, each marker after its block's bytes;
5. mark the record ``finishing``, finish the output (consolidate zarr metadata,
   rename the GeoTIFF into place), delete the record, release the lock.

A kill at any moment leaves a state that the next run continues or refuses with
a message saying what to do. On the local threaded (or synchronous) scheduler and
on a ``dask.distributed`` client the store tasks run in waves of a few blocks
(:mod:`xpatch.waves`), so that peak memory stays at a few blocks whatever the size
of the output; a result whose blocks need distant blocks (``r / r.max()``) and the
process scheduler get one computation.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from xpatch import waves
from xpatch.bands import stack_bands
from xpatch.cf import file_nodata
from xpatch.core.checks import check_choice
from xpatch.core.errors import OptionError, OutputError, OutputExistsError
from xpatch.outputs import (
    GEOTIFF_RECORD_SUFFIX,
    ZARR_RECORD_FOLDER,
    GeoTiffOutput,
    StoreTasks,
    ZarrOutput,
    require_rasterio,
)
from xpatch.provenance import differences, fingerprint
from xpatch.stores import locate
from xpatch.waves import active_client

Format = Literal["auto", "zarr", "geotiff"]
FORMATS = ("auto", "zarr", "geotiff")
GEOTIFF_SUFFIXES = (".tif", ".tiff")


Resume = bool | Literal["force"]


def progress_record(path: str | Path, format: Format = "auto") -> Path:
    """Return the folder of the progress record of the local output ``path``.

    ``path/.xpatch`` inside a zarr store; ``path.xpatch-progress`` beside a GeoTIFF.

    Examples
    --------
    >>> progress_record("seg.zarr").name, progress_record("seg.tif").name
    ('.xpatch', 'seg.tif.xpatch-progress')
    """
    path = Path(path)
    if format == "geotiff" or (format == "auto" and path.suffix.lower() in GEOTIFF_SUFFIXES):
        return path.with_name(path.name + GEOTIFF_RECORD_SUFFIX)
    return path / ZARR_RECORD_FOLDER


def output_format(path: Any, format: Format = "auto") -> Literal["zarr", "geotiff"]:
    """Return the format to write ``path`` in: ``format``, or guessed from the suffix.

    Examples
    --------
    >>> output_format("seg.tif"), output_format("seg.zarr")
    ('geotiff', 'zarr')
    """
    check_choice("format", format, FORMATS)
    if format != "auto":
        return format  # type: ignore[return-value]
    if not isinstance(path, str | Path):
        return "zarr"  # a zarr store object
    suffix = Path(str(path).rstrip("/")).suffix.lower()
    if suffix in GEOTIFF_SUFFIXES:
        return "geotiff"
    if suffix == ".zarr":
        return "zarr"
    raise OptionError(
        f"cannot tell the format of {str(path)!r} from its suffix; name it *.zarr or *.tif, "
        "or pass format='zarr' / format='geotiff'."
    )


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
    client = active_client()
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


def run_store_tasks(tasks: StoreTasks, progress: bool) -> int:
    """Run the store tasks: locally in waves of a few blocks when that pays, else at once."""
    if not tasks.tasks:
        return 0
    name = tasks.name
    final = (name,)
    graph = HighLevelGraph.from_collections(
        name, {**tasks.tasks, final: (sum, list(tasks.tasks))}, dependencies=tasks.dependencies
    )
    client = active_client()
    if client is not None:
        # One computation lets the cluster's scheduler hold many input chunks and
        # partials at once, and workers spill (docs/scale.md); waves bound them.
        # Larger waves than locally: each one is a round trip through the scheduler.
        threads = sum(client.nthreads().values())
        plan = waves.plan_waves(
            dict(graph), tasks.indices, threads=waves.CLUSTER_WAVE_FACTOR * threads
        )
        if plan is not None:
            return waves.run_in_waves(*plan, progress=progress, client=client)
    elif waves.waves_fit_the_scheduler():
        plan = waves.plan_waves(dict(graph), tasks.indices)  # waves cull to the store tasks
        if plan is not None:
            return waves.run_in_waves(*plan, progress=progress)
    # Other graphs and schedulers run as one computation.
    (written,) = compute(Delayed(final, graph, layer=name), progress=progress)
    return int(written)


def _check_resume(resume: Any) -> None:
    if resume not in (True, False, "force") or isinstance(resume, np.bool_):
        raise OptionError(
            f"resume={resume!r} must be True (continue an interrupted run of the same "
            "computation), False (refuse to touch an unfinished run) or 'force' (continue it "
            "even though the computation differs)."
        )


def _refuse_other_run(name: str, layout: list[str], computation: list[str], resume: Resume):
    """Raise if the record's run cannot be continued by this one."""
    if layout:
        raise OutputError(
            f"{name!r} holds an interrupted run whose blocks do not line up with this result: "
            + "; ".join(layout)
            + ". Start again with overwrite=True (xpatch apply --restart), or write elsewhere."
        )
    if computation and resume != "force":
        raise OutputError(
            f"{name!r} holds an interrupted run of another computation: "
            + "; ".join(computation)
            + ". Continuing would mix the two runs' blocks. Start again with overwrite=True "
            "(xpatch apply --restart), or, if you know the results are the same (e.g. only "
            "comments changed), continue with resume='force' (xpatch apply --force-resume)."
        )


def _run(
    output: Any, print_: dict, resume: Resume, overwrite: bool, progress: bool, break_lock: bool
) -> int:
    """Take ``output`` through the steps of a write (see the module docstring)."""
    name = output.location.name
    output.prepare(overwrite)
    output.lock.acquire(break_lock=break_lock)
    try:
        record = None if overwrite else output.record.read()
        if record is None and not overwrite and output.exists():
            if output.looks_finished():
                output.record.remove()  # markers a kill left after the record was deleted
                raise OutputExistsError(
                    f"{name!r} already exists and is complete (it has no progress record of "
                    "an unfinished run); pass overwrite=True (xpatch apply --restart) to "
                    "replace it, or choose another output path."
                )
            raise OutputExistsError(
                f"{name!r} already exists but is not an output that xpatch finished (no "
                "progress record, and its metadata was never consolidated): another program's "
                "data, or an unfinished run whose record was deleted. Pass overwrite=True "
                "(xpatch apply --restart) to replace it, or choose another output path."
            )
        state = "creating" if record is None else record["state"]
        if state != "creating":
            if resume is False:
                raise OutputExistsError(
                    f"{name!r} holds an unfinished run; pass resume=True to continue it, or "
                    "overwrite=True to start again."
                )
            _refuse_other_run(name, *differences(record["fingerprint"], print_), resume=resume)
            if record["fingerprint"] != print_ and state == "writing":
                output.record.write("writing", print_)  # forced: record what runs now
        if state == "creating":
            # A new output, or a creation that never finished: no block was written.
            output.record.write("creating", print_)
            output.wipe()
            output.record.clear_markers()
            try:
                output.create()
            except Exception:
                # Creation failed (a kill instead would leave "creating", redone next time):
                # leave nothing that looks like a run.
                output.wipe()
                output.record.remove()
                raise
            output.record.write("writing", print_)
            state = "writing"
        written = 0
        if state == "writing":
            output.check_readable()
            output.record.prepare_markers(output.variables())
            written = run_store_tasks(output.store_tasks(output.record.done()), progress)
            output.lock.check_held()
            output.record.write("finishing", print_)
        output.finish()
        output.record.remove()
    finally:
        output.lock.release()
        output.tidy()
    return written


def write(
    result: xr.DataArray | xr.Dataset,
    path: Any,
    *,
    format: Format = "auto",
    name: Hashable | None = None,
    resume: Resume = True,
    overwrite: bool = False,
    progress: bool = True,
    nodata: float | None = None,
    storage_options: dict | None = None,
    break_lock: bool = False,
) -> int:
    """Write a (lazy) result to zarr or GeoTIFF block by block; return the blocks written.

    Parameters
    ----------
    result
        What to write, typically ``p.apply(...)`` or ``p.reconstruct(...)``. Dask
        blocks become zarr chunks or GeoTIFF windows. A Dataset (e.g. ``apply``'s
        several outputs) is one zarr store, or one GeoTIFF with a band per
        variable and class (:func:`xpatch.bands.stack_bands`: one exact dtype,
        bands described ``"name"`` or ``"name:class=value"``).
    path
        A local ``*.zarr`` or ``*.tif`` path (or give ``format``); an fsspec URL
        such as ``"s3://bucket/out.zarr"``, ``"gs://..."``, ``"memory://..."`` or
        ``"file://..."`` (zarr only); or a zarr ``LocalStore`` / ``FsspecStore``.
    format
        ``"auto"`` (from the suffix), ``"zarr"`` or ``"geotiff"``.
    name
        Variable name of a DataArray in the zarr store; default its name, or
        ``"data"``.
    resume
        If ``path`` holds an interrupted run, continue it (write only the blocks
        it had not written) when the run's record proves it computed the same
        result: the same input, function, patch layout, output layout and xpatch
        version. A different computation is refused with what differs. ``False``
        refuses any unfinished run; ``"force"`` continues one even though the
        computation differs (the output then mixes both runs: only for changes
        you know do not alter results).
    overwrite
        Replace an existing ``path`` (or an unfinished run in it).
    progress
        Show a progress bar of the blocks written (dask's for a result written as one
        computation).
    nodata
        GeoTIFF only: the nodata value stored in the file; NaN cells of float
        output are written as it. Default: the result's ``_FillValue`` /
        ``nodata`` attribute, else NaN for float output.
    storage_options
        fsspec options for a URL (credentials, ``client_kwargs``...), as in
        xarray's ``to_zarr``.
    break_lock
        Take over the lock of a writer that is gone (killed): one on this
        machine whose process no longer exists, or one elsewhere whose heartbeat
        stopped. A live writer's lock is never taken.

    Returns
    -------
    int
        Number of blocks written by this call (0 if nothing was left to do).

    Raises
    ------
    OutputExistsError
        ``path`` exists (complete, or unfinished with ``resume=False``) and
        ``overwrite`` is False.
    OutputLockedError
        Another writer holds the output's lock (or a killed one left it: see
        ``break_lock``).
    OutputError
        ``path`` holds an unfinished run of another computation, or its record
        or metadata are damaged.

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np, xarray as xr, xpatch
    >>> da = xr.DataArray(np.ones((4, 6)), dims=("y", "x")).chunk(2)
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "ones.zarr"
    >>> xpatch.write(da, out, progress=False)
    6
    >>> xr.open_zarr(out)["data"].shape
    (4, 6)
    >>> xpatch.write(da * 2, "memory://demo/twos.zarr", progress=False)
    6
    """
    _check_resume(resume)
    if isinstance(result, xr.DataArray):
        dataset = result.to_dataset(name=name if name is not None else result.name or "data")
    elif isinstance(result, xr.Dataset):
        dataset = result
    else:
        raise OptionError(
            f"result is a {type(result).__name__}; write takes an xarray DataArray or Dataset."
        )
    kind = output_format(path, format)
    location = locate(path, storage_options)
    if kind == "geotiff":
        if not location.local:
            raise OptionError(
                f"path={location.name!r}: GeoTIFF output is written to a local path (GDAL "
                "writes a tiled file in place); write zarr to an object store, or a local "
                "GeoTIFF and upload it."
            )
        require_rasterio()
        if isinstance(result, xr.Dataset):  # several outputs: a band per output and class
            result = stack_bands(result)
        if nodata is None:
            nodata = file_nodata(result)
        output: Any = GeoTiffOutput(result, location, nodata)
        # As text: NaN would never equal itself after a JSON round trip.
        layout = {"nodata": None if nodata is None else repr(float(nodata))}
        print_ = fingerprint(output.dataset(), "geotiff", layout)
    else:
        nested = [str(n) for n in dataset.variables if "/" in str(n)]
        if nested:
            raise OptionError(
                f"variable names {nested!r} contain '/', which zarr reads as a group path (the "
                "variable would be hidden in a subgroup); rename them, e.g. "
                "result.rename({'a/b': 'a_b'})."
            )
        # Eager variables go through the same block path: counted, resumable, with progress.
        dataset = dataset.copy()
        for var_name, var in dataset.data_vars.items():
            if not isinstance(var.data, da.Array):
                data = da.from_array(np.asarray(var.data), chunks="auto")
                dataset[var_name] = var.copy(data=data)
        output = ZarrOutput(dataset, location)
        print_ = fingerprint(dataset, "zarr", {})
    return _run(output, print_, resume, overwrite, progress, break_lock)
