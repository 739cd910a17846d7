"""The progress record and the writer's lock of an output, kept in the output's store.

A write that may take hours leaves, in a folder of the output's own store
(``out.zarr/.xpatch/`` for zarr, ``out.tif.xpatch-progress/`` beside a GeoTIFF):

- ``record.json``: the run's state (``"creating"``, ``"writing"``,
  ``"finishing"``) and the fingerprint of the computation (:mod:`xpatch.xarray.provenance`).
  It is replaced whole, atomically (a rename locally, one ``PUT`` on an object
  store), so it is never half-written.
- ``done/<variable>/<block>``: one empty marker per block, written after the
  block's bytes. A marker therefore means the block is in the store.
- ``lock.json``: who writes (host, process, since when, last heartbeat). It is
  created exclusively (a hard link locally, a conditional ``PUT`` on S3), so two
  writers never both hold it.

Nothing here knows the output's format; :mod:`xpatch.io.writer` drives the steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Hashable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from xpatch.core.errors import OutputError, OutputLockedError, warn

RecordState = Literal["creating", "writing", "finishing"]

#: What :meth:`WriterLock.holder_state` says of a lock's writer.
Holder = Literal["alive", "gone", "silent"]

#: The format of ``record.json``; a record of another format is refused.
RECORD_FORMAT = 1

#: How often a writer refreshes the heartbeat in its lock.
HEARTBEAT_SECONDS = 10.0

#: A lock from another machine whose heartbeat is older than this looks abandoned.
STALE_AFTER_SECONDS = 120.0


def is_local(fs: Any) -> bool:
    """Tell whether ``fs`` is the local filesystem (where renames and links are atomic)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def put_atomically(fs: Any, path: str, data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` so that readers see old or new, whole.

    Locally a temporary file is renamed over ``path``; on an object store one
    ``PUT`` replaces the object, which the store makes atomic.
    """
    if not is_local(fs):
        fs.pipe_file(path, data)
        return
    temporary = _temporary_name(path)
    Path(temporary).write_bytes(data)
    os.replace(temporary, path)


def create_exclusively(fs: Any, path: str, data: bytes) -> None:
    """Create ``path`` holding ``data``; raise ``FileExistsError`` if it exists.

    Locally the file is written aside and hard-linked into place, so it is never
    seen empty; on S3 the ``PUT`` is conditional (``If-None-Match``).
    """
    if not is_local(fs):
        fs.pipe_file(path, data, mode="create")
        return
    temporary = _temporary_name(path)
    Path(temporary).write_bytes(data)
    try:
        os.link(temporary, path)
    finally:
        os.unlink(temporary)


def _temporary_name(path: str) -> str:
    """Return a name for a temporary copy of ``path`` that says which process writes it."""
    return f"{path}.{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}.tmp"


def _writer_gone(temporary: Path, path: str) -> bool:
    """Tell whether the process of this machine that wrote ``temporary`` no longer runs."""
    ours = f"{Path(path).name}.{socket.gethostname()}-"
    if not temporary.name.startswith(ours):
        return False  # another machine's, or another naming: judged by its age alone
    pid = temporary.name[len(ours) :].partition("-")[0]
    return pid.isdigit() and not _process_exists(int(pid))


def remove_leftovers(fs: Any, path: str, older_than: float = 0.0) -> None:
    """Remove temporary files that a kill left beside ``path`` (see :func:`put_atomically`).

    A file goes when the process that wrote it no longer runs (on this machine),
    or when it is older than ``older_than`` seconds: another writer's temporary
    file, which it is about to rename or link, is left alone.
    """
    if not is_local(fs):
        return  # object stores replace keys in one PUT: no temporary files
    for leftover in Path(path).parent.glob(Path(path).name + ".*.tmp"):
        with contextlib.suppress(OSError):
            if _writer_gone(leftover, path) or time.time() - leftover.stat().st_mtime >= older_than:
                leftover.unlink()


def read_bytes(fs: Any, path: str) -> bytes | None:
    """Return the bytes at ``path``, or None if there is no such file."""
    try:
        return fs.cat_file(path)
    except FileNotFoundError:
        return None


def marker_name(variable: Hashable, index: Sequence[int]) -> str:
    """Return the marker path of a block, unambiguous for any variable name.

    The variable name is percent-encoded (dots included) in its own folder, so
    ``a`` block ``(1, 2)`` and ``a.1`` block ``(2,)`` differ, and ``/`` or ``..``
    in a name stay inside the record.

    Examples
    --------
    >>> marker_name("a", (1, 2)), marker_name("a.1", (2,)), marker_name("x/..", ())
    ('v-a/1.2', 'v-a%2E1/2', 'v-x%2F%2E%2E/0')
    """
    encoded = quote(str(variable), safe="").replace(".", "%2E")
    return f"v-{encoded}/{'.'.join(map(str, index)) or '0'}"


def write_marker(fs: Any, path: str) -> None:
    """Write an empty marker file (after the block it stands for is stored)."""
    if is_local(fs):
        Path(path).touch()
    else:
        fs.pipe_file(path, b"")


class ProgressRecord:
    """The record of one output's unfinished run, in the folder ``folder`` of ``fs``.

    Parameters
    ----------
    fs
        The output's fsspec filesystem.
    folder
        The record's folder on ``fs``.
    output
        How to name the output in messages.
    """

    def __init__(self, fs: Any, folder: str, output: str) -> None:
        self.fs = fs
        self.folder = folder.rstrip("/")
        self.output = output

    @property
    def record_path(self) -> str:
        """The path of ``record.json``."""
        return f"{self.folder}/record.json"

    @property
    def done_folder(self) -> str:
        """The folder of the block markers."""
        return f"{self.folder}/done"

    def marker(self, variable: Hashable, index: Sequence[int]) -> str:
        """Return the path of the marker of block ``index`` of ``variable``."""
        return f"{self.done_folder}/{marker_name(variable, index)}"

    def read(self) -> dict | None:
        """Return the record, or None if there is none.

        Raises
        ------
        OutputError
            If ``record.json`` cannot be read as a record of this format.
        """
        data = read_bytes(self.fs, self.record_path)
        if data is None:
            return None
        try:
            record = json.loads(data)
            if (
                record.get("format") != RECORD_FORMAT
                or record.get("state") not in ("creating", "writing", "finishing")
                or not isinstance(record.get("fingerprint"), dict)
                or not isinstance(record["fingerprint"].get("variables"), dict)
                or not all(isinstance(v, dict) for v in record["fingerprint"]["variables"].values())
            ):
                raise ValueError("not a record of this format")
        except (ValueError, AttributeError) as error:
            raise OutputError(
                f"the progress record {self.record_path!r} of {self.output!r} is damaged "
                f"({error}); start again with overwrite=True (xpatch apply --restart), or "
                f"delete {self.folder!r} and the output."
            ) from None
        return record

    def write(self, state: RecordState, fingerprint: dict) -> None:
        """Replace the record with ``state`` and ``fingerprint``, atomically."""
        record = {
            "format": RECORD_FORMAT,
            "state": state,
            "fingerprint": fingerprint,
            "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        self.fs.makedirs(self.folder, exist_ok=True)
        put_atomically(self.fs, self.record_path, json.dumps(record, indent=1).encode())

    def prepare_markers(self, variables: Iterable[Hashable]) -> None:
        """Create the marker folders (needed on a local filesystem only)."""
        if is_local(self.fs):
            for variable in variables:
                folder = self.marker(variable, ()).rsplit("/", 1)[0]
                self.fs.makedirs(folder, exist_ok=True)

    def done(self) -> set[str]:
        """Return the paths of the markers written so far (one listing, not one per block)."""
        try:
            found = self.fs.find(self.done_folder)
        except FileNotFoundError:
            return set()
        # fsspec returns paths without a leading slash on some stores; compare on suffixes.
        return {f"{self.done_folder}/{path.rsplit('/done/', 1)[1]}" for path in found}

    def clear_markers(self) -> None:
        """Remove every marker (a fresh run starts with none)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.done_folder, recursive=True)

    def remove(self) -> None:
        """Remove the record: ``record.json`` first (one atomic delete), then the markers.

        Once ``record.json`` is gone the output counts as complete; markers left
        by a kill after that are removed by the next run, and so are temporary
        copies of ``record.json`` that a kill left mid-replacement (only the lock's
        holder writes them, so none is in flight).
        """
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.record_path)
        self.clear_markers()
        remove_leftovers(self.fs, self.record_path)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """Return when process ``pid`` started (clock ticks since boot), '' if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _process_state(pid: int) -> str:
    """Return the state letter of process ``pid`` ('Z' for a zombie), '' if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


class WriterLock:
    """One writer at a time: an exclusive ``lock.json`` in the record's folder.

    The holder refreshes a heartbeat in it every :data:`HEARTBEAT_SECONDS`. A
    lock whose writer is provably gone (same machine and boot, and its process no
    longer exists) is taken over with a warning; one from another machine whose
    heartbeat is older than :data:`STALE_AFTER_SECONDS` is named stale and taken
    over only when asked (``break_lock=True``); a live one never is.

    Parameters
    ----------
    fs
        The output's fsspec filesystem.
    folder
        The record's folder on ``fs``.
    output
        How to name the output in messages.
    """

    def __init__(self, fs: Any, folder: str, output: str) -> None:
        self.fs = fs
        self.path = f"{folder.rstrip('/')}/lock.json"
        self.folder = folder.rstrip("/")
        self.output = output
        self.owner = uuid.uuid4().hex
        self.since = time.time()
        self.lost: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._claim: str | None = None

    def content(self) -> dict:
        """Return what this writer puts in the lock: who it is, since when, its heartbeat."""
        return {
            "owner": self.owner,
            "host": socket.gethostname(),
            "boot": _boot_id(),
            "pid": os.getpid(),
            "pid_start": _process_start(os.getpid()),
            "since": self.since,
            "heartbeat": time.time(),
            "command": " ".join(sys.argv)[:300],
        }

    def holder(self) -> dict | None:
        """Return the lock's content, None if there is no lock, ``{}`` if unreadable."""
        data = read_bytes(self.fs, self.path)
        if data is None:
            return None
        try:
            info = json.loads(data)
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    def describe(self, info: dict) -> tuple[bool, str]:
        """Return whether the holder ``info`` is stale, and who it is, in words."""
        state, who = self.holder_state(info)
        return state != "alive", who

    def holder_state(self, info: dict) -> tuple[Holder, str]:
        """Return whether the holder ``info`` is alive, gone or silent, and who it is.

        ``"gone"``: provably (this machine and boot, and its process no longer runs,
        or is a zombie, or its pid is another process's now). ``"silent"``: another
        machine's writer whose heartbeat is older than :data:`STALE_AFTER_SECONDS`,
        which may still run (a network partition). ``"alive"`` otherwise.
        """
        if not info:
            return "alive", f"an unreadable lock {self.path!r}"
        since = datetime.fromtimestamp(info.get("since", 0), UTC).isoformat(timespec="seconds")
        who = (
            f"process {info.get('pid')} on {info.get('host')!r} since {since} "
            f"({info.get('command', '')!r})"
        )
        same_machine = info.get("host") == socket.gethostname() and info.get("boot") == _boot_id()
        if same_machine:
            pid = int(info.get("pid", -1))
            # A killed writer that its parent has not reaped yet is a zombie: its pid
            # still answers, but it will never write again.
            alive = (
                _process_exists(pid)
                and _process_start(pid) == info.get("pid_start")
                and _process_state(pid) not in ("Z", "X")
            )
            if alive:
                return "alive", who
            return "gone", f"{who}, which no longer runs (it was killed)"
        age = time.time() - float(info.get("heartbeat", 0))
        if age > STALE_AFTER_SECONDS:
            return "silent", f"{who}, whose last heartbeat was {_ago(age)}"
        return "alive", f"{who}, last heartbeat {_ago(age)}"

    def acquire(self, break_lock: bool = False) -> None:
        """Take the lock, or raise :class:`OutputLockedError` saying who holds it.

        A lock whose writer is provably gone (:meth:`holder_state`) is taken over
        at once, with a warning that says whose it was: an OOM kill or a
        scheduler's time limit needs no second command. One writer takes it over:
        the takeover is claimed by an exclusive ``lock.json.takeover-<owner>``.

        Parameters
        ----------
        break_lock
            Also take over a silent lock (another machine's writer that stopped
            beating, which may still run). A live writer's lock is never taken.
        """
        self.fs.makedirs(self.folder, exist_ok=True)
        try:
            self._acquire(break_lock)
        finally:
            self._forget_takeover()  # taken, or refused: the claim has done its work

    def _acquire(self, break_lock: bool) -> None:
        for _attempt in range(5):
            try:
                create_exclusively(self.fs, self.path, json.dumps(self.content()).encode())
            except FileExistsError:
                info = self.holder()
                if info is None:
                    continue  # released between our attempt and the read
                state, who = self.holder_state(info)
                if state == "alive" and info:
                    raise OutputLockedError(
                        f"another writer is writing {self.output!r}: {who}. Wait for it to "
                        "finish, stop it, or write elsewhere."
                    ) from None
                if state != "gone" and not break_lock:
                    raise OutputLockedError(
                        f"{self.output!r} is locked by {who}. If no other writer is running, "
                        "pass break_lock=True (xpatch apply --break-lock) to take the lock "
                        "over; the run resumes from its progress record."
                    ) from None
                if self._take_over(info) and state == "gone" and not break_lock:
                    warn(
                        f"took over the lock of {self.output!r} from {who}; the run resumes "
                        "from its progress record."
                    )
                continue
            self._start_heartbeat()
            return
        raise OutputLockedError(
            f"could not take the lock {self.path!r} of {self.output!r}: other writers keep "
            "taking it. Make sure one writer runs at a time."
        )

    def _take_over(self, info: dict) -> bool:
        """Remove the stale lock ``info`` if this writer wins the claim to it; say if it did.

        Two writers that find one stale lock both try to claim it; the loser finds
        the winner's lock at its next attempt. A claim whose claimer is gone too
        (killed between its claim and its lock) is removed, and claimed again.
        """
        self._claim = f"{self.path}.takeover-{info.get('owner', 'unreadable')}"
        try:
            create_exclusively(self.fs, self._claim, json.dumps(self.content()).encode())
        except FileExistsError:
            if self._claimer_state(self._claim) == "gone":
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self._claim)
            self._claim = None
            return False
        current = self.holder()
        if current is not None and current.get("owner") == info.get("owner"):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self.path)
        return True

    def _forget_takeover(self) -> None:
        claim, self._claim = getattr(self, "_claim", None), None
        if claim is not None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(claim)

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="xpatch-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                info = self.holder()
                if not info or info.get("owner") != self.owner:
                    self.lost = info or {}
                    return
                put_atomically(self.fs, self.path, json.dumps(self.content()).encode())
            except OSError:  # a store hiccup: the next beat tries again
                continue

    def check_held(self) -> None:
        """Raise :class:`OutputLockedError` if another writer took the lock over."""
        info = self.holder()
        if self.lost is not None or not info or info.get("owner") != self.owner:
            who = self.describe(info)[1] if info else "nobody (the lock was removed)"
            raise OutputLockedError(
                f"the lock of {self.output!r} was taken over by {who} while this writer ran; "
                "this run stops without finishing the output. Let the other writer finish, "
                "or restart with overwrite=True once it has stopped."
            )

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if this writer still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        info = self.holder()
        if info and info.get("owner") == self.owner:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self.path)
        # A writer killed while creating the lock left its copy; a live one links its
        # copy within milliseconds.
        remove_leftovers(self.fs, self.path, older_than=STALE_AFTER_SECONDS)
        self._remove_abandoned_claims()

    def _remove_abandoned_claims(self) -> None:
        """Remove takeover claims whose claimer is gone (killed mid-takeover).

        Such a claim names a lock nobody will take over again, and would keep the
        record's folder from being removed with the finished output.
        """
        with contextlib.suppress(FileNotFoundError):
            claims = self.fs.glob(f"{self.path}.takeover-*")
            for claim in claims:
                if self._claimer_state(claim) in ("gone", "silent"):
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(claim)

    def _claimer_state(self, claim: str) -> Holder | None:
        """Return the state of the writer that made the takeover claim ``claim``.

        None when the claim is gone (its claimer finished) or unreadable.
        """
        data = read_bytes(self.fs, claim)
        try:
            claimer = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return self.holder_state(claimer)[0] if isinstance(claimer, dict) and claimer else None
