"""The cores this process may run on: its CPU affinity, not the machine's count."""

from __future__ import annotations

import os


def worker_count() -> int:
    """Return the number of cores this process may run on (at least one).

    Examples
    --------
    >>> worker_count() >= 1
    True
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
