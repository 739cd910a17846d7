"""What every xpatch data source shares: the chunk-local order, the fingerprint, Grain.

:class:`Source` is the base of :class:`~xpatch.grain.PatchSource`,
:class:`~xpatch.scenes.SceneSource` and :class:`~xpatch.tree.TreeSource`. A
source says how long it is, how to read item ``i``, which chunk each patch
belongs to (:meth:`Source.chunk_of_patch`, :meth:`Source.shuffle_groups`) and
what identifies it (:meth:`Source.make_fingerprint`); this class turns that into
the chunk-local shuffle (:meth:`Source.chunk_shuffle`, one implementation of the
order, the sharding and the dealing to worker processes), the cached
:attr:`Source.fingerprint` and the fingerprinted checkpoints
(:meth:`Source.with_fingerprint`). A new source subclasses it in its own folder.

The sources need only numpy; their pipeline methods import Grain
(:mod:`xpatch.grain.datasets`), which ``pip install "xarray-patch[grain]"`` brings.
"""

from __future__ import annotations

import importlib
from collections.abc import Hashable
from typing import Any

import numpy as np

from xpatch.core.shuffle import chunk_local_permutation

GRAIN_HINT = 'pip install "xarray-patch[grain]" (or pip install grain)'


def require_grain():
    """Import grain, or raise an ImportError that says what to install."""
    try:
        return importlib.import_module("grain")
    except ImportError as error:
        raise ImportError(f"this needs Grain: {GRAIN_HINT}.") from error


