"""Write lazy results out of core, block by block, resumably, safely, with progress.

:func:`write` streams a (dask-backed) DataArray, Dataset or DataTree to zarr (a local path,
an fsspec URL such as ``s3://bucket/out.zarr``, or a zarr store) or to a tiled
local GeoTIFF, each block as soon as it is ready, and :func:`compute` computes
other results with a progress bar that fits the scheduler.

A write goes through the same steps for both formats (:mod:`xpatch.io.outputs` says
what each means for a format; :mod:`xpatch.io.record` keeps the record and the lock):

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
(:mod:`xpatch.io.block_waves`), so that peak memory stays at a few blocks whatever the size
of the output; a result whose blocks need distant blocks (``r / r.max()``) and the
process scheduler get one computation.

The steps themselves are in :mod:`xpatch.io.steps`; :mod:`xpatch.io.scenes`
writes a mapping of scenes (``ScenePatcher.apply(...)``) into a folder, one output
per scene.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import xarray as xr

from xpatch.io.steps import (
    Format,
    Resume,
    check_resume,
    open_output,
    run_output,
    storage_errors_named,
)


def write(
    result: xr.DataArray | xr.Dataset | xr.DataTree | Mapping[str, xr.DataArray | xr.Dataset],
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
        variable and class (:func:`xpatch.io.geotiff.stack_bands`: one exact dtype,
        bands described ``"name"`` or ``"name:class=value"``). A DataTree
        (``dt.patch(...).apply(...)``) is one zarr store with a group per node, as
        ``DataTree.to_zarr`` writes it (read it back with ``xr.open_datatree(path,
        engine="zarr")``); it has no GeoTIFF form, one GeoTIFF holding one grid. A mapping scene
        name -> result (``ScenePatcher.apply(...)``) writes one output per scene
        into the folder ``path``, resumable as a whole
        (:func:`xpatch.io.scenes.write_scenes`).
    path
        A local ``*.zarr`` or ``*.tif`` path (or give ``format``); an fsspec URL
        such as ``"s3://bucket/out.zarr"``, ``"gs://..."``, ``"memory://..."`` or
        ``"file://..."`` (zarr only); or a zarr ``LocalStore`` / ``FsspecStore``.
        For a mapping of scenes: a folder (local, or an fsspec URL for zarr).
    format
        ``"auto"`` (from the suffix; zarr for a mapping of scenes), ``"zarr"`` or
        ``"geotiff"``.
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
        Also take over the lock of a writer on another machine whose heartbeat
        stopped (it may still run behind a network partition). The lock of a
        writer of this machine whose process no longer exists is taken over
        without it, with a warning naming it. A live writer's lock is never taken.

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
        Another writer holds the output's lock (or one on another machine
        stopped beating: see ``break_lock``).
    OutputError
        ``path`` holds an unfinished run of another computation, or its record
        or metadata are damaged, or its device is full (the same call resumes
        once there is room), or an object store found no credentials.

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
    with storage_errors_named(path, storage_options):
        # A DataTree is a Mapping too, but one output: a zarr group per node.
        if isinstance(result, Mapping) and not isinstance(result, xr.Dataset | xr.DataTree):
            # Imported here: xpatch.io.scenes drives the same steps, per scene.
            from xpatch.io.scenes import write_scenes

            return write_scenes(
                result,
                path,
                format=format,
                name=name,
                resume=resume,
                overwrite=overwrite,
                progress=progress,
                nodata=nodata,
                storage_options=storage_options,
                break_lock=break_lock,
            )
        check_resume(resume)
        output, print_ = open_output(
            result, path, format=format, name=name, nodata=nodata, storage_options=storage_options
        )
        return run_output(output, print_, resume, overwrite, progress, break_lock)
