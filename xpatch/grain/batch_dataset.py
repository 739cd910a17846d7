"""The Grain dataset of a :class:`~xpatch.grain.batches.BatchSource`: epochs kept, fingerprinted.

This module imports grain; :mod:`xpatch.grain.batches` imports it only when
:meth:`~xpatch.grain.batches.BatchSource.dataset` is called.

``grain.MapDataset.source(batches)`` takes every index modulo the source's length,
so after ``.repeat()`` each epoch would serve the first epoch's batches again.
:class:`BatchMapDataset` hands the index as it is: batch ``i`` of
``.repeat()`` is batch ``i % len`` of epoch ``i // len``.
"""

from __future__ import annotations

from typing import Any

import grain

from xpatch.grain.datasets import FingerprintIterDataset


class BatchMapDataset(grain.MapDataset):
    """A ``grain.MapDataset`` whose element ``i`` is ``batches[i]``, epochs included.

    Parameters
    ----------
    batches
        The :class:`~xpatch.grain.batches.BatchSource` served.
    """

    def __init__(self, batches: Any) -> None:
        super().__init__()
        self._batches = batches

    def __len__(self) -> int:
        return len(self._batches)

    def __str__(self) -> str:
        return f"BatchMapDataset(fingerprint={self._batches.fingerprint})"

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._batches[int(index)]

    def slice(self, sl: slice) -> grain.MapDataset:
        """``grain.MapDataset.slice``; a step tells the batches how many workers share them.

        Grain's ``mp_prefetch`` gives worker ``w`` of ``W`` the slice ``w::W`` of the
        dataset before its prefetch: that process then knows its batches are every
        ``W``-th, without inferring it from the order its threads start them in.
        Any such slice tells the process so: to read a subset of the batches and all
        of them in one process, use two ``BatchSource`` objects.
        """
        if sl.step is not None and sl.step > 1 and (sl.start or 0) < sl.step:
            self._batches.deal(sl.step)
        return super().slice(sl)

    def to_iter_dataset(
        self, read_options: Any = None, *, allow_nones: bool = False
    ) -> grain.IterDataset:
        """``grain.MapDataset.to_iter_dataset``, with the batches' fingerprint in its state."""
        iter_dataset = super().to_iter_dataset(read_options, allow_nones=allow_nones)
        return FingerprintIterDataset.wrap(iter_dataset, self._batches)
