"""Many scenes under one patch layout: :func:`patch_scenes` and :class:`ScenePatcher`.

A training set or an inference run is rarely one array: it is a folder of scenes
of different shapes, often in different CRSs. A :class:`ScenePatcher` lays the
same patches (size, stride, window, boundary, sampler...) over each scene with
an ordinary :class:`~xpatch.Patcher` and numbers all patches with one global
index, scene after scene. It serves them to Grain through one source with one
chunk cache (:meth:`ScenePatcher.to_grain`), and runs a model over every scene
(:meth:`ScenePatcher.apply`, one lazy result per scene, which
:func:`xpatch.write` writes to a folder).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.apply import BatchFunction
from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES
from xpatch.core.errors import OptionError, PredictionError, XPatchError
from xpatch.core.scale import ScaleSpec
from xpatch.io.inputs import open_input
from xpatch.patcher import Patcher
from xpatch.scenes.index import SceneIndex, named_scenes
from xpatch.scenes.source import SceneSource
from xpatch.xarray.apply import (
    ApplyOptions,
    ApplyReduction,
    takes_apply_options,
)
from xpatch.xarray.views import patch_rows


class ScenePatcher:
    """One patch layout over many scenes, with one global patch index: the verbs.

    Build it with :func:`patch_scenes`. Patch ``i`` is patch ``j`` of scene
    ``k``, scenes in the order given and each scene's patches in its
    :class:`~xpatch.Patcher`'s order; :meth:`locate` maps one to the other.
    Its state is a :class:`~xpatch.scenes.index.SceneIndex` (:attr:`index`).

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> a = xr.DataArray(np.zeros((64, 64)), dims=("y", "x"))
    >>> b = xr.DataArray(np.ones((32, 96)), dims=("y", "x"))
    >>> sp = xpatch.patch_scenes({"a": a, "b": b}, y=32, x=32)
    >>> len(sp), sp.scene_of(4), sp.locate(4)
    (7, 'b', ('b', 0))
    >>> sp.anchors().sel(patch=4).values.tolist(), sp.anchors().scene.values[4]
    ([0, 0], np.str_('b'))
    """

    def __init__(self, patchers: Mapping[str, Patcher]) -> None:
        self._index = SceneIndex(patchers)
        self._patchers = dict(patchers)

    # -- information ----------------------------------------------------------------

    @property
    def index(self) -> SceneIndex:
        """The state these verbs read: the scenes' layouts and the global index."""
        return self._index

    @property
    def names(self) -> tuple[str, ...]:
        """The scenes' names, in order: the mapping's keys, file stems, or ``"0"``, ``"1"``..."""
        return self._index.names

    @property
    def patchers(self) -> dict[str, Patcher]:
        """Each scene's :class:`~xpatch.Patcher`, by name (a copy of the mapping)."""
        return dict(self._patchers)

    @property
    def offsets(self) -> np.ndarray:
        """``(scenes + 1,)``: scene ``k``'s patches are ``offsets[k]:offsets[k + 1]``."""
        return self._index.offsets

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims (those of the first scene, in its order)."""
        return self._index.dims

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        names = self.names
        first = self._patchers[names[0]]
        size = ", ".join(f"{d}: {s}" for d, s in first.size.items())
        return (
            f"xpatch.ScenePatcher({len(self)} patches of ({size}) over {len(names)} "
            f"scenes {list(names)[:5]}{'...' if len(names) > 5 else ''})"
        )

    def locate(self, index: int) -> tuple[str, int]:
        """Return ``(scene name, index within the scene)`` of global patch ``index``."""
        return self._index.locate(index)

    def scene_of(self, index: int) -> str:
        """Return the name of the scene that holds global patch ``index``."""
        return self.locate(index)[0]

    # -- views ------------------------------------------------------------------------

    def __getitem__(self, index: int) -> xr.DataArray | xr.Dataset:
        """Patch ``index``, cut from its scene with the scene's coordinates and CRS."""
        name, j = self.locate(index)
        return self._patchers[name][j]

    def _concat(self, per_scene: Sequence[xr.DataArray]) -> xr.DataArray:
        joined = xr.concat(per_scene, dim="patch")
        scene = np.repeat(np.array(self.names, dtype=object), np.diff(self._index.offsets))
        local = np.concatenate([np.arange(n) for n in np.diff(self._index.offsets)])
        return joined.assign_coords(
            scene=("patch", scene.astype(str)), scene_patch=("patch", local)
        )

    def anchors(self) -> xr.DataArray:
        """Every patch's start per patched dim, with ``scene`` and ``scene_patch`` coordinates.

        Returns
        -------
        xarray.DataArray
            int64, dims ``("patch", "dim")``; ``scene`` names the scene and
            ``scene_patch`` is the patch's index within it.
        """
        return self._concat([self._patchers[n].anchors() for n in self.names])

    def bounds(self) -> xr.DataArray:
        """Every patch's ``(left, bottom, right, top)`` in its own scene's CRS, with ``scene``.

        Scenes may be in different CRSs: compare bounds within a scene, or
        reproject them (``sp.patchers[name].obj.rio.crs``) first.
        """
        return self._concat([self._patchers[n].bounds() for n in self.names])

    # -- inference ----------------------------------------------------------------------

    @takes_apply_options
    def apply(
        self, fn: BatchFunction, options: ApplyOptions
    ) -> dict[str, xr.DataArray | xr.Dataset]:
        """Run ``fn`` over every scene's patches: ``{name: p.apply(fn, ...)}``, lazily.

        The arguments are :meth:`xpatch.Patcher.apply`'s, the same for every
        scene (per-patch ``weights`` are per scene: give each scene's patcher
        its own instead). :func:`xpatch.write` of the returned mapping writes one
        output per scene into a folder.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> scenes = [xr.DataArray(np.full((48, 64), float(k)), dims=("y", "x")) for k in (1, 2)]
        >>> out = xpatch.patch_scenes(scenes, y=32, x=32, stride=16).apply(lambda b: b * 10)
        >>> {name: float(r.mean()) for name, r in out.items()}
        {'0': 10.0, '1': 20.0}
        """
        options = options.as_keywords()
        return {name: p.apply(fn, **options) for name, p in self._patchers.items()}

    def reconstruct(
        self,
        predictions: Any,
        reduce: ApplyReduction = "mean",
        *,
        weights: Any = None,
        scale: ScaleSpec | None = None,
    ) -> dict[str, Any]:
        """Blend predictions back onto each scene: ``{name: p.reconstruct(...)}``.

        Parameters
        ----------
        predictions
            One DataArray/Dataset with a ``patch`` dim of ``len(sp)`` predictions
            in global order (split at :attr:`offsets`), or a mapping scene name ->
            that scene's predictions.
        reduce, scale
            As for :meth:`xpatch.Patcher.reconstruct`, the same for every scene.
        weights
            As for :meth:`xpatch.Patcher.reconstruct`: in global order like the
            predictions (one per patch, or with a ``patch`` dim of ``len(sp)``: split
            at :attr:`offsets`), a mapping scene name -> that scene's weights, or
            weights without a ``patch`` dim, the same for every scene.
        """
        if isinstance(predictions, Mapping):
            missing = [n for n in self.names if n not in predictions]
            extra = [n for n in predictions if n not in self._patchers]
            if missing or extra:
                raise PredictionError(
                    f"predictions lack scenes {missing} and name unknown scenes {extra}; give "
                    f"one entry per scene of {list(self.names)}."
                )
            per_scene = {n: predictions[n] for n in self.names}
        else:
            count = getattr(predictions, "sizes", {}).get("patch")
            if count != len(self):
                raise PredictionError(
                    f"predictions have {count} entries along 'patch'; this ScenePatcher has "
                    f"{len(self)} patches (give one per patch, in global order, or a mapping "
                    "scene name -> predictions)."
                )
            per_scene = {
                n: predictions.isel(patch=slice(int(a), int(b)))
                for n, a, b in zip(self.names, self._index.offsets[:-1], self._index.offsets[1:])
            }
        spans = dict(zip(self.names, itertools.pairwise(self._index.offsets.tolist())))
        return {
            n: self._patchers[n].reconstruct(
                per_scene[n], reduce, weights=self._scene_weights(weights, n, spans[n]), scale=scale
            )
            for n in self.names
        }

    def _scene_weights(self, weights: Any, name: str, span: tuple[int, int]) -> Any:
        # Weights in global order are cut where the predictions are; others pass as given.
        if weights is None:
            return None
        if isinstance(weights, Mapping):
            if name not in weights:
                raise PredictionError(
                    f"weights is a mapping without scene {name!r}; give one entry per scene "
                    f"of {list(self.names)}, or weights in global order."
                )
            return weights[name]
        return patch_rows(weights, len(self), slice(*span))

    # -- training ---------------------------------------------------------------------

    def to_grain(
        self,
        *,
        variables: Sequence[Hashable] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        transform: bool = False,
        weights: bool = True,
        dtype: Any = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> SceneSource:
        """One Grain ``RandomAccessDataSource`` over every scene, with one chunk cache.

        See :class:`xpatch.scenes.SceneSource`. Items carry ``"scene"``
        (the scene's position in :attr:`names`) besides ``"anchor"`` (within the
        scene) and ``"index"`` (global). ``cache_dir`` keeps the scenes' decoded zarr
        chunks on local disk for later epochs (each scene under its own fingerprint).

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> a = xr.DataArray(np.zeros((2, 64, 64), "float32"), dims=("band", "y", "x"))
        >>> b = xr.DataArray(np.ones((2, 32, 64), "uint8"), dims=("band", "y", "x"))
        >>> src = xpatch.patch_scenes([a.chunk(y=32), b], y=32, x=32).to_grain(dtype="float32")
        >>> item = src[5]
        >>> int(item["scene"]), int(item["index"]), item["data"].dtype, float(item["data"].max())
        (1, 5, dtype('float32'), 1.0)
        """
        return SceneSource(
            self,
            variables=variables,
            cache_bytes=cache_bytes,
            transform=transform,
            weights=weights,
            dtype=dtype,
            cache_dir=cache_dir,
        )


def patch_scenes(
    scenes: Any,
    size: Mapping[Hashable, int] | None = None,
    stride: int | Mapping[Hashable, int] | None = None,
    *,
    sampler: Any = None,
    chunks: int = 1024,
    variable: str | None = None,
    **options: Any,
) -> ScenePatcher:
    """Lay one patch layout over many scenes: a :class:`ScenePatcher`.

    Parameters
    ----------
    scenes
        A sequence of DataArrays, Datasets or file paths (GeoTIFF, zarr, netCDF:
        opened lazily, headers only, with ``chunks``), a mapping name -> scene, or
        a glob such as ``"scenes/*.tif"`` (sorted). Scenes may differ in shape
        and CRS. Names: the mapping's keys; for paths their stems; else
        ``"0"``, ``"1"``... (files of the same stem must be named with a mapping).
    size, stride
        The patch size and stride, as for :class:`~xpatch.Patcher` (also as
        keyword arguments ``y=256, x=256``); the same for every scene.
    sampler
        One sampler for every scene (a ``RandomAnchors(count, seed)`` draws
        ``count`` per scene, with the same seed: scenes of one shape get the same
        anchors; give a mapping of samplers with their own seeds for other draws),
        or a mapping scene name -> sampler (e.g. a
        :class:`~xpatch.WeightedAnchors` per scene, over that scene's weight
        map). Default: the regular grid.
    chunks
        Block size (along y and x) of GeoTIFFs opened from paths; zarr stores and
        netCDF files keep their own chunks.
    variable
        The variable to read from zarr or netCDF files that hold several.
    **options
        :class:`~xpatch.Patcher`'s other options: ``window``, ``boundary``,
        ``min_valid``, ``pad_value``, ``pad_mode``, and the size as ``y=...``.

    Raises
    ------
    OptionError, DimensionError, GeometryError
        As :class:`~xpatch.Patcher` raises them, with the scene's name in front.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> scenes = {"a": xr.DataArray(np.zeros((64, 64)), dims=("y", "x")),
    ...           "b": xr.DataArray(np.zeros((40, 40)), dims=("y", "x"))}
    >>> sp = xpatch.patch_scenes(scenes, y=32, x=32, stride=16)
    >>> len(sp), [len(p) for p in sp.patchers.values()]
    (13, [9, 4])
    """
    named = named_scenes(scenes)
    if isinstance(sampler, Mapping):
        missing = [n for n in named if n not in {str(k) for k in sampler}]
        extra = [str(n) for n in sampler if str(n) not in named]
        if missing or extra:
            raise OptionError(
                f"sampler names scenes {list(map(str, sampler))}; it lacks {missing} and names "
                f"unknown {extra}. Give one sampler per scene of {list(named)}, or one sampler "
                "for all."
            )
        samplers = {str(k): v for k, v in sampler.items()}
    else:
        samplers = dict.fromkeys(named, sampler)
    patchers = {}
    for name, scene in named.items():
        try:
            obj = scene
            if isinstance(scene, str | os.PathLike):
                obj = open_input(scene, variable, chunks=chunks)
            patchers[name] = Patcher(obj, size, stride, sampler=samplers[name], **options)
        except XPatchError as error:
            raise type(error)(f"scene {name!r}: {error}") from None
    return ScenePatcher(patchers)
