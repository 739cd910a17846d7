"""One Grain data source over the patches of many scenes, with one shared chunk cache.

:class:`SceneSource` serves the patches of a :class:`~xpatch.ScenePatcher`:
item ``i`` is patch ``j`` of scene ``k`` as that scene's
:class:`~xpatch.grain.PatchSource` cuts it, with ``"index"`` set to ``i`` and
``"scene"`` to ``k``. The scenes' readers share one byte-bounded cache (keys
``(k, block)``), so ``cache_bytes`` bounds the process's memory whatever the
number of scenes, and :meth:`SceneSource.chunk_shuffle` visits the chunks of
every scene in one random order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import numpy as np
from dask.base import tokenize

from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES, CacheStats, ChunkCache
from xpatch.core.errors import OptionError, XPatchError
from xpatch.core.sweep import reads_span, sweep_budget, waiting_row
from xpatch.grain.base import Source, mark_absl_flags_parsed
from xpatch.grain.source import PatchSource
from xpatch.grain.store_wait import RoundTrips
from xpatch.scenes.index import SceneIndex


class HasSceneIndex(Protocol):
    """Anything that carries a :class:`~xpatch.scenes.index.SceneIndex`: a ScenePatcher."""

    @property
    def index(self) -> SceneIndex:  # noqa: D102
        ...


def _declared_dtype(specs: dict[str, dict], dtype: Any) -> np.dtype | None:
    """Return the dtype items are cast to, or None when the scenes agree and none is declared."""
    found = {name: {str(s[2]) for s in spec.values()} for name, spec in specs.items()}
    if dtype is None:
        mixed = {n: sorted(d) for n, d in found.items() if len(d) > 1}
        if mixed:
            raise OptionError(
                f"the scenes' data have different dtypes {mixed} (scene -> dtype: "
                f"{ {n: {s: str(v[2]) for s, v in spec.items()} for n, spec in specs.items()} }); "
                "declare the dtype of the items, e.g. to_grain(dtype='float32')."
            )
        return None
    try:
        target = np.dtype(dtype)
    except TypeError:
        raise OptionError(f"dtype={dtype!r} is not a numpy dtype, e.g. 'float32'.") from None
    for name, spec in specs.items():
        for scene, (_, _, source) in spec.items():
            # To a float: integers round above 2**24 (float32), floats to the nearest;
            # nothing wraps or drops a fraction, as float -> int or int -> narrower would.
            to_float = source.kind in "biuf" and target.kind == "f"
            if not (np.can_cast(source, target, "safe") or to_float):
                raise OptionError(
                    f"dtype={dtype!r}: in scene {scene!r}, {name!r} is {source}, which "
                    f"{target} cannot hold without wrapping or truncating values; declare a "
                    "dtype that holds every scene's values (e.g. 'float32'), or cast in a "
                    ".map() that knows the data's range."
                )
    return target


class SceneSource(Source):
    """Random access to the patches of many scenes, for Grain and PyTorch.

    ``src[i]`` is the item of the scene's :class:`~xpatch.grain.PatchSource`
    (``"data"`` or the Dataset's variables, ``"weights"``, ``"anchor"`` within
    the scene, and ``"transform"`` with ``transform=True``), plus ``"scene"``:
    int64, the scene's position in ``sp.names``; ``"index"`` is ``i``, global.

    Every scene must give items of the same keys and shapes (they are batched
    together): scenes with other band counts are refused. Scenes of different
    dtypes need ``dtype``, which every item is cast to.

    The source pickles without its cache, as ``PatchSource`` does: each
    ``mp_prefetch`` worker fills its own. Its :attr:`fingerprint` covers every
    scene's fingerprint, the scenes' names and order, and ``dtype``.

    Parameters
    ----------
    scene_patcher
        The scenes and their layout: a :class:`~xpatch.ScenePatcher` (or its index).
    variables, cache_bytes, transform, weights, cache_dir
        As for :class:`~xpatch.grain.PatchSource`; ``cache_bytes`` bounds the
        one cache all scenes share; ``cache_dir`` keeps each scene's decoded zarr
        chunks under the scene's own fingerprint.
    dtype
        The dtype of every item's data; default the scenes' own (which must agree).
        Casts to a float dtype (integers round to the nearest float above 2**24
        for float32) and safe casts are allowed; a cast that could wrap values or
        drop their fractions (float to int, int to a narrower int) is refused.
    """

    def __init__(
        self,
        scene_patcher: SceneIndex | HasSceneIndex,
        *,
        variables: Sequence[Hashable] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        transform: bool = False,
        weights: bool = True,
        dtype: Any = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        index = scene_patcher if isinstance(scene_patcher, SceneIndex) else scene_patcher.index
        sources = []
        for name, p in index.patchers.items():
            try:
                source = PatchSource(
                    p,
                    variables=variables,
                    cache_bytes=cache_bytes,
                    transform=transform,
                    weights=weights,
                    cache_dir=cache_dir,
                )
            except XPatchError as error:
                raise type(error)(f"scene {name!r}: {error}") from None
            sources.append(source)
        names = index.names
        keys = {name: s.variables for name, s in zip(names, sources)}
        if len(set(keys.values())) > 1:
            raise OptionError(
                f"the scenes serve different data keys {keys}; give variables=[...] that "
                "every scene has."
            )
        specs: dict[str, dict] = {key: {} for key in sources[0].variables}
        for name, source in zip(names, sources):
            for key, spec in source.item_spec().items():
                specs[key][name] = spec
        for key, spec in specs.items():
            dims = {scene: item_dims for scene, (item_dims, _, _) in spec.items()}
            if len(set(dims.values())) > 1:
                first = next(iter(dims.values()))
                raise OptionError(
                    f"the scenes' {key!r} have different dims, or dims in different orders "
                    f"{dims}: items of one batch would mix axes. Rename or transpose the "
                    f"scenes to one layout first, e.g. scene.transpose{first!r}."
                )
        for key, spec in specs.items():
            shapes = {scene: shape for scene, (_, shape, _) in spec.items()}
            if len(set(shapes.values())) > 1:
                raise OptionError(
                    f"the scenes' {key!r} patches have different shapes {shapes}: items are "
                    "batched together, so every scene needs the same bands (and other "
                    "dims besides the patched ones). Select the common bands first, e.g. "
                    "da.isel(band=slice(0, 3)), or group scenes by band count."
                )
        self._dtype = _declared_dtype(specs, dtype)
        self._scene_patcher = scene_patcher
        self._scene_index = {name: k for k, name in enumerate(names)}
        self._sources = sources
        self._offsets = index.offsets
        self._index = index
        self._cache_bytes = int(cache_bytes)
        self._chunk_offsets = np.cumsum([0] + [s.chunk_count for s in sources])
        self._frames = False
        self._share_cache()
        self._fingerprint: str | None = None
        mark_absl_flags_parsed()

    def _share_cache(self) -> None:
        self._cache = ChunkCache(self._cache_bytes, self._frame_of if self._frames else None)
        trips = RoundTrips()  # the scenes' fetches wait on one store, as a dataset's
        for k, source in enumerate(self._sources):
            source.reader.share_cache(self._cache, k)
            source.reader.share_round_trips(trips)

    def _frame_of(self, key: tuple, chunk: dict) -> list | None:
        return self._sources[key[0]].reader.frame_of(key, chunk)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_cache"]
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._share_cache()

    # -- protocol -------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Patch ``index`` as a dict of numpy arrays (see the class docstring)."""
        name, local = self._index.locate(index)
        k = self._scene_index[name]
        item = self._sources[k][local]
        if self._dtype is not None:
            for key in self.variables:
                item[key] = item[key].astype(self._dtype, copy=False)
        item["index"] = np.int64(self._offsets[k] + local)
        item["scene"] = np.int64(k)
        return item

    def __repr__(self) -> str:
        return (
            f"xpatch.SceneSource({len(self)} patches from {len(self._sources)} scenes "
            f"{self.variables}, fingerprint={self.fingerprint})"
        )

    # -- information ------------------------------------------------------------------

    @property
    def patcher(self) -> SceneIndex | HasSceneIndex:
        """The scenes and layout this source serves (what it was built from)."""
        return self._scene_patcher

    @property
    def sources(self) -> tuple[PatchSource, ...]:
        """Each scene's source (reading through the shared cache)."""
        return tuple(self._sources)

    @property
    def variables(self) -> tuple[str, ...]:
        """The data keys of an item."""
        return self._sources[0].variables

    def cache_stats(self) -> CacheStats:
        """Chunk loads, hits, evictions and bytes of the cache all scenes share (this process)."""
        return self._cache.stats()

    def clear_cache(self) -> None:
        """Drop the cached chunks and reset the counters."""
        self._cache.clear()

    @property
    def chunk_count(self) -> int:
        """Number of input chunks over all scenes."""
        return int(self._chunk_offsets[-1])

    def chunk_of_patch(self) -> np.ndarray:
        """For every patch, the global index of the chunk holding its anchor (scene after scene)."""
        return np.concatenate(
            [s.chunk_of_patch() + o for s, o in zip(self._sources, self._chunk_offsets)]
        )

    def touched_chunks(self) -> np.ndarray:
        """``(n, m)``: the global indices of the chunks each patch touches, -1 padded."""
        parts = [s.touched_chunks() for s in self._sources]
        width = max(p.shape[1] for p in parts)
        out = np.full((len(self), width), -1, dtype=np.int64)
        for part, offset, start in zip(parts, self._chunk_offsets, self._offsets):
            rows = slice(int(start), int(start) + len(part))
            out[rows, : part.shape[1]] = np.where(part >= 0, part + offset, -1)
        return out

    def shuffle_groups(self) -> np.ndarray:
        """Return the groups :meth:`chunk_shuffle` visits, as :meth:`PatchSource.shuffle_groups`.

        Frames are kept when every scene's frames, plus the largest chunk of any
        scene, fit in the shared cache.
        """
        if not self._frames_fit():
            return self.chunk_of_patch()
        if not self._frames:
            self._frames = True
            for source in self._sources:
                source.reader.keep_frames()
            self._cache.shrink = self._frame_of
        return self.touched_chunks()

    def chunk_grids(self) -> list[tuple[int, ...]]:
        """Each scene's number of chunks along its patched axes, in scene order."""
        return [source.chunk_grids()[0] for source in self._sources]

    def sweep_settings(self, mix: int | None, ahead: int | None) -> tuple[int, int]:
        """Return ``(mix, ahead)`` of a sweep within the shared cache; keep frames that pay."""
        costs = [s.reader.sweep_costs() for s in self._sources]
        if any(0 < share < 1 for _, share in costs) and not self._frames:
            self._frames = True
            for source, (_, share) in zip(self._sources, costs):
                if 0 < share < 1:
                    source.reader.keep_frames()
            self._cache.shrink = self._frame_of
        waiting = max(
            waiting_row(grid) * share * chunk_bytes
            for grid, (chunk_bytes, share) in zip(self.chunk_grids(), costs)
        )
        largest = max(chunk_bytes for chunk_bytes, _ in costs)
        span = reads_span(len(self), self.chunk_count)
        return sweep_budget(self._cache_bytes, largest, int(waiting), span, mix, ahead)

    def _scene_of(self, chunk: int) -> tuple[PatchSource, int]:
        k = int(np.searchsorted(self._chunk_offsets, chunk, side="right")) - 1
        return self._sources[k], int(chunk) - int(self._chunk_offsets[k])

    def read_ahead(self, chunk: int, wanted: Callable[[], bool] | None = None) -> None:
        """Load global chunk ``chunk`` into the shared cache, if ``wanted()`` when it starts."""
        source, local = self._scene_of(chunk)
        source.read_ahead(local, wanted)

    def release(self, chunk: int, keep_frame: bool) -> None:
        """Drop global chunk ``chunk`` from the shared cache, keeping its frame or not."""
        source, local = self._scene_of(chunk)
        source.release(local, keep_frame)

    def fetch_depth(self) -> int:
        """Chunks whose stored bytes a sweep may fetch ahead: the most of any scene's."""
        return max((source.fetch_depth() for source in self._sources), default=0)

    def fetch_round_trips(self) -> RoundTrips | None:
        """Return the fetches whose queueing sets how many go out ahead: the scenes'."""
        trips = (source.fetch_round_trips() for source in self._sources)
        return next((t for t in trips if t is not None), None)

    def fetch_chunk_bytes(self, chunk: int) -> None:
        """Start fetching the stored bytes of global chunk ``chunk``."""
        source, local = self._scene_of(chunk)
        source.fetch_chunk_bytes(local)

    def set_sweep_direction(self, reversed_axes: list[tuple[bool, ...]]) -> None:
        """Keep, per scene, the frame sides facing the chunks the sweep visits later."""
        for source, axes in zip(self._sources, reversed_axes):
            source.set_sweep_direction([axes])

    def _frames_fit(self) -> bool:
        costs = [s.reader.frame_costs() for s in self._sources]
        return (
            all(c is not None for c in costs)
            and any(c[0] > 0 for c in costs)
            and sum(c[0] for c in costs) + max(c[1] for c in costs) <= self._cache_bytes
        )

    def make_fingerprint(self) -> str:
        """Compute :attr:`fingerprint`: the scenes, their layout and data, and ``dtype``."""
        return tokenize(
            "xpatch.SceneSource v1",
            self._index.names,
            [s.fingerprint for s in self._sources],
            None if self._dtype is None else str(self._dtype),
            self._frames_fit(),  # decides how chunk_shuffle orders straddling patches
        )[:16]
