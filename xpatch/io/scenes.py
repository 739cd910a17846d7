"""Write one output per scene into a folder, resumable as a whole: :func:`write_scenes`.

``xpatch.write(sp.apply(fn), "out/")`` lands here (:func:`xpatch.write` dispatches a
mapping scene name -> result). Each scene is an ordinary output of
:mod:`xpatch.io.steps` (``out/<name>.zarr`` or ``out/<name>.tif``, with its own
progress record and lock), so a run killed inside a scene resumes that scene from
its record. What no single output can say is whether a *complete* output (which has
no record) is this computation's: the folder keeps a manifest for that.

The manifest is the folder ``out/xpatch-scenes/``:

- ``<output>.json`` per scene (``a.zarr.json``, ``b.tif.json``), replaced whole and
  atomically (a rename locally, one ``PUT`` on an object store)::

      {"format": 1, "scene": "a", "output": "a.zarr", "state": "started" | "done",
       "fingerprint": {...}, "updated": "2025-01-01T00:00:00+00:00"}

  ``fingerprint`` is the output's (:func:`xpatch.xarray.provenance.fingerprint`: input,
  function's code, patch layout, output layout, xpatch version), the same in any
  process for the same computation. One file per scene, not one file for all, so
  that a run over thousands of scenes rewrites a small file per scene rather than
  an ever larger one.
- ``lock.json`` while a writer runs (:class:`xpatch.io.record.WriterLock`): one
  writer per folder, so that no two runs update the manifest at once.
- ``README.txt``: what the folder is, for whoever finds it beside the outputs.

A scene's entry says ``"started"`` before its write starts (``"overwriting"`` when
a complete output is being replaced) and ``"done"`` once it returned. The rules,
per scene, decided for every scene before any is written (with ``overwrite=True``
every scene is written again, whatever the folder holds):

- done, same computation, output complete: skipped (0 blocks);
- started, same computation, output complete: marked done without writing (the
  kill came between the end of the scene's write and the manifest's update);
- overwriting, output complete: written again (the complete output may be the old
  one, if the kill came before the new run's record existed);
- done or started, another computation, output complete: refused with what
  differs, unless ``resume="force"`` (kept, and the entry names the new
  computation);
- no entry, and the output exists: refused (not this folder's run);
- an output that xpatch did not finish (no record, no finished metadata): refused;
- output absent, or holding a progress record: written, the record's run resumed
  under :func:`xpatch.write`'s rules (checked here first, so that a refusal comes
  before the first scene is written).

Entries of scenes that are not in the mapping (another subset of scenes written
into the same folder) are left alone, as are their outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import xarray as xr

from xpatch.core.checks import check_choice
from xpatch.core.errors import OptionError, OutputError, OutputExistsError, XPatchError
from xpatch.io.location import Location, locate
from xpatch.io.record import WriterLock, put_atomically, read_bytes
from xpatch.io.steps import (
    FORMATS,
    GEOTIFF_SUFFIXES,
    Format,
    Resume,
    check_resume,
    open_output,
    output_status,
    refuse_other_run,
    run_output,
    tidy_complete,
    wrote_nothing,
)
from xpatch.xarray.provenance import differences

#: The manifest's folder inside the output folder.
MANIFEST_FOLDER = "xpatch-scenes"

#: The format of a manifest entry; an entry of another format is refused.
MANIFEST_FORMAT = 1

#: What ``xpatch-scenes/README.txt`` tells whoever finds the folder beside the outputs.
MANIFEST_README = """\
This folder is xpatch's record of the scenes written here (xpatch.write of a
mapping of scenes, or xpatch apply with a glob INPUT).

<output>.json, one per scene: which computation wrote that output (input,
function, patch layout, xpatch version) and whether it finished. The same
command run again skips the finished scenes and resumes the others; another
computation is refused until you pass --restart (overwrite=True).

lock.json, while a writer runs: who writes (one writer per folder).

