"""Samplers: where patches start.

A sampler is a small frozen object with one method, ``anchors(geometry)``, that
returns the ``(n, ndim)`` int64 start indices of the patches. Random samplers take
an explicit integer seed and use numpy's PCG64 generator, so the same seed gives
the same anchors in every process and on every host.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from xpatch.core.checks import check_patched_dims
from xpatch.core.errors import DimensionError, GeometryError, OptionError
from xpatch.core.geometry import Geometry, as_positive_int

#: ``locate(dim, labels, method) -> positions``: resolves coordinate labels.
Locator = Callable[[Hashable, np.ndarray, str | None], np.ndarray]


@runtime_checkable
class Sampler(Protocol):
    """Anything with ``anchors(geometry) -> (n, ndim) int64 array``."""

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the anchors of the patches for ``geometry``."""
        ...


@dataclass(frozen=True)
class RegularGrid:
    """Patches on a regular grid of the stride, edges handled by ``boundary``.

    Examples
    --------
    >>> g = Geometry.build({"x": 10}, {"x": 4}, 3, "shift")
    >>> RegularGrid().anchors(g).ravel().tolist()
    [0, 3, 6]
    """

    covers_grid = True

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the grid anchors in C order."""
        return geometry.grid_anchors()


def _per_dim(value: int | Mapping[Hashable, int], geometry: Geometry, argument: str) -> np.ndarray:
    if isinstance(value, Mapping):
        check_patched_dims(argument, value, geometry.dims)
        return np.array([value.get(d, 0) for d in geometry.dims], dtype=np.int64)
    return np.full(geometry.ndim, value, dtype=np.int64)


@dataclass(frozen=True)
class JitteredGrid:
    """The regular grid with each anchor moved by a seeded random offset.

    Offsets are uniform integers in ``[-jitter, jitter]`` per dim; anchors are then
    clipped so that patches stay inside the array.

    Parameters
    ----------
    jitter
        Largest offset in cells, one for all dims or ``{dim: cells}``.
    seed
        Seed of the random offsets.

    Examples
    --------
    >>> g = Geometry.build({"x": 100}, {"x": 10}, 10, "shift")
    >>> a = JitteredGrid(jitter=3, seed=1).anchors(g)
    >>> bool((abs(a - RegularGrid().anchors(g)) <= 3).all())
    True
    """

    jitter: int | Mapping[Hashable, int]
    seed: int = 0

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the jittered grid anchors."""
        jitter = _per_dim(self.jitter, geometry, "JitteredGrid(jitter=...)")
        if (jitter < 0).any():
            raise OptionError(f"JitteredGrid(jitter={self.jitter!r}): jitter must be >= 0.")
        base = geometry.grid_anchors()
        offsets = np.random.default_rng(self.seed).integers(-jitter, jitter + 1, size=base.shape)
        return np.clip(base + offsets, 0, geometry.max_anchor())


@dataclass(frozen=True)
class RandomAnchors:
    """``count`` patches at seeded random positions inside the array.

    Parameters
    ----------
    count
        Number of patches.
    seed
        Seed of the generator (numpy PCG64).
    replace
        Whether the same position may be drawn twice.

    Examples
    --------
    >>> g = Geometry.build({"y": 50, "x": 40}, {"y": 8, "x": 8}, None, "shift")
    >>> a = RandomAnchors(count=5, seed=0, replace=False).anchors(g)
    >>> a.shape, bool((a <= [42, 32]).all())
    ((5, 2), True)
    """

    count: int
    seed: int = 0
    replace: bool = True

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return ``count`` random anchors."""
        count = as_positive_int(self.count, "RandomAnchors(count=...)")
        positions = geometry.max_anchor() + 1
        rng = np.random.default_rng(self.seed)
        if self.replace:
            return rng.integers(0, positions, size=(count, geometry.ndim), dtype=np.int64)
        population = int(np.prod(positions, dtype=object))
        if count > population:
            raise OptionError(
                f"RandomAnchors(count={count}, replace=False) asks for more patches than the "
                f"{population} distinct positions; lower count or pass replace=True."
            )
        flat = rng.choice(population, size=count, replace=False)
        return np.stack(np.unravel_index(flat, tuple(positions)), axis=1).astype(np.int64)


@dataclass(frozen=True)
class Anchors:
    """Explicit anchors given as start indices.

    Parameters
    ----------
    indices
        ``(n, ndim)`` integers in the order of the patched dims, or ``{dim: starts}``
        with one sequence of equal length per patched dim.

    Examples
    --------
    >>> g = Geometry.build({"y": 10, "x": 10}, {"y": 4, "x": 4}, None, "shift")
    >>> Anchors({"x": [0, 6], "y": [1, 2]}).anchors(g).tolist()
    [[1, 0], [2, 6]]
    """

    #: Patches stay in the given order (they are not regrouped by input chunk).
    keeps_order = True

    indices: Any = field(hash=False)

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the validated anchors."""
        return anchor_array(self.indices, geometry, "Anchors(indices)")


