"""The ``xpatch apply`` command: its options and what it does.

``xpatch apply INPUT OUTPUT --fn module:function ...`` runs sliding-window
inference out of core: it opens a GeoTIFF, zarr store or netCDF file lazily
(:func:`xpatch.io.inputs.open_input`), imports the batch function (:func:`load_function`), runs it
over overlapping patches in batches, blends the results with weighted
overlap-add and streams them to a tiled GeoTIFF or a zarr store with
:func:`xpatch.write` (:func:`run_apply`). :func:`add_apply_command` declares its
options and help text on the parser of :mod:`xpatch.cli.command`, which dispatches to it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from xpatch.cli.common import DefaultsOnceFormatter, format_sizes, positive_int, usage_error
from xpatch.core.errors import OptionError, XPatchError
from xpatch.io import write
from xpatch.io.geotiff import geotiff_layout, stack_bands
from xpatch.io.inputs import GEOTIFF_SUFFIXES, is_url, open_input
from xpatch.patcher import Patcher
from xpatch.xarray.fn_outputs import raised_by_fn


def add_apply_command(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``apply`` command, its options and help text, to the ``xpatch`` parser.

    Parameters
    ----------
    commands
        The subparsers of the ``xpatch`` parser.

    Returns
    -------
    argparse.ArgumentParser
        The parser of ``xpatch apply``.
    """
    apply = commands.add_parser(
        "apply",
        help="sliding-window inference from a GeoTIFF/zarr/netCDF file to GeoTIFF or zarr",
        description=(
            "Run FN over overlapping patches of INPUT (GeoTIFF, zarr or netCDF, opened lazily) "
            "in batches, blend the results by weighted overlap-add and write them to OUTPUT "
            "(*.tif: tiled GeoTIFF with the input's CRS and transform; *.zarr) block by block, "
            "out of core. FN gets numpy batches (b, *other dims, *patch) and returns "
            "(b, *output dims, *patch). An interrupted run started again writes only the "
            "blocks it had not written."
        ),
        formatter_class=DefaultsOnceFormatter,
    )
    apply.add_argument(
        "input",
        help="GeoTIFF (.tif), zarr store (.zarr) or netCDF (.nc); or a quoted glob such as "
        "'scenes/*.tif': every match is a scene, written to OUTPUT/<stem>.tif (all GeoTIFF) "
        "or OUTPUT/<stem>.zarr, and the whole folder resumes as one run",
    )
    apply.add_argument("output", help="*.tif or *.zarr; a folder for a glob INPUT")
    apply.add_argument(
        "--fn", required=True, help="the batch function: module:function or file.py:function"
    )
    apply.add_argument(
        "--size",
        type=per_dim_extent,
        required=True,
        help="patch size in cells: one for every patched dim (64), or per dim 'y=64,x=32' "
        "(which also names the patched dims)",
    )
    apply.add_argument(
        "--stride",
        type=per_dim_extent,
        default=None,
        help="step between patches, as --size (default: 3/4 of the size, so neighbours "
        "overlap by a quarter and the window blends their seams away)",
    )
    apply.add_argument(
        "--halo",
        type=per_dim_extent,
        default=None,
        help="cells FN reads on each side of a patch beyond it, for a model that crops "
        "(an unpadded U-Net): one for every patched dim (2), or per dim 'y=2,x=2'; FN gets "
        "patches grown by twice it, filled past the edges as --pad-mode says, and returns "
        "the grown or the inner shape; only the inner patch is blended (default: none)",
    )
    apply.add_argument(
        "--window",
        default="hann",
        help="blending window: boxcar, hann, triangular, tukey or a scipy window name",
    )
    apply.add_argument(
        "--boundary",
        choices=("shift", "pad", "drop", "raise"),
        default="shift",
        help="what the last patch does at an edge the stride does not reach: shift back "
        "inside, pad past the edge, drop the cells, or raise",
    )
    apply.add_argument(
        "--pad-mode",
        choices=("constant", "reflect", "symmetric", "edge", "wrap"),
        default="constant",
        help="how --boundary pad fills cells beyond the edge (numpy.pad's modes); constant "
        "fills with NaN for floats, which a convolution spreads: prefer reflect or edge",
    )
    apply.add_argument(
        "--dims",
        default=None,
        help="patched dims, comma-separated (default: those --size names, else y,x, else the "
        "input's last two)",
    )
    apply.add_argument(
        "--chunks", type=positive_int, default=1024, help="dask chunk size along patched dims"
    )
    apply.add_argument("--batch-size", type=positive_int, default=32, help="patches per call of FN")
    apply.add_argument(
        "--task-memory",
        default=None,
        help="memory one task may hold, e.g. 512MiB (default: the dask config "
        "xpatch.task-memory, else 192MiB); chunks whose tasks would hold more are worked "
        "and written in smaller blocks. Peak memory is about the threads times it",
    )
    apply.add_argument(
        "--pad-batch",
        action="store_true",
        help="hand FN batches of exactly --batch-size patches (the last one padded), so that "
        "a jitted model compiles once",
    )
    apply.add_argument(
        "--output-dims",
        default=None,
        help="FN's non-patched output dims, e.g. class=5 ('' for none); for an FN returning "
        "a dict, per key: 'seg:class=3;unc:' (a .zarr OUTPUT has a variable per key, a "
        "GeoTIFF a band per key and class). Default: found by calling FN once on a batch of "
        "zeros (the input's other dims if FN keeps them, none if it drops them); giving "
        "--output-dims and --dtype skips that call",
    )
    apply.add_argument(
        "--scale",
        default=None,
        help="output cells per input cell, for an FN whose patches come back at another "
        "resolution: one factor for every patched dim (2, 4, 1/4) or per dim 'y=2,x=2'; "
        "OUTPUT covers the input's extent at that resolution (transform scaled)",
    )
    apply.add_argument(
        "--dtype",
        default=None,
        help="FN's output dtype, e.g. float32 (default: what FN returns for a batch of zeros)",
    )
    apply.add_argument(
        "--out-dtype",
        default=None,
        help="OUTPUT's dtype: the blend rounded (integers) and clipped to it (default: FN's "
        "dtype for a mean of integers, uint8/uint16 labels for argmax, else the blend's)",
    )
    apply.add_argument(
        "--reduce",
        choices=("mean", "sum", "max", "min", "vote", "argmax"),
        default="mean",
        help="how overlaps combine; argmax blends class scores as the mean and writes the "
        "index of the largest along FN's one output dim (class labels, e.g. uint8)",
    )
    apply.add_argument(
        "--nodata",
        type=_nodata,
        default="input",
        help="OUTPUT's nodata: 'input' (the input's, for an output of its dtype), a number, "
        "'nan' or 'none'",
    )
    apply.add_argument("--variable", default=None, help="variable of a zarr/netCDF input")
    apply.add_argument(
        "--restart", action="store_true", help="replace OUTPUT instead of resuming it"
    )
    apply.add_argument(
        "--force-resume",
        action="store_true",
        help="resume OUTPUT's interrupted run even though its model, input or layout differ "
        "(mixes both runs: only for changes known not to alter results)",
    )
    apply.add_argument(
        "--break-lock",
        action="store_true",
        help="take over the lock of a writer on another machine whose heartbeat stopped "
        "(a killed writer of this machine's is taken over without it; never a live one)",
    )
    apply.add_argument(
        "--storage-options",
        type=_storage_options,
        default=None,
        help="fsspec options for a URL INPUT or OUTPUT (both, when both are URLs), as JSON: "
        '\'{"anon": false}\', \'{"client_kwargs": {"endpoint_url": "http://..."}}\'',
    )
    apply.add_argument(
        "--input-storage-options",
        type=_storage_options,
        default=None,
        help="fsspec options for a URL INPUT on another store than OUTPUT's, as JSON "
        "(default: --storage-options)",
    )
    apply.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return apply


