"""Sliding-window inference: cut patches, run a batched function, blend the results.

One path for one output and for several: ``fn`` returns an array (the output
``None``) or a dict of arrays (one per declared name), and every output is blended
as :mod:`xpatch.core.blend` blends it. :class:`InferenceSetup` holds what one inference fixes
(the model and its batches, the padding, the window and the reduction);
:func:`run_batches` calls ``fn`` and checks what it returns (:mod:`.batches`).
:func:`apply_numpy` runs eagerly (:mod:`.eager`), :func:`apply_dask` builds one lazy
graph (:mod:`.lazy`).
"""

from xpatch.core.apply.batches import (
    BatchFunction,
    InferenceSetup,
    Output,
    check_declared,
    check_returned,
    returned_weights,
    run_batches,
)
from xpatch.core.apply.eager import apply_numpy
from xpatch.core.apply.lazy import apply_dask, block_limit

__all__ = [
    "BatchFunction",
    "InferenceSetup",
    "Output",
    "apply_dask",
    "apply_numpy",
    "block_limit",
    "check_declared",
    "check_returned",
    "returned_weights",
    "run_batches",
]
