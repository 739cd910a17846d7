"""A data source over the patches of a tree of resolutions, one entry per node.

:class:`TreeSource` is thin: each node's patches come from that node's own
:class:`~xpatch.grain.PatchSource` (its chunk cache, its pickling), and item
``i`` gathers patch ``i`` of every node, the same ground at every resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from dask.base import tokenize

from xpatch.grain.base import Source
from xpatch.grain.source import PatchSource
from xpatch.grain.store_wait import RoundTrips

#: Keys of a node's item that the tree's item holds once, at its top level.
SHARED_KEYS = ("anchor", "index")


class TreeSource(Source):
    """Random access to patch ``i`` of every node of a tree, for Grain and PyTorch.

    ``src[i]`` is ``{"anchor": ..., "index": i, "<path>": {var: array, ...}, ...}``:
    ``"anchor"`` is the patch's start in the reference node's cells (int64),
    and each patched node's entry holds that node's patch, one numpy array per
    data variable (plus ``"weights"`` and ``"transform"`` when the node sources
    serve them). It satisfies ``grain.sources.RandomAccessDataSource``
    (``__len__``, ``__getitem__(int)``), pickles into worker processes (each
    node's source drops its cache), and its :attr:`fingerprint` combines the
    nodes'. Its chunk-local order (:meth:`chunk_shuffle`) follows the reference
    node's chunks. Build it with :meth:`xpatch.TreePatcher.to_grain`.

    Parameters
    ----------
    sources
        ``{path: PatchSource}``, the reference node's among them.
    reference
        The path of the reference node, whose anchors the items carry.
    patcher
        What the source was built from (a :class:`~xpatch.TreePatcher`), for messages.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch.tree
    >>> cells = lambda n, c: {"y": 120.0 - c / 2 - c * np.arange(n), "x": c / 2 + c * np.arange(n)}
    >>> tree = xr.DataTree.from_dict({
    ...     "/10m": xr.Dataset({"b2": (("y", "x"), np.zeros((12, 12)))}, coords=cells(12, 10)),
    ...     "/60m": xr.Dataset({"b1": (("y", "x"), np.ones((2, 2)))}, coords=cells(2, 60)),
    ... })
    >>> src = tree.patch(y=6, x=6).to_grain()
    >>> item = src[3]
    >>> len(src), item["anchor"].tolist(), item["/10m"]["b2"].shape, item["/60m"]["b1"].shape
    (4, [6, 6], (6, 6), (1, 1))
    """

    def __init__(
        self, sources: Mapping[str, PatchSource], reference: str, patcher: Any = None
    ) -> None:
        self._sources = dict(sources)
        self._reference = reference
        self._patcher = patcher
        self._fingerprint: str | None = None  # on first use: the nodes' may hash their data

    def __len__(self) -> int:
        return len(self._sources[self._reference])

    def __getitem__(self, index: int) -> dict:
        """Patch ``index`` of every node (see the class docstring)."""
        # The reference's source checks the index, so every node sees a valid one.
        first = self._sources[self._reference][index]
        item: dict = {key: first[key] for key in SHARED_KEYS}
        position = int(first["index"])
        for path, source in self._sources.items():
            patch = first if path == self._reference else source[position]
            item[path] = {k: v for k, v in patch.items() if k not in SHARED_KEYS}
        return item

    def __repr__(self) -> str:
        return (
            f"xpatch.TreeSource({len(self)} patches over the nodes {list(self._sources)}, "
            f"reference={self._reference!r}, fingerprint={self.fingerprint})"
        )

    @property
    def reference(self) -> str:
        """The path of the reference node."""
        return self._reference

    @property
    def sources(self) -> dict[str, PatchSource]:
        """Each node's :class:`~xpatch.grain.PatchSource`, by path."""
        return dict(self._sources)

    @property
    def patcher(self) -> Any:
        """What the source was built from (the reference node's patcher if not given)."""
        return (
            self._patcher if self._patcher is not None else self._sources[self._reference].patcher
        )

    @property
    def variables(self) -> tuple[str, ...]:
        """The nodes' entries of an item: their paths."""
        return tuple(self._sources)

    def chunk_of_patch(self) -> np.ndarray:
        """For every patch, the reference node's chunk holding its anchor."""
        return self._sources[self._reference].chunk_of_patch()

    def shuffle_groups(self) -> np.ndarray:
        """Return the groups :meth:`chunk_shuffle` visits: the reference node's."""
        return self._sources[self._reference].shuffle_groups()

    def touched_chunks(self) -> np.ndarray:
        """Return the reference node's chunks each patch touches: a sweep follows them."""
        return self._sources[self._reference].touched_chunks()

    def chunk_grids(self) -> list[tuple[int, ...]]:
        """Return the reference node's chunk grid."""
        return self._sources[self._reference].chunk_grids()

    def sweep_settings(self, mix: int | None, ahead: int | None) -> tuple[int, int]:
        """Return the reference node's ``(mix, ahead)``; every node keeps frames that pay."""
        for source in self._sources.values():
            source.sweep_settings(mix, ahead)
        return self._sources[self._reference].sweep_settings(mix, ahead)

    def read_ahead(self, chunk: int, wanted: Callable[[], bool] | None = None) -> None:
        """Load the reference node's chunk ``chunk`` (other nodes load on demand)."""
        self._sources[self._reference].read_ahead(chunk, wanted)

    def release(self, chunk: int, keep_frame: bool) -> None:
        """Drop the reference node's chunk ``chunk``, keeping its frame or not."""
        self._sources[self._reference].release(chunk, keep_frame)

    def fetch_depth(self) -> int:
        """Chunks whose bytes a sweep may fetch ahead: the reference node's (it reads ahead)."""
        return self._sources[self._reference].fetch_depth()

    def fetch_round_trips(self) -> RoundTrips | None:
        """Return the fetches whose queueing sets how many go out ahead: the reference's."""
        return self._sources[self._reference].fetch_round_trips()

    def fetch_chunk_bytes(self, chunk: int) -> None:
        """Start fetching the stored bytes of the reference node's chunk ``chunk``."""
        self._sources[self._reference].fetch_chunk_bytes(chunk)

    def set_sweep_direction(self, reversed_axes: list[tuple[bool, ...]]) -> None:
        """Face the reference node's sweep (the other nodes keep frames of both sides)."""
        self._sources[self._reference].set_sweep_direction(reversed_axes)

    def make_fingerprint(self) -> str:
        """Compute :attr:`fingerprint`: every node's data and layout, by path.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> cells = {"y": 35.0 - 10 * np.arange(4), "x": 5.0 + 10 * np.arange(4)}
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.zeros((4, 4)))},
        ...                                                coords=cells)})
        >>> fp = tree.patch(y=2, x=2).to_grain().fingerprint
        >>> fp == tree.patch(y=2, x=2).to_grain().fingerprint, len(fp) == 16
        (True, True)
        """
        nodes = [(path, source.fingerprint) for path, source in self._sources.items()]
        return tokenize("xpatch.TreeSource", self._reference, nodes)[:16]

    def anchors(self) -> np.ndarray:
        """Return the reference node's anchors, ``(n, k)`` int64, in item order."""
        return np.asarray(self._sources[self._reference].layout.plan.anchors).copy()
