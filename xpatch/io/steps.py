"""The steps of one output's write, which :func:`xpatch.write` drives (see :mod:`xpatch.io.writer`).

:func:`open_output` turns a result and a path into an output (:mod:`xpatch.io.outputs`)
and the fingerprint of its computation (:mod:`xpatch.xarray.provenance`), raising before
anything is written; :func:`run_output` takes the output through the steps of a
write (lock, record, create, blocks, finish); :func:`output_status` tells what an
output's path holds without taking its lock. :mod:`xpatch.io.scenes` uses them
to write one output per scene into a folder.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, Literal

import dask
import numpy as np
import xarray as xr
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.checks import check_choice
from xpatch.core.errors import OptionError, OutputError, OutputExistsError, warn
from xpatch.io import block_waves
from xpatch.io.block_waves import active_client
from xpatch.io.geotiff import GEOTIFF_RECORD_SUFFIX, GeoTiffOutput, require_rasterio, stack_bands
from xpatch.io.location import locate
from xpatch.io.outputs import (
    ZARR_RECORD_FOLDER,
    Output,
    StoreTasks,
    ZarrOutput,
    group_variable,
    tree_groups,
    zarr_chunked,
)
from xpatch.xarray.encoding import file_nodata
from xpatch.xarray.provenance import differences, fingerprint

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
        plan = block_waves.plan_waves(
            dict(graph), tasks.indices, threads=block_waves.CLUSTER_WAVE_FACTOR * threads
        )
        if plan is not None:
            return block_waves.run_in_waves(*plan, progress=progress, client=client)
    elif block_waves.waves_fit_the_scheduler():
        plan = block_waves.plan_waves(dict(graph), tasks.indices)  # waves cull to the store tasks
        if plan is not None:
            return block_waves.run_in_waves(*plan, progress=progress)
    # Other graphs and schedulers run as one computation.
    (written,) = compute(Delayed(final, graph, layer=name), progress=progress)
    return int(written)


def check_resume(resume: Any) -> None:
    """Raise :class:`OptionError` unless ``resume`` is True, False or ``"force"``.

    Examples
    --------
    >>> check_resume("force")
    """
    if resume not in (True, False, "force") or isinstance(resume, np.bool_):
        raise OptionError(
            f"resume={resume!r} must be True (continue an interrupted run of the same "
            "computation), False (refuse to touch an unfinished run) or 'force' (continue it "
            "even though the computation differs)."
        )


def refuse_other_run(name: str, layout: list[str], computation: list[str], resume: Resume) -> None:
    """Raise :class:`OutputError` if a record's run cannot be continued by this one.

    ``layout`` and ``computation`` are what :func:`xpatch.xarray.provenance.differences`
    found between the record's fingerprint and this run's.

    Examples
    --------
    >>> refuse_other_run("a.zarr", [], ["xpatch's version"], resume="force")
    """
    if layout:
        raise OutputError(
            f"{name!r} holds an interrupted run whose blocks do not line up with this result: "
            + "; ".join(layout)
            + ". The blocks are the input's chunks, or smaller working blocks where a task "
            "would pass task_memory: resume with the interrupted run's chunks and "
            "task_memory (xpatch apply --chunks, --task-memory), start again with "
            "overwrite=True (xpatch apply --restart), or write elsewhere."
        )
    if computation and resume != "force":
        raise OutputError(
            f"{name!r} holds an interrupted run of another computation: "
            + "; ".join(computation)
            + ". Continuing would mix the two runs' blocks. Start again with overwrite=True "
            "(xpatch apply --restart), or, if you know the results are the same (e.g. only "
            "comments changed), continue with resume='force' (xpatch apply --force-resume)."
        )


def wrote_nothing(output: Output) -> bool:
    """Whether the run its record describes wrote no block: no marker says one is stored."""
    return not output.record.done()


#: Errors of object-store clients that mean "no credentials found" (botocore's names).
CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")

#: Errors that mean "the store's server cannot be reached": the builtin ConnectionError,
#: botocore's (EndpointConnectionError, ConnectTimeoutError...), aiohttp's, a failed DNS
#: lookup. Matched by name in the error's classes: the libraries are optional.
CONNECTION_ERRORS = ("ConnectionError", "ClientConnectorError", "ServerTimeoutError", "gaierror")


def endpoint_of(error: BaseException, storage_options: dict | None) -> str | None:
    """Return the URL that ``error`` failed to reach: botocore names it, else the options'.

    Examples
    --------
    >>> endpoint_of(ConnectionRefusedError(), {"client_kwargs": {"endpoint_url": "http://h:9"}})
    'http://h:9'
    >>> endpoint_of(ConnectionRefusedError(), None) is None
    True
    """
    named = getattr(error, "kwargs", None)
    if isinstance(named, dict) and named.get("endpoint_url"):
        return str(named["endpoint_url"])
    options = storage_options or {}
    client = options.get("client_kwargs") or {}
    endpoint = options.get("endpoint_url") or (
        client.get("endpoint_url") if isinstance(client, dict) else None
    )
    return None if endpoint is None else str(endpoint)


@contextlib.contextmanager
def storage_errors_named(path: Any, storage_options: dict | None = None) -> Iterator[None]:
    """Turn a full disk, missing credentials or an unreachable store into an :class:`OutputError`.

    All come from deep inside the store's library, naming no output and no fix
    (an unreachable endpoint as a traceback of botocore's retries). A full disk
    stops the write where the space ran out; its record says which blocks are
    stored, so the same call resumes once there is room, as it does once the
    store can be reached. ``storage_options`` (those of the write) tell which
    endpoint was asked for when the error does not.
    """
    try:
        yield
    except Exception as error:
        where = str(path)
        first_line = (str(error).splitlines() or [repr(error)])[0]
        cause = f"({type(error).__name__}: {first_line})"
        if any(cls.__name__ in CONNECTION_ERRORS for cls in type(error).__mro__):
            endpoint = endpoint_of(error, storage_options)
            at = f" at {endpoint!r}" if endpoint else ""
            raise OutputError(
                f"cannot write {where!r}: its store cannot be reached{at} {cause}. Check the "
                "URL and the endpoint (storage_options={'client_kwargs': {'endpoint_url': "
                "...}}, xpatch apply --storage-options), that the server runs and that this "
                "machine reaches it; then run the same call again: blocks already written are "
                "kept."
            ) from error
        if any(cls.__name__ in CREDENTIAL_ERRORS for cls in type(error).__mro__):
            raise OutputError(
                f"cannot write {where!r}: the object store found no credentials {cause}. "
                "Set them where its client looks (for S3: AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), or pass them as "
                "storage_options={'key': ..., 'secret': ...} (xpatch apply "
                "--storage-options); a public bucket reads with {'anon': True}."
            ) from error
        full = (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or (
            "No space left on device" in str(error) or "Disk quota exceeded" in str(error)
        )
        if not full:
            raise
        free = ""
        with contextlib.suppress(OSError, ValueError, TypeError):
            folder = Path(where)
            while not folder.exists():
                folder = folder.parent
            free = f" ({shutil.disk_usage(folder).free / 2**20:.1f} MiB free there now)"
        raise OutputError(
            f"no space left on the device of {where!r}{free} {cause}. Free some space, or "
            "write elsewhere; then run the same call again: the blocks already written are "
            "kept and the write resumes."
        ) from error


def run_output(
    output: Any, print_: dict, resume: Resume, overwrite: bool, progress: bool, break_lock: bool
) -> int:
    """Take ``output`` through the steps of a write (:mod:`xpatch.io.writer`); return its blocks.

    Parameters
    ----------
    output
        An output of :func:`open_output`.
    print_
        Its fingerprint, from :func:`open_output`.
    resume, overwrite, progress, break_lock
        As for :func:`xpatch.write`.

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np, xarray as xr
    >>> da = xr.DataArray(np.ones((4, 6)), dims=("y", "x")).chunk(2)
    >>> output, print_ = open_output(da, pathlib.Path(tempfile.mkdtemp()) / "a.zarr")
    >>> run_output(output, print_, True, False, False, False)
    6
    """
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
        if state == "writing" and record["fingerprint"] != print_ and wrote_nothing(output):
            # A run that failed before its first block protects nothing: start over.
            warn(
                f"{name!r}: the earlier run wrote no block before it stopped; starting over "
                "with this computation."
            )
            state = "creating"
        if state != "creating":
            if resume is False:
                raise OutputExistsError(
                    f"{name!r} holds an unfinished run; pass resume=True to continue it, or "
                    "overwrite=True to start again."
                )
            refuse_other_run(name, *differences(record["fingerprint"], print_), resume=resume)
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


def open_output(
    result: xr.DataArray | xr.Dataset | xr.DataTree,
    path: Any,
    *,
    format: Format = "auto",
    name: Hashable | None = None,
    nodata: float | None = None,
    storage_options: dict | None = None,
) -> tuple[Output, dict]:
    """Return the output that :func:`xpatch.write` would write ``result`` to, and its fingerprint.

    Nothing is written or computed: every problem with the arguments is raised
    here. The arguments are :func:`xpatch.write`'s.

    Returns
    -------
    output : ZarrOutput or GeoTiffOutput
        What :func:`run_output` writes.
    fingerprint : dict
        What the output's record (or a manifest of scenes) keeps to prove that
        a later run is the same computation (:func:`xpatch.xarray.provenance.fingerprint`).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> da = xr.DataArray(np.ones((4, 6)), dims=("y", "x")).chunk(2)
    >>> output, print_ = open_output(da, "memory://demo/open.zarr")
    >>> type(output).__name__, print_["format"], sorted(print_["variables"])
    ('ZarrOutput', 'zarr', ['data'])
    """
    if isinstance(result, xr.DataTree):
        return open_tree_output(result, path, format, storage_options)
    if isinstance(result, xr.DataArray):
        dataset = result.to_dataset(name=name if name is not None else result.name or "data")
    elif isinstance(result, xr.Dataset):
        dataset = result
    else:
        raise OptionError(
            f"result is a {type(result).__name__}; write takes an xarray DataArray, Dataset "
            "or DataTree (or a mapping scene name -> DataArray/Dataset, written into a folder)."
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
        output: Output = GeoTiffOutput(result, location, nodata)
        # As text: NaN would never equal itself after a JSON round trip.
        layout = {"nodata": None if nodata is None else repr(float(nodata))}
        return output, fingerprint(output.dataset, "geotiff", layout)
    dataset = zarr_blocks(dataset)
    return ZarrOutput(dataset, location), fingerprint(dataset, "zarr", {})


def zarr_blocks(dataset: xr.Dataset) -> xr.Dataset:
    """Return ``dataset`` as a zarr write takes it: every data variable lazy, in zarr's chunks.

    Raises
    ------
    OptionError
        If a variable's name holds ``/`` (zarr would read it as a group path).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> zarr_blocks(xr.Dataset({"v": ("x", np.zeros(4))}))["v"].chunks
    ((4,),)
    """
    nested = [str(n) for n in dataset.variables if "/" in str(n)]
    if nested:
        raise OptionError(
            f"variable names {nested!r} contain '/', which zarr reads as a group path (the "
            "variable would be hidden in a subgroup); rename them, e.g. "
            "result.rename({'a/b': 'a_b'})."
        )
    import dask.array as da

    # Eager variables go through the same block path: counted, resumable, with progress.
    dataset = dataset.copy()
    for var_name, var in dataset.data_vars.items():
        if not isinstance(var.data, da.Array):
            data = da.from_array(np.asarray(var.data), chunks="auto")
            dataset[var_name] = var.copy(data=data)
    # Ragged dask blocks (a ragged input's chunks) become regular zarr chunks.
    return zarr_chunked(dataset)


def open_tree_output(
    tree: xr.DataTree, path: Any, format: Format, storage_options: dict | None
) -> tuple[Output, dict]:
    """Return the zarr output of a DataTree (one group per node) and its fingerprint.

    What :func:`open_output` does for a DataTree; each node's variables are made
    ready as a Dataset's are (:func:`zarr_blocks`), and the fingerprint names
    each variable by its path from the root (``"10m/b02"``).

    Raises
    ------
    OptionError
        If ``path`` or ``format`` asks for a GeoTIFF: one GeoTIFF holds one grid.
    """
    kind = output_format(path, format)
    groups = tree_groups(tree)
    if kind == "geotiff":
        gridded = [group or "/" for group, ds in groups.items() if ds.data_vars]
        raise OptionError(
            f"result is a DataTree of {len(gridded)} node(s) with data ({gridded}) and "
            f"path={str(path)!r} is a GeoTIFF, which holds one grid: write the tree to zarr "
            "(a path ending in .zarr, or format='zarr'), one group per node, or write each "
            "node to its own GeoTIFF, e.g. xpatch.write(tree['/10m'].to_dataset(), '10m.tif')."
        )
    location = locate(path, storage_options)
    ready = {group: zarr_blocks(ds) for group, ds in groups.items()}
    tree = xr.DataTree.from_dict({f"/{group}": ds for group, ds in ready.items()}, name=tree.name)
    prints = {group: fingerprint(ds, "zarr", {}) for group, ds in ready.items()}
    print_ = {
        **prints[""],
        "layout": {"groups": sorted(ready)},
        "variables": {
            group_variable(group, name): facts
            for group, one in prints.items()
            for name, facts in one["variables"].items()
        },
    }
    return ZarrOutput(tree, location), print_


OutputStatus = Literal["absent", "complete", "unfinished", "foreign"]


def output_status(output: Output) -> OutputStatus:
    """Tell what an output's path holds, from its record and files, without its lock.

    Returns
    -------
    str
        ``"unfinished"``: a progress record (a run to resume, or to finish);
        ``"complete"``: no record, and an output that a finished write left
        (consolidated zarr metadata, a GeoTIFF at the final path);
        ``"foreign"``: no record, and something that is not a finished output;
        ``"absent"``: nothing.

    Raises
    ------
    OutputError
        If the record is damaged.

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np, xarray as xr
    >>> da = xr.DataArray(np.ones((4, 6)), dims=("y", "x")).chunk(2)
    >>> output, print_ = open_output(da, pathlib.Path(tempfile.mkdtemp()) / "a.zarr")
    >>> before = output_status(output)
    >>> run_output(output, print_, True, False, False, False)
    6
    >>> before, output_status(output)
    ('absent', 'complete')
    """
    if output.record.read() is not None:
        return "unfinished"
    if not output.exists():
        return "absent"
    return "complete" if output.looks_finished() else "foreign"


def tidy_complete(output: Output, break_lock: bool = False) -> None:
    """Remove what a kill after a finished write left: block markers, a stale lock.

    Takes the output's lock (``break_lock`` as for :func:`xpatch.write`), so a live
    writer's files are never touched. For an output whose :func:`output_status` is
    ``"complete"``.
    """
    output.lock.acquire(break_lock=break_lock)
    try:
        output.record.remove()
    finally:
        output.lock.release()
        output.tidy()
