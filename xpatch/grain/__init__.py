"""Training with Grain (and PyTorch): data sources over patches, and their pipelines.

The sources need only numpy: :class:`PatchSource` (one patched array or Dataset),
:class:`BatchSource` (whole batches of a source, gathered chunk by chunk);
every source shares :class:`~xpatch.grain.base.Source` (the chunk-local order, the
fingerprint, the checkpoints). Their pipeline methods (``chunk_shuffle``,
``with_fingerprint``) need ``pip install "xarray-patch[grain]"``;
:mod:`xpatch.grain.datasets` imports grain.
"""

from xpatch.core.malloc import bound_arenas
from xpatch.grain.base import GRAIN_HINT, Source, mark_absl_flags_parsed, require_grain
from xpatch.grain.batches import BatchSource
from xpatch.grain.distributed import RankSampler
from xpatch.grain.source import ITEM_KEYS, PatchSource

# Now, before a store starts threads: each thread's first allocation makes an arena
# while glibc's limit allows, and the limit is fixed once more than eight exist (an
# xr.open_zarr over obstore made 11 before the first read; a BatchSource epoch of
# insitubatch's ERA5 case then peaked at 357 MiB, 270 MiB with two arenas).
bound_arenas()

__all__ = [
    "GRAIN_HINT",
    "ITEM_KEYS",
    "BatchSource",
    "PatchSource",
    "RankSampler",
    "Source",
    "mark_absl_flags_parsed",
    "require_grain",
]