Keep this folder as long as you may run the command again. To start afresh,
delete it together with the outputs.
"""

#: Characters that cannot be part of a file name on some filesystem xpatch writes to
#: (Windows refuses ``:*?"<>|``; control characters break listings and shells).
FORBIDDEN_NAME_CHARACTERS = ("/", "\\", "\0", ":", "*", "?", '"', "<", ">", "|")

#: The longest file name most filesystems take, in bytes.
LONGEST_NAME_BYTES = 255
#: Room left for the suffixes xpatch adds to a scene's name (``.zarr``, ``.xpatch-progress``).
SUFFIX_BYTES = 24

EntryState = Literal["started", "overwriting", "done"]
Action = Literal["write", "rewrite", "skip", "mark"]


def check_scene_names(names: list[str]) -> None:
    """Raise :class:`OptionError` unless every scene name can be a file name.

    Examples
    --------
    >>> check_scene_names(["tile_01", "tile 02"])
    >>> check_scene_names(["a/b"])
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: scene name 'a/b' cannot be a file name ...
    """
    for name in names:
        bad = [c for c in name if c in FORBIDDEN_NAME_CHARACTERS or not c.isprintable()]
        long = len(name.encode()) > LONGEST_NAME_BYTES - SUFFIX_BYTES
        if not name or name in (".", "..") or bad or long:
            if bad:
                why = f"it contains {bad[0]!r}"
            elif long:
                most = LONGEST_NAME_BYTES - SUFFIX_BYTES
                why = f"it is {len(name.encode())} bytes long, over {most}"
            else:
                why = "it is empty or a folder reference"
            fixed = "".join("_" if c in bad else c for c in name)[:64] or "scene"
            raise OptionError(
                f"scene name {name!r} cannot be a file name ({why}): each scene is written "
                f"to <folder>/<name>.zarr or .tif. Rename the scene, e.g. {{{fixed!r}: result}}."
            )


@dataclass
class ScenePlan:
    """One scene of a :func:`write_scenes` call: its output, fingerprint and action."""

    scene: str
    filename: str
    output: Any
    fingerprint: dict
    action: Action = "write"


class Manifest:
    """The entries of an output folder's scenes, in ``<folder>/xpatch-scenes/``.

    Parameters
    ----------
    location
        The output folder.
    """

    def __init__(self, location: Location) -> None:
        self.fs = location.fs
        self.folder = location.join(MANIFEST_FOLDER)
        self.name = f"{location.name.rstrip('/')}/{MANIFEST_FOLDER}"
        self.lock = WriterLock(self.fs, self.folder, location.name)
        self.local = location.local
        self._explained = False  # README.txt written in this run

    def path(self, filename: str) -> str:
        """Return the path of the entry of the output ``filename``."""
        return f"{self.folder}/{filename}.json"

    def read(self, filename: str) -> dict | None:
        """Return the entry of the output ``filename``, or None if there is none."""
        data = read_bytes(self.fs, self.path(filename))
        if data is None:
            return None
        try:
            entry = json.loads(data)
            if (
                entry.get("format") != MANIFEST_FORMAT
                or entry.get("state") not in ("started", "overwriting", "done")
                or not isinstance(entry.get("fingerprint"), dict)
            ):
                raise ValueError("not a manifest entry of this format")
        except (ValueError, AttributeError) as error:
            raise OutputError(
                f"the manifest entry {self.path(filename)!r} is damaged ({error}); write the "
                "scenes again with overwrite=True (xpatch apply --restart), or delete the "
                f"entry and {filename!r}."
            ) from None
        return entry

    def write(self, plan: ScenePlan, state: EntryState) -> None:
        """Replace the entry of ``plan``'s output with ``state`` and its fingerprint."""
        entry = {
            "format": MANIFEST_FORMAT,
            "scene": plan.scene,
            "output": plan.filename,
            "state": state,
            "fingerprint": plan.fingerprint,
            "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        put_atomically(self.fs, self.path(plan.filename), json.dumps(entry, indent=1).encode())
        if not self._explained:
            put_atomically(self.fs, f"{self.folder}/README.txt", MANIFEST_README.encode())
            self._explained = True

    def tidy(self) -> None:
        """Remove the manifest's folder if nothing is left in it (a local folder)."""
        if self.local:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)


def _plan(
    results: Mapping[Any, Any],
    location: Location,
    kind: str,
    name: Hashable | None,
    nodata: float | None,
    storage_options: dict | None,
) -> list[ScenePlan]:
    """Each scene's output and fingerprint; every problem with a scene is raised here."""
    suffix = ".tif" if kind == "geotiff" else ".zarr"
    plans = []
    for scene, result in results.items():
        filename = f"{scene}{suffix}"
        try:
            if not isinstance(result, xr.DataArray | xr.Dataset):
                raise OptionError(
                    f"the result is a {type(result).__name__}; give an xarray DataArray or "
                    "Dataset per scene (what ScenePatcher.apply returns)."
                )
            output, print_ = open_output(
                result,
                f"{location.name.rstrip('/')}/{filename}",
                format=kind,  # type: ignore[arg-type]
                name=name,
                nodata=nodata,
                storage_options=storage_options,
            )
        except XPatchError as error:
            raise type(error)(f"scene {scene!r}: {error}") from None
        plans.append(ScenePlan(str(scene), filename, output, print_))
    return plans