def load_function(spec: str) -> Callable[[np.ndarray], np.ndarray]:
    """Import ``module:function`` or ``path/to/file.py:function``.

    Examples
    --------
    >>> load_function("numpy:negative") is np.negative
    True
    """
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise OptionError(f"--fn {spec!r} must be 'module:function' or 'path/to/file.py:function'.")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise OptionError(f"--fn {spec!r}: no file {module_name!r}.")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise OptionError(f"--fn {spec!r}: cannot import {module_name!r} ({error}).") from None
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise OptionError(f"--fn {spec!r}: {module_name!r} has no function {attribute!r}.")
    return fn


def _output_dims(text: str | None) -> dict[str, int] | dict[str, dict[str, int]] | None:
    """``--output-dims``: ``class=5``, or per output of a dict-returning FN ``seg:class=3;unc:``."""
    if text is None:
        return None
    if ":" in text:
        outputs = {}
        for item in text.split(";"):
            name, sep, dims = item.partition(":")
            if not sep or not name.strip():
                raise OptionError(
                    f"--output-dims {text!r}: for several outputs give each as NAME:DIMS, "
                    "separated by ';', e.g. 'seg:class=3;unc:' ('NAME:' for none)."
                )
            outputs[name.strip()] = _dims(dims, text)
        return outputs
    return _dims(text, text)


