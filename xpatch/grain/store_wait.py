"""How long a read waited for a store's bytes, told by the reader that fetched them.

Reads ahead (:mod:`xpatch.grain.readahead`) send more reads where a store answers
late: they need the time spent waiting for bytes, not the time spent decoding
them (more reads in flight hide a wait; they only slow decoding down). A reader
that knows when it waits for a store (:class:`~xpatch.grain.zarr_chunks.ZarrChunks`)
adds that time with :func:`note_store_wait`; :func:`store_wait` collects what the
reads of one thread noted meanwhile. Readers that do not say (dask's) count 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_local = threading.local()


@dataclass
class StoreWait:
    """Seconds the reads of one thread waited for store bytes (see :func:`store_wait`)."""

    seconds: float = 0.0


def note_store_wait(seconds: float) -> None:
    """Add ``seconds`` waited for a store's bytes to the wait this thread measures, if any."""
    measuring = getattr(_local, "wait", None)
    if measuring is not None:
        measuring.seconds += seconds


@contextmanager
def store_wait() -> Iterator[StoreWait]:
    """Measure the store waits the reads on this thread note while the block runs.

    Examples
    --------
    >>> with store_wait() as waited:
    ...     note_store_wait(0.02)
    ...     note_store_wait(0.01)
    >>> round(waited.seconds, 3)
    0.03
    >>> note_store_wait(1.0)  # no measure open on this thread: nothing to add to
    """
    outer = getattr(_local, "wait", None)
    _local.wait = waited = StoreWait()
    try:
        yield waited
    finally:
        _local.wait = outer
        if outer is not None:
            outer.seconds += waited.seconds
