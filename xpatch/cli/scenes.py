"""``xpatch apply 'scenes/*.tif' out/ ...``: one output per scene into a folder.

When INPUT is a glob (``*``, ``?`` or ``[...]``, quoted so that the shell leaves it
alone) that names no existing file, :mod:`xpatch.cli.command` hands the command here
instead of to :func:`xpatch.cli.apply.run_apply`. Every match is opened lazily as
``xpatch apply`` opens one INPUT (:func:`xpatch.cli.apply.open_patched_input`),
the matches are laid under one patch layout with :func:`xpatch.patch_scenes`, and
the results are written into the folder OUTPUT by :func:`xpatch.write`, one per
scene (:func:`xpatch.io.scenes.write_scenes`): ``<stem>.tif`` when every match
is a GeoTIFF, else ``<stem>.zarr``. Each output equals what ``xpatch apply`` of
that file alone writes to ``OUTPUT/<stem>.tif`` (or ``.zarr``), and ``--restart``,
``--force-resume`` and ``--break-lock`` apply to the whole folder. Directories are
not expanded: give a glob such as ``'scenes/*.tif'``.
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

import xarray as xr

from xpatch.cli.apply import (
    apply_options,
    geotiff_result,
    layout_of_args,
    load_function,
    open_patched_input,
    patch_options,
    write_output,
)
from xpatch.cli.common import format_sizes, usage_error
from xpatch.core.errors import OptionError, XPatchError
from xpatch.io.geotiff import stack_bands
from xpatch.io.inputs import GEOTIFF_SUFFIXES
from xpatch.scenes import patch_scenes
from xpatch.xarray.fn_outputs import raised_by_fn


def is_scene_pattern(text: str) -> bool:
    """Tell whether INPUT is a glob of scenes rather than one file.

    A name with glob characters that exists as it is (``scene[1].tif``) is one file.

    Examples
    --------
    >>> is_scene_pattern("scenes/*.tif"), is_scene_pattern("scene.tif")
    (True, False)
    """
    return glob.has_magic(text) and not Path(text).exists()


def plan_scenes(args: argparse.Namespace) -> tuple:
    """Open the matches and build the lazy results: ``(patcher, results, format, dims)``.

    Raises
    ------
    OptionError
        If the glob matches no file, OUTPUT names a file rather than a folder, two
        matches share a stem (their outputs would collide), or a match cannot be
        opened or patched (the message names it).
    """
    paths = sorted(glob.glob(args.input))
    if not paths:
        raise OptionError(
            f"INPUT {args.input!r} matches no file; check the pattern (and quote it, so that "
            "the shell does not expand it)."
        )
    if Path(args.output).suffix.lower() in (*GEOTIFF_SUFFIXES, ".zarr"):
        raise OptionError(
            f"OUTPUT {args.output!r} names a file, but INPUT {args.input!r} is a glob: OUTPUT is "
            "then the folder that gets one output per match (<stem>.tif or <stem>.zarr). Give "
            "a folder, e.g. 'out/'."
        )
    names = [Path(path).stem for path in paths]
    shared = sorted({n for n in names if names.count(n) > 1})
    if shared:
        same = [p for p in paths if Path(p).stem in shared]
        raise OptionError(
            f"INPUT {args.input!r} matches files that share a stem ({same[:4]}): their outputs "
            f"would both be named {shared[0]!r} in OUTPUT. Narrow the pattern, or write each "
            "group into its own folder."
        )
    fn = load_function(args.fn)
    scenes = {}
    dims_of = {}
    for name, path in zip(names, paths):
        scenes[name], dims_of[name] = open_patched_input(path, args)
    dims = dims_of[names[0]]
    other = {n: d for n, d in dims_of.items() if d != dims}
    if other:
        raise OptionError(
            f"the matches of {args.input!r} are patched along different dims ({names[0]!r}: "
            f"{dims}, then {other}); pick them with --dims, or run each kind apart."
        )
    sizes, stride = layout_of_args(args, dims)
    sp = patch_scenes(scenes, sizes, stride, **patch_options(args))
    results = sp.apply(fn, **apply_options(args))
    geotiff = all(Path(path).suffix.lower() in GEOTIFF_SUFFIXES for path in paths)
    named = {}
    for name, path in zip(names, paths):
        result = results[name]
        if geotiff:
            if isinstance(result, xr.Dataset):  # several outputs: a band per output and class
                result = stack_bands(result)
            result = geotiff_result(result, str(Path(args.output) / f"{name}.tif"), path)
        if isinstance(result, xr.DataArray) and result.name is None:
            result = result.rename(name)  # as xpatch apply names OUTPUT/<stem>.zarr's variable
        named[name] = result
    return sp, named, "geotiff" if geotiff else "zarr", dims


def run_apply_scenes(args: argparse.Namespace) -> int:
    """Carry out ``xpatch apply`` with a glob INPUT (see the module docstring).

    Problems with the options or the inputs exit with status 2 and a message, as
    do outputs that exist and runs that another computation left in OUTPUT.
    """
    if args.restart and args.force_resume:
        return usage_error("apply", "--restart and --force-resume exclude each other; pick one.")
    try:
        sp, results, kind, dims = plan_scenes(args)
    except (XPatchError, ValueError, ImportError) as error:
        if raised_by_fn(error):
            raise  # the user's function failed: its traceback is what helps
        return usage_error("apply", str(error))
    shown = ", ".join(list(results)[:3]) + (", ..." if len(results) > 3 else "")
    suffix = ".tif" if kind == "geotiff" else ".zarr"
    sizes, strides = layout_of_args(args, dims)
    print(
        f"xpatch apply: {len(sp)} patches of {format_sizes(sizes)}, stride "
        f"{format_sizes(strides)}, window {args.window!r}, in {len(results)} scenes ({shown}) "
        f"-> {len(results)} {suffix} outputs in {args.output}",
        flush=True,
    )
    start = time.perf_counter()
    try:
        blocks = write_output(results, args, format=kind)
    except XPatchError as error:
        return usage_error("apply", str(error))
    print(f"xpatch apply: wrote {blocks} blocks in {time.perf_counter() - start:.1f} s")
    return 0