def _scale(text: str | None) -> str | dict[str, str] | None:
    """``--scale``: one factor (``2``, ``1/4``, ``0.25``), or per dim ``y=2,x=2``."""
    if text is None or "=" not in text:
        return text
    factors = {}
    for item in text.split(","):
        name, _, factor = item.partition("=")
        if not name.strip() or not factor.strip():
            raise OptionError(
                f"--scale {text!r} must be one factor (2, 1/4, 0.25) or per dim 'y=2,x=2'."
            )
        factors[name.strip()] = factor.strip()
    return factors


def _dims(text: str, whole: str) -> dict[str, int]:
    if text == "":
        return {}
    dims = {}
    for item in text.split(","):
        name, sep, size = item.partition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise OptionError(
                f"--output-dims {whole!r} must look like 'class=5' or 'class=5,time=2' "
                "(or '' for none; 'seg:class=3;unc:' for an FN returning a dict)."
            )
        dims[name.strip()] = int(size)
    return dims


def run_apply(args: argparse.Namespace) -> int:
    """Carry out ``xpatch apply`` (see :func:`add_apply_command` for the options).

    Problems with the options or the input exit with status 2 and a message, as
    do outputs that exist and predictions that break their declaration. An
    exception raised by the user's function while computing propagates with its
    traceback.
    """
    try:
        p, result = _plan_apply(args)
    except (XPatchError, ValueError, ImportError) as error:
        if raised_by_fn(error):
            raise  # the user's function failed: its traceback is what helps
        return usage_error("apply", str(error))
    if args.restart and args.force_resume:
        return usage_error("apply", "--restart and --force-resume exclude each other; pick one.")
    if isinstance(result, xr.Dataset):  # several outputs: a variable per key
        name = ", ".join(str(n) for n in result.data_vars)
        named = result
        dtypes = ", ".join(sorted({str(v.dtype) for v in result.data_vars.values()}))
    else:
        name = Path(args.output).stem if result.name is None else result.name
        named = result.rename(name)
        dtypes = str(result.dtype)
    # What runs, before the progress bar: a wrong size or stride shows before the wait.
    print(
        f"xpatch apply: {len(p)} patches of {format_sizes(p.size)}, stride "
        f"{format_sizes(p.stride)}, window {args.window!r} -> {name} "
        f"({format_sizes(dict(result.sizes))}) {dtypes} in {args.output}",
        flush=True,
    )
    start = time.perf_counter()
    try:
        blocks = write_output(named, args)
    except XPatchError as error:
        return usage_error("apply", str(error))
    print(f"xpatch apply: wrote {blocks} blocks in {time.perf_counter() - start:.1f} s")
    return 0


