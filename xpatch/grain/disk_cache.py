"""Decoded chunks kept on local disk, so that later epochs read them from there.

A :class:`~xpatch.grain.PatchSource` built with ``cache_dir=`` writes every zarr
chunk it decodes to ``cache_dir/<fingerprint>/<variable>/<i.j.k>.chunk`` and reads it
from there the next time, in any process: the next epoch, the workers of
``mp_prefetch``, the other ranks of a training on one machine. A second epoch over an
object store then reads local disk, not the bucket.

The file is the chunk's raw bytes after a header of :data:`HEADER_BYTES` (its chunk
coordinates, dtype, shape, length and CRC-32). Raw bytes because that is what reads fastest: one
``readinto`` from the page cache straight into the array served, no decoding, no
parsing beyond a short header (``np.load`` parses a Python literal and allocates
the same way but carries no checksum; a memory map would defer the read to the
first patch cut from it, on the thread that cuts, and the checksum reads every page
anyway). The CRC-32 costs about 1 ms per 2 MB chunk, less than decompressing it.

Safe with one writer and many readers, and after a kill: a chunk is written to a
temporary file in the same folder and renamed over its name (``os.replace``,
atomic), so a reader sees the whole file or none. A file that is not whole all the
same (a file system without atomic renames, a crash of the machine before its
pages reached the disk, a full disk) fails its length or checksum, and a whole file
under another chunk's name (a writer's temporary file renamed over the wrong name by
such a file system) fails its coordinates: it is read again from the store and written
again, never served. Two processes writing the same
chunk write the same bytes; the last rename wins. Temporary files left by a killed
writer are removed once they are an hour old.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Bytes before a chunk's values: the magic and a JSON header padded with spaces.
HEADER_BYTES = 256
MAGIC = b"XPCHUNK1"
#: A temporary file older than this was left by a writer that died: removed.
STALE_SECONDS = 3600.0
SUFFIX = ".chunk"
TEMP_PREFIX = ".tmp-"


@dataclass
class DiskStats:
    """Counts of what one process's disk cache of one variable did.

    ``hits`` served from disk, ``misses`` (not there, or not whole), ``writes`` and
    ``rejected`` (files that failed their length or checksum and were read again
    from the store).
    """

    hits: int = 0
    misses: int = 0
    writes: int = 0
    rejected: int = 0


def folder_name(name: Hashable) -> str:
    """Return a file-system-safe folder name for variable ``name``, distinct per name.

    Examples
    --------
    >>> folder_name("t2m").startswith("t2m-"), folder_name("a/b") != folder_name("a_b")
    (True, True)
    """
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:40]
    digest = hashlib.sha1(repr(name).encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


class DiskChunks:
    """The decoded chunks of one variable, as files under ``root/fingerprint/variable``.

    Pickles as its folder: every process opens the files itself.

    Parameters
    ----------
    root
        The cache folder given as ``cache_dir``.
    fingerprint
        The source's fingerprint: data and layout; another never reads these files.
    variable
        The variable's name in the source.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> disk = DiskChunks(tempfile.mkdtemp(), "0123456789abcdef", "v")
    >>> disk.get((0, 1), (2, 3), np.dtype("f4")) is None
    True
    >>> disk.put((0, 1), np.arange(6, dtype="f4").reshape(2, 3))
    >>> disk.get((0, 1), (2, 3), np.dtype("f4")).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """

    def __init__(self, root: str | os.PathLike, fingerprint: str, variable: Hashable) -> None:
        self.folder = Path(root) / fingerprint / folder_name(variable)
        self.stats = DiskStats()
        self._made = False
        self._warned = False
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"folder": self.folder}

    def __setstate__(self, state: dict) -> None:
        self.folder = state["folder"]
        self.stats = DiskStats()
        self._made = False
        self._warned = False
        self._lock = threading.Lock()

    def path(self, coords: Sequence[int]) -> Path:
        """Return the file of the chunk at chunk coordinates ``coords``."""
        return self.folder / (".".join(str(int(c)) for c in coords) + SUFFIX)

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)

    def get(
        self, coords: Sequence[int], shape: Sequence[int], dtype: np.dtype
    ) -> np.ndarray | None:
        """Return the chunk at ``coords`` as stored on disk, or None if it is not there whole.

        None too when its header names other chunk coordinates, another dtype or
        shape, or its length or checksum is wrong: the caller reads the store and
        :meth:`put` replaces it.
        """
        try:
            handle = open(self.path(coords), "rb", buffering=0)
        except OSError:
            self._count("misses")
            return None
        with handle:
            values = _read_whole(
                handle, tuple(int(n) for n in shape), np.dtype(dtype), _coords(coords)
            )
        self._count("misses" if values is None else "hits")
        if values is None and self.path(coords).exists():
            self._count("rejected")
        return values

    def put(self, coords: Sequence[int], values: np.ndarray) -> None:
        """Write chunk ``coords`` (a temporary file renamed over its name: atomic).

        A failed write (a full disk, a folder not writable) leaves no file and
        warns once per process: the chunk was read all the same, only not kept.
        """
        values = np.ascontiguousarray(values)
        data = values.reshape(-1).view(np.uint8)
        header = _header(values, zlib.crc32(data), _coords(coords))
        temp = None
        try:
            self._make_folder()
            fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".part", dir=self.folder)
            if hasattr(os, "fchmod"):  # other processes, other ranks read it too
                os.fchmod(fd, 0o644)
            _write_file(fd, header, data)
            os.replace(temp, self.path(coords))
            temp = None
            self._count("writes")
        except OSError as error:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"could not write a decoded chunk to the disk cache {self.folder} "
                    f"({type(error).__name__}: {error}); chunks not written are read from "
                    "the store again next epoch. Free space or give another cache_dir.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        finally:
            if temp is not None:
                try:
                    os.unlink(temp)
                except OSError:
                    pass

    def clear(self) -> None:
        """Remove every file of this variable (other processes read the store for them)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self._made = False

    def _make_folder(self) -> None:
        if self._made:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        # What writers killed long ago left behind: a live writer's file is younger.
        now = time.time()
        for entry in os.scandir(self.folder):
            if entry.name.startswith(TEMP_PREFIX):
                try:
                    if now - entry.stat().st_mtime > STALE_SECONDS:
                        os.unlink(entry.path)
                except OSError:
                    pass
        self._made = True


