"""Temporary folders that a killed process does not leave behind for good.

A write that spills overhang pieces to disk (:class:`xpatch.io.block_waves.OverhangSpill`)
removes its folder when it ends, failed or not. A process killed by SIGKILL (or
the kernel's OOM killer) cannot, and its files would stay in the temporary
directory until the machine's own clean-up. So each folder holds an exclusive
``flock`` on itself for as long as its process lives; the kernel drops the lock
when the process dies, however it died. Before it makes a folder, a process
removes the folders of its user and its host that nobody locks
(:func:`remove_stale`).

What keeps a live folder:

- its lock. A child the process forked holds the lock too, until it exits;
- its host's name in its own: on a ``TMPDIR`` that several machines share, locks
  may be local to each (NFS mounted ``nolock``), and only the owner's machine
  can tell whether the owner lives;
- :data:`STALE_SECONDS`: a folder is unlocked for a moment after it is made,
  before its lock is taken, and folders changed within that time are kept;
- a ``.unlocked`` mark, left by a process whose filesystem refused its lock:
  such a folder is removed by its process only.

Where ``fcntl`` is missing (Windows), folders are neither locked nor swept.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

#: Seconds since its last change before an unlocked folder counts as left behind.
STALE_SECONDS = 60.0

#: The file that marks a folder whose process could not lock it.
UNLOCKED_MARK = ".unlocked"


def folder_prefix() -> str:
    """Return the name prefix of this host's spill folders: ``xpatch-overhangs-<host>@``.

    The ``@`` ends the host's name, which never holds one: host ``a`` does not take
    the folders of host ``a-b`` for its own.

    Examples
    --------
    >>> folder_prefix().startswith("xpatch-overhangs-") and folder_prefix().endswith("@")
    True
    """
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64]
    return f"xpatch-overhangs-{host}@"


class LockedFolder:
    """A new temporary folder, locked until :meth:`remove` or the end of its process.

    Made under :func:`tempfile.gettempdir` (``TMPDIR``), after the folders that
    killed processes left there are removed (:func:`remove_stale`).

    Raises
    ------
    OSError
        If the folder cannot be made or opened; nothing is left behind then.

    Examples
    --------
    >>> folder = LockedFolder()
    >>> os.path.basename(folder.path).startswith(folder_prefix()), os.path.isdir(folder.path)
    (True, True)
    >>> folder.remove()
    >>> os.path.exists(folder.path)
    False
    """

    def __init__(self) -> None:
        prefix = folder_prefix()
        remove_stale(tempfile.gettempdir())
        self.path = tempfile.mkdtemp(prefix=prefix)
        self._fd: int | None = None
        if fcntl is None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        try:  # nobody else holds it: a sweeper leaves a folder this young alone
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            # A filesystem that refuses locks: the mark keeps sweepers away, for good.
            os.close(fd)
            try:
                with open(os.path.join(self.path, UNLOCKED_MARK), "w"):
                    pass
            except OSError:
                shutil.rmtree(self.path, ignore_errors=True)
                raise
        else:
            self._fd = fd

    def remove(self) -> None:
        """Remove the folder and its files, then drop the lock."""
        # Locked until its files are gone: no sweeper ever shares the removal.
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_stale(root: str) -> list[str]:
    """Remove the spill folders that killed processes left under ``root``.

    A folder goes if its name has this host's prefix (:func:`folder_prefix`), it
    is a folder of this user (not a link), it was not changed within
    :data:`STALE_SECONDS`, it has no ``.unlocked`` mark, and no process holds its
    lock.

    Parameters
    ----------
    root
        The temporary directory to sweep.

    Returns
    -------
    list of str
        The paths removed.

    Examples
    --------
    >>> root = tempfile.mkdtemp()
    >>> left = tempfile.mkdtemp(prefix=folder_prefix(), dir=root)  # as a killed process leaves it
    >>> os.utime(left, (0, 0))  # last changed in 1970
    >>> remove_stale(root) == [left], os.listdir(root)
    (True, [])
    >>> os.rmdir(root)
    """
    if fcntl is None:
        return []
    prefix = folder_prefix()
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
            stat = entry.stat(follow_symlinks=False)
            if stat.st_uid != os.getuid() or now - stat.st_mtime < STALE_SECONDS:
                continue
            if os.path.lexists(os.path.join(entry.path, UNLOCKED_MARK)):
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # a file or a link (never followed), gone meanwhile, or not ours
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The folder locked is the one at the path (not one made there since).
            opened, now_there = os.fstat(fd), os.lstat(entry.path)
            if (opened.st_dev, opened.st_ino) != (now_there.st_dev, now_there.st_ino):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # its process lives (or the folder went meanwhile)
            continue
        finally:
            os.close(fd)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    return removed