def anchor_array(indices: Any, geometry: Geometry, argument: str) -> np.ndarray:
    """Validate anchors given as ``(n, ndim)`` integers or ``{dim: starts}``.

    Examples
    --------
    >>> g = Geometry.build({"y": 10, "x": 10}, {"y": 4, "x": 4}, None, "shift")
    >>> anchor_array({"y": 2, "x": 3}, g, "anchor").tolist()
    [[2, 3]]
    """
    if isinstance(indices, Mapping):
        missing = [d for d in geometry.dims if d not in indices]
        unknown = [d for d in indices if d not in geometry.dims]
        if missing or unknown:
            raise DimensionError(
                f"{argument}={dict(indices)!r} must give starts for exactly the patched "
                f"dimensions {list(geometry.dims)!r}; missing {missing!r}, not patched "
                f"{unknown!r}."
            )
        columns = [np.asarray(indices[d]).ravel() for d in geometry.dims]
        if len({len(c) for c in columns}) > 1:
            raise OptionError(
                f"{argument} got sequences of different lengths "
                f"{ {d: len(c) for d, c in zip(geometry.dims, columns)} }; give one start "
                "per patch for every dim."
            )
        indices = np.stack(columns, axis=1)
    return geometry.check_anchors(indices, argument)


@dataclass(frozen=True)
class AtLabels:
    """Explicit anchors given as coordinate labels of the first cell of each patch.

    Parameters
    ----------
    labels
        ``{dim: labels}`` with one sequence of equal length per patched dim, in the
        units of the dim's coordinate (map coordinates, timestamps, ...). The
        coordinate's labels must be unique.
    method
        ``None`` for exact matches, or ``"nearest"`` to snap to the closest label
        (the coordinate must then be sorted).
    """

    labels: Mapping[Hashable, Sequence[Any] | np.ndarray] = field(hash=False)
    method: Literal["nearest"] | None = None

    def resolve(self, locate: Locator) -> Anchors:
        """Turn labels into index anchors with ``locate(dim, labels, method)``."""
        if self.method not in (None, "nearest"):
            raise OptionError(
                f"AtLabels(method={self.method!r}) is not supported; use None or 'nearest'."
            )
        return Anchors(
            {d: locate(d, np.asarray(v).ravel(), self.method) for d, v in self.labels.items()}
        )

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Labels need the array's coordinates: resolve them first."""
        raise OptionError(
            "AtLabels needs the array's coordinates; pass it as sampler= to .patch(...), "
            "which resolves the labels."
        )


def index_positions(
    index: Any, dim: Hashable, labels: np.ndarray, method: str | None
) -> np.ndarray:
    """Positions of ``labels`` in a dim's coordinate index, or raise naming the fix.

    Parameters
    ----------
    index
        The coordinate's index: anything with :class:`pandas.Index`'s
        ``is_unique``, ``duplicated``, ``is_monotonic_increasing`` /
        ``_decreasing`` and ``get_indexer`` (the core does not import pandas).
    dim
        The dim's name, for messages.
    labels
        The labels to look up, 1-D.
    method
        ``None`` (exact matches) or ``"nearest"``.

    Returns
    -------
    numpy.ndarray
        One int position per label.
    """
    if not index.is_unique:
        repeated = ", ".join(map(str, index[index.duplicated()].unique()[:5]))
        raise GeometryError(
            f"AtLabels: the coordinate {dim!r} repeats label(s) {repeated} (first few), so a "
            f"label may name several cells; drop the repeats first (obj.drop_duplicates({dim!r}) "
            "keeps the first of each), or give start indices with xpatch.Anchors instead."
        )
    if method is not None and not (index.is_monotonic_increasing or index.is_monotonic_decreasing):
        raise GeometryError(
            f"AtLabels(method={method!r}) needs the coordinate {dim!r} sorted; sort it first "
            f"(obj.sortby({dim!r})), or pass exact labels with method=None."
        )
    try:
        positions = np.asarray(index.get_indexer(labels, method=method))
    except TypeError:  # labels of another type than the coordinate's, with method="nearest"
        raise GeometryError(
            f"AtLabels: label(s) {labels[:5].tolist()} (first few) cannot be compared with the "
            f"coordinate {dim!r} of dtype {index.dtype}; pass labels of that type."
        ) from None
    if (positions < 0).any():
        missing = labels[positions < 0][:5].tolist()
        raise GeometryError(
            f"AtLabels: label(s) {missing} not found along {dim!r}; pass labels of the "
            "coordinate, or method='nearest' to snap to the closest one."
        )
    return positions