def _coords(coords: Sequence[int]) -> list[int]:
    return [int(c) for c in coords]


def _header(values: np.ndarray, crc: int, coords: list[int]) -> bytes:
    info = {
        "coords": coords,
        "dtype": values.dtype.str,
        "shape": list(values.shape),
        "nbytes": values.nbytes,
    }
    text = json.dumps({**info, "crc32": crc}).encode()
    room = HEADER_BYTES - len(MAGIC) - 1
    if len(text) > room:
        raise OSError(f"a chunk header of {len(text)} bytes does not fit in {room}")
    return MAGIC + text.ljust(room) + b"\n"


def _write_file(fd: int, header: bytes, data: np.ndarray) -> None:
    # Written whole (a buffered file writes until done or raises); no fsync: a killed
    # process's pages stay in the page cache, and a crash of the machine is what the
    # checksum is for.
    with os.fdopen(fd, "wb") as handle:
        handle.write(header)
        handle.write(memoryview(data))


def _read_whole(
    handle, shape: tuple[int, ...], dtype: np.dtype, coords: list[int]
) -> np.ndarray | None:
    head = handle.read(HEADER_BYTES)
    if len(head) != HEADER_BYTES or not head.startswith(MAGIC):
        return None
    try:
        info = json.loads(head[len(MAGIC) :])
    except ValueError:
        return None
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if (
        info.get("coords") != coords
        or info.get("dtype") != dtype.str
        or tuple(info.get("shape", ())) != shape
        or info.get("nbytes") != nbytes
        or os.fstat(handle.fileno()).st_size != HEADER_BYTES + nbytes
    ):
        return None
    values = np.empty(shape, dtype)
    data = memoryview(values.reshape(-1).view(np.uint8))
    done = 0
    while done < nbytes:  # one read from the page cache, straight into the array served
        got = handle.readinto(data[done:])
        if not got:
            return None
        done += got
    if zlib.crc32(data) != info.get("crc32"):
        return None
    return values