def mark_absl_flags_parsed() -> None:
    """Mark absl's flags parsed, which Grain's worker processes need.

    grain 0.2.18 reads absl flags when it starts worker processes and raises
    ``UnparsedFlagAccessError`` when no program parsed them (grain issue 1355),
    as in any script or notebook that does not run under ``absl.app``. Flags
    already parsed are left alone.
    """
    try:
        from absl import flags
    except ImportError:  # grain brings absl; without it there is nothing to do
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class Source:
    """Random access to patches, with a chunk-local order and a fingerprint (a base class).

    Subclasses define ``__len__``, ``__getitem__``, :attr:`patcher`,
    :attr:`variables`, :meth:`chunk_of_patch`, :meth:`shuffle_groups` and
    :meth:`make_fingerprint`, and set ``self._fingerprint = None`` when built.
    """

    _fingerprint: str | None = None

    def __len__(self) -> int:  # pragma: no cover - every source defines it
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict:  # pragma: no cover - every source defines it
        raise NotImplementedError

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        mark_absl_flags_parsed()

    @property
    def patcher(self) -> Any:  # pragma: no cover - every source defines it
        """What the source was built from (its layout)."""
        raise NotImplementedError

    @property
    def variables(self) -> tuple[Hashable, ...]:  # pragma: no cover - every source defines it
        """The data keys of an item."""
        raise NotImplementedError

    def chunk_of_patch(self) -> np.ndarray:  # pragma: no cover - every source defines it
        """For every patch, the (global) index of the chunk holding its anchor."""
        raise NotImplementedError

    def shuffle_groups(self) -> np.ndarray:  # pragma: no cover - every source defines it
        """Return the groups :meth:`chunk_shuffle` visits: a chunk per patch, or all it touches.

        ``(n,)`` group labels, or ``(n, m)`` labels, -1 padded: a patch then comes
        with the last of its groups.
        """
        raise NotImplementedError

    def make_fingerprint(self) -> str:  # pragma: no cover - every source defines it
        """Compute the 16 hex digits of :attr:`fingerprint`."""
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        """16 hex digits that identify the patches this source serves: layout and data.

        Computed on first use (``repr`` shows it) and pickled with the source; the
        same construction gives the same fingerprint in every process.
        """
        if self._fingerprint is None:
            self._fingerprint = self.make_fingerprint()
        return self._fingerprint

    # -- pipelines --------------------------------------------------------------------

    def chunk_shuffled_order(self, seed: int, epoch: int = 0) -> np.ndarray:
        """Return the patch order of a chunk-local shuffled epoch (an array of indices).

        The same order :meth:`chunk_shuffle` serves, without Grain: a sampler
        for PyTorch's ``DataLoader(src, sampler=...)`` or any other loop.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(32)
        >>> src = da_.patch(y=16, x=16).to_grain()
        >>> order = src.chunk_shuffled_order(seed=0)
        >>> sorted(order.tolist()) == list(range(16))
        True
        >>> bool((order != src.chunk_shuffled_order(seed=0, epoch=1)).any())
        True
        """
        return chunk_local_permutation(self.shuffle_groups(), seed, epoch)

    def chunk_shuffle(
        self,
        dataset: Any = None,
        *,
        seed: int,
        shard_options: Any = None,
        worker_count: int = 1,
        batch_size: int = 1,
    ) -> Any:
        """Shuffle chunk by chunk: chunks in a random order, their patches in a random order.

        Every epoch (every pass of ``len(self)`` indices, as after ``.repeat()``)
        has its own permutation, the same in every process for the same seed. One
        chunk's patches come together, so a cache much smaller than the data serves
        the epoch, where a global ``.shuffle`` reads each chunk many times: with half
        of 4 x 4 chunks cached, 1 read per chunk against 18 (figures in
        ``docs/grain.md``). A patch straddling chunk borders comes with the last of
        its chunks when the cache has room for the chunks' frames
        (:meth:`shuffle_groups`), else with the chunk of its anchor.
        Use it when the data is larger than the cache; shuffle the batches if they
        need more mixing. Its own iterators carry :attr:`fingerprint` in their state.

        Parameters
        ----------
        dataset
            A ``grain.MapDataset`` of ``len(self)`` elements whose element ``i``
            comes from patch ``i`` (``grain.MapDataset.source(src)``, maybe
            followed by ``.map``). Default: the source itself. So
            ``grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=42)``.
        seed
            The seed; ``0 <= seed < 2**32``.
        shard_options
            A ``grain.sharding.ShardOptions``: keep only this shard's share of the
            patches, a contiguous run of them in chunk order (split as Grain's
            ``IndexSampler`` splits its index), so shards do not overlap and share
            at most the chunks at their borders.
        worker_count, batch_size
            With ``.batch(batch_size)`` and ``mp_prefetch`` of ``worker_count``
            workers after the shuffle, give both: Grain hands worker ``w`` every
            ``worker_count``-th batch, so each epoch is dealt to the workers as
            contiguous runs of the chunk order, and each worker reads only its
            own chunks (in its own cache) instead of every chunk. The patches
            and their mix per epoch are unchanged.

        Returns
        -------
        grain.MapDataset

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(32)
        >>> src = da_.patch(y=16, x=16).to_grain()
        >>> order = [int(item["index"]) for item in src.chunk_shuffle(seed=0)]
        >>> chunks = src.chunk_of_patch()[order]
        >>> sorted(order) == list(range(16)), int((np.diff(chunks) != 0).sum())
        (True, 3)
        """
        require_grain()
        from xpatch.grain.datasets import chunk_shuffle

        return chunk_shuffle(self, dataset, seed, shard_options, worker_count, batch_size)

    def with_fingerprint(self, dataset: Any) -> Any:
        """Put this source's :attr:`fingerprint` in the state of ``dataset``'s iterators.

        Grain's ``MapDataset`` pipelines save only a position (``{"next_index": n}``),
        which ``set_state`` applies to a pipeline over any source. Ending a pipeline
        with ``.pipe(src.with_fingerprint)`` nests that position under the
        fingerprint; ``set_state`` then raises :class:`~xpatch.OptionError` for a
        state saved from another source, or without a fingerprint. Put it last, after
        ``mp_prefetch``: before it, a worker refuses at the first ``next`` instead.
        Iterators of ``src.chunk_shuffle(...)`` itself carry the fingerprint already.

        Parameters
        ----------
        dataset
            A ``grain.IterDataset`` over this source's patches.

        Returns
        -------
        grain.IterDataset
            The same elements; state ``{"xpatch_fingerprint", "xpatch_layout", "pipeline"}``.

        Examples
        --------
        >>> import grain, numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(32)
        >>> def pipeline(src):
        ...     return grain.MapDataset.source(src).batch(2).to_iter_dataset().pipe(
        ...         src.with_fingerprint)
        >>> src = da_.patch(y=16, x=16).to_grain()
        >>> iterator = iter(pipeline(src))
        >>> _ = next(iterator)
        >>> state = iterator.get_state()
        >>> state["xpatch_fingerprint"] == src.fingerprint, state["pipeline"]
        (True, {'next_index': 1})
        >>> iter(pipeline(da_.patch(y=16, x=16, stride=8).to_grain())).set_state(state)
        Traceback (most recent call last):
        ...
        xpatch.core.errors.OptionError: set_state: the checkpoint was saved from ...
        """
        require_grain()
        from xpatch.grain.datasets import FingerprintIterDataset

        return FingerprintIterDataset.wrap(dataset, self)
