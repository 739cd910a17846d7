"""The chunk-local shuffle as a ``grain.MapDataset`` (imports grain)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from xpatch.core.shuffle import check_seed, chunk_local_permutation


class ChunkShuffleMapDataset(grain.MapDataset):
    """Visit groups (chunks) in a random order and their elements in a random order.

    Element ``i`` of epoch ``e`` (index ``e * len + i``) is the parent's element
    ``e * len + perm_e[i]``, where ``perm_e`` depends on ``(seed, e)`` only.

    Parameters
    ----------
    parent
        The dataset to shuffle.
    groups
        ``(len(parent),)`` group label of every element (the chunk of its patch).
    seed
        ``0 <= seed < 2**32``.
    members
        The parent's elements to serve (a shard); default all of them.
    """

    _MUTATES_ELEMENT_SPEC = False

    def __init__(
        self,
        parent: grain.MapDataset,
        *,
        groups: np.ndarray,
        seed: int,
        members: np.ndarray | None = None,
    ) -> None:
        super().__init__(parent)
        self._seed = check_seed(seed)
        self._members = np.arange(len(parent)) if members is None else np.asarray(members)
        self._groups = np.asarray(groups)[self._members]
        self._lock = threading.Lock()
        self._permutations: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._members)

    def __str__(self) -> str:
        return f"ChunkShuffleMapDataset(seed={self._seed})"

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_permutations"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def permutation(self, epoch: int) -> np.ndarray:
        """Return the order of epoch ``epoch``: positions in ``members``."""
        with self._lock:
            cached = self._permutations.get(epoch)
        if cached is not None:
            return cached
        order = chunk_local_permutation(self._groups, self._seed, epoch)
        with self._lock:
            # Two epochs are live at a boundary when prefetching runs ahead.
            if len(self._permutations) >= 2:
                self._permutations.pop(min(self._permutations))
            self._permutations[epoch] = order
        return order

    def _shuffled_index(self, index: int) -> int:
        epoch, within = divmod(int(index), len(self._members))
        member = self._members[self.permutation(epoch)[within]]
        return int(member) + epoch * len(self._parent)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[self._shuffled_index(index)]

    def _getitems(self, indices: Sequence[int]) -> Any:
        return self._parent._getitems([self._shuffled_index(i) for i in indices])
