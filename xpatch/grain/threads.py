"""The threads xpatch starts to read: daemons that end when idle, and the interpreter's end.

A pipeline stopped early (a ``break`` out of an epoch, an iterator dropped) leaves
nothing to tell its sources that nobody will ask for the rest. Threads that live
as long as the process, as a ``ThreadPoolExecutor``'s do, outlive the pipeline
that started them, and keep the interpreter from exiting while they are not
daemons. :class:`IdlePool` runs work on daemon threads that end after
:data:`IDLE_SECONDS` without any, so a dropped pipeline's threads go with it.

:func:`closing` says when the interpreter has begun to exit (the main thread
returned): Grain's read threads then still run every read its dropped iterators
had queued (500 by default, ``.repeat()`` never runs out of them), and a read
must take no longer than the read itself: no waiting for other reads, nothing
read ahead (:mod:`xpatch.grain.readahead`).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first: see _mark_closing)
import itertools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

#: A thread of an :class:`IdlePool` ends after this long without work: long beside
#: the gaps between two reads of a running pipeline, short beside a script's end.
IDLE_SECONDS = 1.0

_closing = threading.Event()


def closing() -> bool:
    """Whether the interpreter has begun to exit: reads then wait for nothing.

    Examples
    --------
    >>> closing()
    False
    """
    return _closing.is_set()


def _mark_closing() -> None:
    _closing.set()


# Called when the main thread returns, before the interpreter joins the threads that
# are not daemons (Grain's among them). Hooks run newest first: registered after
# concurrent.futures' own (imported above), this runs before that one joins them.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    try:
        _register(_mark_closing)
    except RuntimeError:  # imported while the interpreter exits
        _closing.set()


#: Every pool of this process: a child forked from it has none of their threads.
_pools: weakref.WeakSet[IdlePool] = weakref.WeakSet()


def _forget_threads() -> None:
    for pool in list(_pools):
        pool._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads)


class IdlePool:
    """Run callables on at most ``size`` daemon threads, each ending when idle.

    Threads start as work comes and end after :data:`IDLE_SECONDS` without any,
    so none outlives the pipeline that gave it work by more than that, and none
    keeps the interpreter from exiting.

    Parameters
    ----------
    size
        Most threads at once.
    name
        Prefix of the threads' names: ``f"{name}_{n}"``.

    Examples
    --------
    >>> pool = IdlePool(2, "xpatch-example")
    >>> [f.result() for f in [pool.submit(pow, 2, k) for k in range(4)]]
    [1, 2, 4, 8]
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = max(int(size), 1)
        self._name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue: deque[tuple[Future, Callable[..., Any], tuple]] = deque()
        self._threads = 0
        self._idle = 0
        self._numbers = itertools.count()
        _pools.add(self)

    def _forked(self) -> None:
        # In a forked child: the parent's threads are not here, its queued work is the parent's.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue = deque()
        self._threads = self._idle = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a thread of the pool; return its future."""
        future: Future = Future()
        with self._lock:
            self._queue.append((future, fn, args))
            if self._idle >= len(self._queue):
                self._work.notify()
                return future
            if self._threads >= self._size:
                return future  # a busy thread takes it next
            self._threads += 1
        name = f"{self._name}_{next(self._numbers)}"
        try:
            threading.Thread(target=self._run, name=name, daemon=True).start()
        except RuntimeError as error:  # no new threads (the interpreter exits)
            with self._lock:
                self._threads -= 1
                orphaned = self._threads == 0 and (future, fn, args) in self._queue
                if orphaned:
                    self._queue.remove((future, fn, args))
            if orphaned:
                future.set_exception(error)
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                deadline = time.monotonic() + IDLE_SECONDS
                while not self._queue:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._work.wait(left)
                    self._idle -= 1
                future, fn, args = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as error:  # the caller's future holds it
                future.set_exception(error)
            else:
                future.set_result(result)
            del future, fn, args  # nothing of the work outlives it while the thread idles
