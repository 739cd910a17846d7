"""Temporary folders that a killed process does not leave behind for good.

A write that spills overhang pieces to disk (:class:`xpatch.waves.OverhangSpill`)
removes its folder when it ends, failed or not. A process killed by SIGKILL (or
the kernel's OOM killer) cannot, and its files would stay in the temporary
directory until the machine's own clean-up. So each folder holds an exclusive
``flock`` on itself for as long as its process lives; the kernel drops the lock
when the process dies, however it died. Before it makes a folder, a process
removes the folders of its user that nobody locks (:func:`remove_stale`).

A folder is unlocked for a moment after it is made, before its lock is taken:
folders changed within :data:`STALE_SECONDS` are left alone, so that the clean-up
of one process never takes the folder another is just making. Where ``fcntl`` is
missing (Windows), folders are neither locked nor cleaned up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

#: Name prefix of the folders of spilled overhang pieces.
PREFIX = "xpatch-overhangs-"

#: Seconds since its last change before an unlocked folder counts as left behind.
STALE_SECONDS = 60.0


class LockedFolder:
    """A new temporary folder, locked until :meth:`remove` (or its process's end).

    Examples
    --------
    >>> folder = LockedFolder()
    >>> os.path.basename(folder.path).startswith(PREFIX), os.path.isdir(folder.path)
    (True, True)
    >>> folder.remove()
    >>> os.path.exists(folder.path)
    False
    """

    def __init__(self, prefix: str = PREFIX) -> None:
        remove_stale(tempfile.gettempdir(), prefix)
        self.path = tempfile.mkdtemp(prefix=prefix)
        self._fd: int | None = None
        if fcntl is not None:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # nobody else holds it: a sweeper leaves a folder this young alone
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a filesystem without locks: no sweeper can take it either
                os.close(fd)
            else:
                self._fd = fd

    def remove(self) -> None:
        """Remove the folder and its files, then drop the lock."""
        # The lock is held until the files are gone: a sweeper never races this.
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_stale(root: str, prefix: str = PREFIX) -> list[str]:
    """Remove the folders ``prefix*`` of this user under ``root`` that no live process locks.

    Folders changed within :data:`STALE_SECONDS` are kept, locked or not. Returns
    the paths removed.

    Examples
    --------
    >>> root = tempfile.mkdtemp()
    >>> left = tempfile.mkdtemp(prefix=PREFIX, dir=root)  # as a killed process leaves it
    >>> os.utime(left, (0, 0))  # last changed in 1970
    >>> remove_stale(root) == [left], os.listdir(root)
    (True, [])
    >>> os.rmdir(root)
    """
    if fcntl is None:
        return []
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            if stat.st_uid != os.getuid() or now - stat.st_mtime < STALE_SECONDS:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its process lives (or the filesystem has no locks)
            os.close(fd)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        os.close(fd)
        removed.append(entry.path)
    return removed