def _decide(plan: ScenePlan, entry: dict | None, resume: Resume, where: str) -> Action:
    """Apply the module's rules to one scene (``overwrite=False``); raise a refusal."""
    status = output_status(plan.output)
    output = plan.output.location.name
    if status == "foreign":
        raise OutputExistsError(
            f"scene {plan.scene!r}: {output!r} exists but is not an output that xpatch "
            "finished (another program's data, or a run whose record was deleted). Pass "
            "overwrite=True (xpatch apply --restart) to replace it, or choose another folder."
        )
    if entry is None:
        if status != "absent":
            raise OutputExistsError(
                f"scene {plan.scene!r}: {output!r} exists, but the manifest {where!r} has no "
                "entry for it: it was not written by a run of these scenes into this folder "
                "(or its entry was deleted). Pass overwrite=True (xpatch apply --restart) to "
                "replace it, or choose another folder."
            )
        return "write"
    if status == "unfinished":
        # Refused now, as write would refuse it, rather than after the scenes before it.
        record = plan.output.record.read()
        started = record is not None and record["state"] != "creating"
        if started and not wrote_nothing(plan.output):
            if resume is False:
                raise OutputExistsError(
                    f"scene {plan.scene!r}: {output!r} holds an unfinished run; pass "
                    "resume=True to continue it, or overwrite=True to start again."
                )
            try:
                refuse_other_run(
                    output, *differences(record["fingerprint"], plan.fingerprint), resume
                )
            except OutputError as error:
                raise OutputError(f"scene {plan.scene!r}: {error}") from None
    if status != "complete":
        return "write"  # nothing written yet, or a run its own record resumes
    layout, computation = differences(entry["fingerprint"], plan.fingerprint)
    if layout:  # another shape, dtype or chunks: never the same result, forced or not
        raise OutputError(
            f"scene {plan.scene!r}: {output!r} was written with another layout: "
            + "; ".join(layout)
            + ". resume='force' keeps outputs of this layout only: write it again with "
            "overwrite=True (xpatch apply --restart)."
        )
    if computation:
        if resume == "force":
            return "mark"  # kept; the entry names the computation that runs now
        raise OutputError(
            f"scene {plan.scene!r}: {output!r} was written by another computation: "
            + "; ".join(layout + computation)
            + ". Write it again with overwrite=True (xpatch apply --restart), or, if you "
            "know the results are the same (e.g. only comments changed), keep it with "
            "resume='force' (xpatch apply --force-resume)."
        )
    if entry["state"] == "done":
        return "skip"
    if resume is False:
        raise OutputExistsError(
            f"scene {plan.scene!r}: the run that wrote {output!r} was interrupted before the "
            f"manifest {where!r} said it finished; pass resume=True to continue (mark it "
            "done, or write it again after an interrupted overwrite), or overwrite=True to "
            "write it again."
        )
    if entry["state"] == "overwriting":
        # The complete output may still be the one an interrupted overwrite set out to
        # replace (a kill before its record was written): write it again.
        return "rewrite"
    return "mark"


