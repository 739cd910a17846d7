"""Writing results out of core, and opening inputs: :func:`write`, :func:`compute`.

See :mod:`xpatch.io.writer` for how a write goes, step by step.
"""

from xpatch.io.steps import (
    FORMATS,
    GEOTIFF_SUFFIXES,
    Format,
    Resume,
    compute,
    output_format,
    progress_record,
    run_store_tasks,
)
from xpatch.io.writer import write

__all__ = [
    "FORMATS",
    "GEOTIFF_SUFFIXES",
    "Format",
    "Resume",
    "compute",
    "output_format",
    "progress_record",
    "run_store_tasks",
    "write",
]
