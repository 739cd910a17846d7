"""The state of many scenes under one patch layout: their layouts and one global index.

:class:`SceneIndex` numbers the patches of every scene with one global index,
scene after scene, and maps one to the other; :class:`~xpatch.ScenePatcher`
holds one and adds the verbs, :class:`~xpatch.scenes.SceneSource` reads it.
:func:`named_scenes` turns what a user gives (a glob, paths, a mapping,
objects) into named scenes.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import OptionError
from xpatch.xarray.layout import HasLayout, Layout, layout_of

#: What a scene may be: an xarray object, or the path of a file to open lazily.
Scene = xr.DataArray | xr.Dataset | str | os.PathLike


def scene_paths(pattern: str) -> list[str]:
    """Return the files a glob matches, sorted (refusing none), or the path itself."""
    if glob.has_magic(pattern):
        found = sorted(glob.glob(pattern))
        if not found:
            raise OptionError(f"scenes={pattern!r} matches no file; check the pattern.")
        return found
    return [pattern]


def named_scenes(scenes: Any) -> dict[str, Scene]:
    """Return scene names and scenes: a mapping's keys, file stems, or positions."""
    if isinstance(scenes, str | os.PathLike):
        scenes = scene_paths(os.fspath(scenes))
    if isinstance(scenes, Mapping):
        named = {str(k): v for k, v in scenes.items()}
        if len(named) != len(scenes):
            raise OptionError(
                f"scenes has keys {list(scenes)!r} that are equal as text; name them uniquely."
            )
    elif isinstance(scenes, Iterable) and not isinstance(scenes, xr.DataArray | xr.Dataset):
        items = list(scenes)
        if all(isinstance(s, str | os.PathLike) for s in items):
            names = [Path(s).stem for s in items]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise OptionError(
                    f"scenes: several files are named {repeated!r} (in different folders or "
                    "with other suffixes); scene names become output file names, so name "
                    "them yourself with a mapping, e.g. {'north_a': path, ...}."
                )
        else:
            names = [str(i) for i in range(len(items))]
        named = dict(zip(names, items))
    else:
        raise OptionError(
            f"scenes is a {type(scenes).__name__}; give a sequence (or a mapping name -> scene) "
            "of DataArrays, Datasets or file paths, or a glob such as 'scenes/*.tif'."
        )
    if not named:
        raise OptionError("scenes is empty; give at least one scene.")
    return named


class SceneIndex:
    """The patch layouts of many scenes, with one global patch index.

    Patch ``i`` is patch ``j`` of scene ``k``, scenes in the order given and each
    scene's patches in its layout's order; :meth:`locate` maps one to the other.

    Parameters
    ----------
    patchers
        Scene name -> its :class:`~xpatch.Patcher` (or anything with a layout).
        Every scene must have the same patched dims, in the same order.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> a = xr.DataArray(np.zeros((64, 64)), dims=("y", "x"))
    >>> b = xr.DataArray(np.ones((32, 96)), dims=("y", "x"))
    >>> index = SceneIndex({"a": a.patch(y=32, x=32), "b": b.patch(y=32, x=32)})
    >>> len(index), index.locate(4), index.offsets.tolist()
    (7, ('b', 0), [0, 4, 7])
    """

    def __init__(self, patchers: Mapping[str, HasLayout]) -> None:
        layouts = {name: layout_of(p) for name, p in patchers.items()}
        dims = {name: layout.dims for name, layout in layouts.items()}
        first = next(iter(dims.values()))
        if any(tuple(d) != tuple(first) for d in dims.values()):
            raise OptionError(
                f"the scenes' patched dims differ, or come in different orders: {dims!r}. "
                "Anchors, bounds and items follow that order: transpose the scenes to one "
                f"order first, e.g. scene.transpose(..., {', '.join(map(repr, first))})."
            )
        self._patchers = dict(patchers)
        self._layouts = layouts
        self._names = tuple(self._patchers)
        self._offsets = np.cumsum([0] + [len(layout) for layout in layouts.values()])

    @property
    def names(self) -> tuple[str, ...]:
        """The scenes' names, in order: the mapping's keys, file stems, or ``"0"``, ``"1"``..."""
        return self._names

    @property
    def patchers(self) -> dict[str, HasLayout]:
        """Each scene's patcher, by name (a copy of the mapping)."""
        return dict(self._patchers)

    @property
    def layouts(self) -> dict[str, Layout]:
        """Each scene's :class:`~xpatch.xarray.layout.Layout`, by name (a copy)."""
        return dict(self._layouts)

    @property
    def offsets(self) -> np.ndarray:
        """``(scenes + 1,)``: scene ``k``'s patches are ``offsets[k]:offsets[k + 1]``."""
        return self._offsets.copy()

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims (those of the first scene, in its order)."""
        return self._layouts[self._names[0]].dims

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def position(self, index: Any) -> int:
        """Return global patch ``index`` as a position in ``[0, len)`` (negative from the end)."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"patch index {index!r} must be an int.")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"patch index {index} is out of range for {n} patches.")
        return int(index) % n

    def locate(self, index: int) -> tuple[str, int]:
        """Return ``(scene name, index within the scene)`` of global patch ``index``."""
        position = self.position(index)
        k = int(np.searchsorted(self._offsets, position, side="right")) - 1
        return self._names[k], position - int(self._offsets[k])