def write_scenes(
    results: Mapping[str, xr.DataArray | xr.Dataset],
    folder: str | os.PathLike,
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
    """Write one output per scene into ``folder``; return the blocks written by this call.

    Scene ``name`` goes to ``folder/<name>.zarr`` (or ``.tif``) exactly as
    :func:`xpatch.write` writes one result there, scene after scene. The folder's
    manifest (see :mod:`xpatch.io.scenes`) makes the run resumable as a whole:
    started again, the same call skips the scenes that are done, resumes the one
    that was interrupted from its progress record, and writes the others.

    Parameters
    ----------
    results
        Scene name -> lazy result, typically ``ScenePatcher.apply(...)``. Names
        become file names: empty names, ``"."``, ``".."`` and names with a slash
        or a backslash are refused.
    folder
        A local folder (created if missing) or, for zarr, an fsspec URL such as
        ``"s3://bucket/run-1"``.
    format
        ``"zarr"`` (also what ``"auto"`` means here) or ``"geotiff"`` (local
        folders only).
    name, nodata, storage_options, progress, break_lock
        As for :func:`xpatch.write`, for every scene and for the folder's own
        lock (a killed run's is taken over without ``break_lock``).
    resume
        ``True``: continue an interrupted run of the same computation. ``False``:
        refuse any scene with unfinished work. ``"force"``: continue it, and keep
        complete outputs, even though the computation differs.
    overwrite
        Write every scene again, whatever the folder holds.

    Returns
    -------
    int
        Number of blocks written over all scenes (0 if every scene was done).

    Raises
    ------
    OptionError
        A scene name is not a file name, or a scene's result cannot be written
        as asked (the message names the scene).
    OutputExistsError
        A scene's output exists but the manifest has no entry for it, or it is
        not an output xpatch finished (and ``overwrite`` is False).
    OutputError
        A done scene was computed differently (and neither ``overwrite`` nor
        ``resume="force"`` is given), or the manifest is damaged.
    OutputLockedError
        Another writer writes into the folder (or a killed one left its lock).

    Examples
    --------
    >>> import tempfile, numpy as np, xarray as xr, xpatch
    >>> scenes = {"a": xr.DataArray(np.zeros((32, 48)), dims=("y", "x")).chunk(16),
    ...           "b": xr.DataArray(np.ones((16, 16)), dims=("y", "x")).chunk(16)}
    >>> results = xpatch.patch_scenes(scenes, y=8, x=8).apply(lambda batch: batch + 1)
    >>> folder = tempfile.mkdtemp()
    >>> xpatch.write(results, folder, progress=False)  # a.zarr: 6 blocks, b.zarr: 1
    7
    >>> xpatch.write(results, folder, progress=False)  # both done: nothing to write
    0
    >>> float(xr.open_zarr(f"{folder}/b.zarr")["data"].mean())
    2.0
    """
    check_resume(resume)
    check_choice("format", format, FORMATS)
    if not isinstance(results, Mapping) or isinstance(results, xr.Dataset):
        raise OptionError(
            f"results is a {type(results).__name__}; give a mapping scene name -> DataArray or "
            "Dataset, such as ScenePatcher.apply(...) returns."
        )
    names = [str(scene) for scene in results]
    if not names:
        raise OptionError("results is empty; give at least one scene to write.")
    if len(set(names)) != len(names):
        raise OptionError(
            f"results has keys {list(results)!r} that are equal as text, which would write "
            "the same file; name the scenes uniquely."
        )
    check_scene_names(names)
    folded = [n.casefold() for n in names]
    alike = sorted({n for n, f in zip(names, folded) if folded.count(f) > 1})
    if alike:
        raise OptionError(
            f"scene names {alike!r} differ only in case: on a case-insensitive filesystem "
            "(macOS, Windows) their outputs would be one file. Name the scenes apart."
        )
    if not isinstance(folder, str | os.PathLike):
        raise OptionError(
            f"folder={folder!r} must be a local folder or an fsspec URL ('s3://bucket/run'); "
            "each scene is written into it."
        )
    suffix = Path(os.fspath(folder)).suffix.lower()
    if suffix in (*GEOTIFF_SUFFIXES, ".zarr"):
        raise OptionError(
            f"folder={os.fspath(folder)!r} names a {suffix} file, but a mapping of scenes is "
            "written into a folder, one output per scene (<folder>/<scene>.zarr or .tif). "
            f"Give a folder, e.g. {Path(os.fspath(folder)).stem!r}."
        )
    location = locate(folder, storage_options)
    if location.fs.isfile(location.root):
        raise OptionError(
            f"folder={location.name!r} is a file; scenes are written into a folder, one output "
            "per scene. Choose a folder."
        )
    kind = "geotiff" if format == "geotiff" else "zarr"
    plans = _plan(dict(zip(names, results.values())), location, kind, name, nodata, storage_options)
    manifest = Manifest(location)
    manifest.lock.acquire(break_lock=break_lock)
    try:
        # Every scene's fate is decided before any is written: a refusal writes nothing.
        for plan in plans:
            if not overwrite:
                plan.action = _decide(plan, manifest.read(plan.filename), resume, manifest.name)
        written = 0
        for plan in plans:
            if plan.action == "skip":
                continue
            if plan.action == "mark":
                tidy_complete(plan.output, break_lock)
                manifest.write(plan, "done")
                continue
            rewrite = overwrite or plan.action == "rewrite"
            # A complete output about to be replaced: until the new run's record exists,
            # it is the old computation's, and the entry must not vouch for it.
            replaced = rewrite and output_status(plan.output) == "complete"
            manifest.write(plan, "overwriting" if replaced else "started")
            written += run_output(
                plan.output, plan.fingerprint, resume, rewrite, progress, break_lock
            )
            manifest.lock.check_held()
            manifest.write(plan, "done")
    finally:
        manifest.lock.release()
        manifest.tidy()
    return written