def write_output(result: Any, args: argparse.Namespace, format: str = "auto") -> int:
    """``xpatch.write`` of ``result`` to OUTPUT with the resume, progress and lock flags.

    SIGTERM leaves the output as Ctrl-C does (:func:`sigterm_exits`).
    """
    with sigterm_exits():
        return write(
            result,
            args.output,
            format=format,
            resume="force" if args.force_resume else not args.restart,
            overwrite=args.restart,
            progress=not args.no_progress,
            storage_options=output_storage_options(args),
            break_lock=args.break_lock,
        )


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` while writing, so the lock is released on the way out.

    A batch system's ``kill`` then leaves the output as Ctrl-C does: resumable by running
    the same command, with no stale lock.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def output_storage_options(args: argparse.Namespace) -> dict | None:
    """``--storage-options`` for OUTPUT: None for a local OUTPUT when they serve a URL INPUT."""
    if is_url(str(args.output)) or not is_url(str(getattr(args, "input", ""))):
        return args.storage_options  # a local OUTPUT and INPUT: locate refuses them
    return None


def input_storage_options(args: argparse.Namespace, path: str | Path) -> dict | None:
    """Return INPUT ``path``'s options: ``--input-storage-options``, else ``--storage-options``.

    None for a local path; ``--input-storage-options`` with one is refused.
    """
    given = getattr(args, "input_storage_options", None)
    if not is_url(str(path)):
        if given:
            raise OptionError(
                f"--input-storage-options {json.dumps(given)} were given with the local INPUT "
                f"{str(path)!r}; they apply to URLs such as 's3://bucket/x.zarr'. Drop them."
            )
        return None
    return given if given is not None else args.storage_options


def _storage_options(text: str) -> dict:
    """``--storage-options``: a JSON object."""
    try:
        options = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({error})") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a JSON object such as '{{\"anon\": false}}'"
        )
    return options


def _nodata(text: str) -> float | str | None:
    """``--nodata``: 'input', 'none' or a number (nan included)."""
    if text in ("input", "none"):
        return None if text == "none" else text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 'input', 'none' or a number (e.g. -9999 or nan)"
        ) from None


def open_patched_input(
    path: str | Path, args: argparse.Namespace
) -> tuple[xr.DataArray, list[Hashable]]:
    """Open INPUT ``path`` lazily as ``xpatch apply`` patches it: ``(data, patched dims)``.

    The dims are ``--dims``, else y and x, else the last two; ``data`` is chunked
    ``--chunks`` along them and whole along the others.
    """
    data = open_input(path, args.variable, args.chunks, input_storage_options(args, path))
    if args.dims:
        dims = args.dims.split(",")
    elif isinstance(args.size, dict):
        dims = list(args.size)
    else:
        dims = [d for d in ("y", "x") if d in data.dims]
    if not dims:
        dims = list(data.dims[-2:])
    missing = [d for d in dims if d not in data.dims]
    if missing:
        given = f"--dims {args.dims!r}" if args.dims else f"--size's dims {dims}"
        raise OptionError(
            f"{given}: {missing} not in the input's dims {data.dims} ({str(path)!r})."
        )
    empty = {d: data.sizes[d] for d in dims if data.sizes[d] == 0}
    if empty:
        raise OptionError(
            f"INPUT {str(path)!r} is empty along {list(empty)} ({format_sizes(data.sizes)}): "
            "there is nothing to patch. Check the file (and --variable, --dims)."
        )
    return data.chunk({d: (args.chunks if d in dims else -1) for d in data.dims}), dims


def patch_options(args: argparse.Namespace) -> dict:
    """Return the patch layout's options of ``xpatch apply`` (size and stride aside)."""
    return {
        "window": args.window,
        "boundary": args.boundary,
        "pad_mode": args.pad_mode,
        "halo": getattr(args, "halo", None),
    }


def apply_options(args: argparse.Namespace) -> dict:
    """Return ``Patcher.apply``'s keyword arguments from the options of ``xpatch apply``."""
    return {
        "batch_size": args.batch_size,
        "pad_batch": args.pad_batch,
        "output_dims": _output_dims(args.output_dims),
        "dtype": args.dtype,
        "reduce": args.reduce,
        "nodata": args.nodata,
        "out_dtype": args.out_dtype,
        "scale": _scale(args.scale),
        "task_memory": args.task_memory,
    }


def _plan_apply(args: argparse.Namespace) -> tuple:
    """Open the input and build the lazy result: ``(patcher, result)``."""
    fn = load_function(args.fn)
    data, dims = open_patched_input(args.input, args)
    sizes, stride = layout_of_args(args, dims)
    p = Patcher(data, sizes, stride, **patch_options(args))
    result = p.apply(fn, **apply_options(args))
    if Path(args.output).suffix.lower() in GEOTIFF_SUFFIXES:
        if isinstance(result, xr.Dataset):  # several outputs: a band per output and class
            result = stack_bands(result)
        result = geotiff_result(result, args.output, args.input)
    return p, result


def geotiff_result(result: xr.DataArray, output: str, source: str) -> xr.DataArray:
    """Check that the GeoTIFF ``output`` can hold ``result``; name its row and column dims y, x.

    Reads metadata only, before anything is computed. rioxarray, which writes
    the file's transform, finds rows and columns by the names y and x: ``lat``
    and ``lon`` (and the other names :func:`xpatch.xarray.georef.geotiff_layout` knows)
    are renamed to them.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> da = xr.DataArray(np.zeros((2, 3)), dims=("lat", "lon"))
    >>> geotiff_result(da, "out.tif", "in.nc").dims
    ('y', 'x')
    """
    try:
        y_dim, x_dim, _ = geotiff_layout(result)
    except OptionError as error:
        raise OptionError(
            f"OUTPUT {output!r} is a GeoTIFF, which cannot hold the result of INPUT "
            f"{source!r}: {error} (A .zarr OUTPUT holds any result.)"
        ) from None
    names = {d: n for d, n in ((y_dim, "y"), (x_dim, "x")) if d != n}
    in_use = (set(result.dims) | set(result.coords)) - set(names)
    return result.rename(names) if names and not set(names.values()) & in_use else result


def per_dim_extent(text: str) -> int | dict[str, int]:
    """``--size`` and ``--stride``: one integer >= 1, or per dim ``y=64,x=32``.

    Examples
    --------
    >>> per_dim_extent("64"), per_dim_extent("y=64, x=32")
    (64, {'y': 64, 'x': 32})
    """
    if "=" not in text:
        return positive_int(text)
    extents = {}
    for item in text.split(","):
        dim, _, number = item.partition("=")
        if not dim.strip() or not number.strip().isdigit() or int(number) < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one integer >= 1 (64) nor per dim 'y=64,x=32'"
            )
        extents[dim.strip()] = int(number)
    return extents


def default_stride(size: int) -> int:
    """Return ``--stride``'s default: a quarter overlap, which the window blends seams over.

    MONAI's ``sliding_window_inference`` overlaps a quarter by default too.

    Examples
    --------
    >>> default_stride(64), default_stride(1)
    (48, 1)
    """
    return max(1, size - size // 4)


def layout_of_args(args: argparse.Namespace, dims: list[Hashable]) -> tuple[dict, dict]:
    """Return ``({dim: size}, {dim: stride})`` of ``--size`` and ``--stride`` along ``dims``."""
    sizes = _along(args.size, dims, "--size")
    if args.stride is None:
        return sizes, {d: default_stride(n) for d, n in sizes.items()}
    return sizes, _along(args.stride, dims, "--stride")


def _along(extent: int | dict[str, int], dims: list[Hashable], flag: str) -> dict:
    if isinstance(extent, int):
        return {d: extent for d in dims}
    if set(extent) != {str(d) for d in dims}:
        raise OptionError(
            f"{flag} {','.join(f'{d}={n}' for d, n in extent.items())} names the dims "
            f"{list(extent)}, but the patched dims are {[str(d) for d in dims]}; name each of "
            "them once (or give one number for all)."
        )
    return {d: extent[str(d)] for d in dims}
