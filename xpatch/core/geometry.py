"""Patch geometry: sizes, strides and boundary handling -> anchors.

An *anchor* is the start index of a patch along each patched axis. Everything in
this module works on plain integers and numpy arrays, so a grid of a million
patches costs a few milliseconds.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from xpatch.core.checks import check_choice, check_patched_dims
from xpatch.core.errors import DimensionError, GeometryError, OptionError

Boundary = Literal["shift", "pad", "drop", "raise"]
BOUNDARIES: tuple[str, ...] = get_args(Boundary)
#: The boundary of a dim that wraps (a global grid's longitude), given per dim.
PERIODIC = "periodic"
#: The boundary mode of one axis: how it ends, or that it wraps.
AxisBoundary = Literal["shift", "pad", "drop", "raise", "periodic"]


def as_positive_int(value: object, argument: str) -> int:
    """Return ``value`` as an ``int`` > 0, or raise naming ``argument``.

    Examples
    --------
    >>> as_positive_int(np.int64(3), "size['x']")
    3
    """
    if isinstance(value, bool | np.bool_):
        raise GeometryError(f"{argument}={value!r} is a bool; pass a positive integer.")
    try:
        as_int = operator.index(value)
    except TypeError:
        raise GeometryError(
            f"{argument}={value!r} is not an integer; pass a positive integer "
            f"(for example {argument}=256)."
        ) from None
    if as_int <= 0:
        raise GeometryError(f"{argument}={as_int} must be a positive integer (> 0).")
    return as_int


def check_boundary(boundary: object) -> AxisBoundary:
    """Return ``boundary`` if it is a known mode of one axis, else raise listing them."""
    return check_choice("boundary", boundary, (*BOUNDARIES, PERIODIC))  # type: ignore[return-value]


def axis_boundaries(boundary: object, dims: Sequence[Hashable]) -> tuple[AxisBoundary, ...]:
    """Return each axis's boundary mode: one for all, or ``{dim: mode}`` (left out: shift).

    The one reading of ``boundary`` (as xarray's rolling turns per-dim options into
    per-axis lists once).

    Examples
    --------
    >>> axis_boundaries({"x": "periodic"}, ("y", "x")), axis_boundaries("pad", ("y",))
    (('shift', 'periodic'), ('pad',))
    """
    if not isinstance(boundary, Mapping):
        mode = check_boundary(boundary)
        return (mode,) * len(dims)
    unknown = [d for d in boundary if d not in dims]
    if unknown:
        raise DimensionError(
            f"boundary={dict(boundary)!r} names {unknown!r}, which are not patched dims "
            f"{list(dims)!r}; give {{dim: mode}} over them (dims left out take 'shift')."
        )
    modes = []
    for d in dims:
        mode = boundary.get(d, "shift")
        if not isinstance(mode, str) or mode not in (*BOUNDARIES, PERIODIC):
            raise OptionError(
                f"boundary={dict(boundary)!r}: {mode!r} for {d!r} is not a boundary mode; "
                f"use one of {[*BOUNDARIES, PERIODIC]}."
            )
        modes.append(mode)
    return tuple(modes)


def axis_starts(
    extent: int, size: int, stride: int, boundary: AxisBoundary, dim: Hashable
) -> np.ndarray:
    """Start indices of a regular grid of patches along one axis.

    Parameters
    ----------
    extent, size, stride
        Length of the axis, of a patch and of a step between patch starts.
    boundary
        What to do when the last step does not end flush with the edge: move the
        last patch back (``"shift"``), pad past the edge (``"pad"``), leave the
        incomplete patch out (``"drop"``) or raise (``"raise"``). ``"periodic"``:
        the axis wraps (a global grid's longitude), patches start at ``0, stride,
        ...`` below ``extent`` and those past the end go on with the first cells.
    dim
        Name of the axis, for error messages.

    Examples
    --------
    >>> axis_starts(10, 4, 3, "shift", "x")
    array([0, 3, 6])
    >>> axis_starts(11, 4, 3, "shift", "x")
    array([0, 3, 6, 7])
    >>> axis_starts(11, 4, 3, "pad", "x")
    array([0, 3, 6, 9])
    >>> axis_starts(11, 4, 3, "drop", "x")
    array([0, 3, 6])
    >>> axis_starts(11, 4, 3, "periodic", "x")
    array([0, 3, 6, 9])
    """
    if boundary == PERIODIC:
        return np.arange(0, extent, stride, dtype=np.int64)
    if boundary == "pad":
        count = -(-max(extent - size, 0) // stride) + 1
        starts = np.arange(count, dtype=np.int64) * stride
        # With stride > size the last step can jump past the end: such a patch
        # would hold padding only.
        return starts[starts < extent]
    last = extent - size
    starts = np.arange(0, last + 1, stride, dtype=np.int64)
    if starts[-1] != last:
        if boundary == "shift":
            starts = np.append(starts, np.int64(last))
        elif boundary == "raise":
            remainder = last - starts[-1]
            raise GeometryError(
                f"boundary='raise': along {dim!r} patches of size {size} with stride {stride} "
                f"leave the last {remainder} cell(s) of {extent} uncovered. Choose a stride that "
                f"divides {last} (extent - size), or boundary='shift', 'pad' or 'drop'."
            )
    return starts


def covered_cells(extent: int, size: int, starts: np.ndarray, periodic: bool = False) -> int:
    """Count the cells in ``[0, extent)`` that at least one patch covers (wrapped if periodic).

    Examples
    --------
    >>> covered_cells(10, 2, np.array([0, 5]))
    4
    >>> covered_cells(10, 4, np.array([0, 8]), periodic=True)
    6
    """
    if periodic:
        cells = (np.asarray(starts)[:, None] + np.arange(size)[None, :]) % extent
        return len(np.unique(cells))
    delta = np.zeros(extent + 1, dtype=np.int64)
    np.add.at(delta, np.minimum(starts, extent), 1)
    np.add.at(delta, np.minimum(starts + size, extent), -1)
    return int(np.count_nonzero(np.cumsum(delta[:-1])))


@dataclass(frozen=True)
class Geometry:
    """Validated patch layout along the patched axes of an array.

    Build it with :meth:`Geometry.build`, which checks every argument.

    Attributes
    ----------
    dims
        Names of the patched axes, in array order.
    shape
        Extent of the array along each patched axis.
    size, stride
        Patch extent and step between patch starts along each patched axis.
    boundaries
        The boundary mode of each axis (see :func:`axis_starts`): how it ends, or
        ``"periodic"``: its anchors lie in ``[0, extent)`` and a patch past the end
        goes on with the first cells.
    """

    dims: tuple[Hashable, ...]
    shape: tuple[int, ...]
    size: tuple[int, ...]
    stride: tuple[int, ...]
    boundaries: tuple[AxisBoundary, ...]

    def __setstate__(self, state: dict) -> None:
        # Pickled before the geometry held a mode per axis: one mode for all of them.
        if "boundaries" not in state:
            state = dict(state)
            state["boundaries"] = (state.pop("boundary"),) * len(state["dims"])
        object.__setattr__(self, "__dict__", {**self.__dict__, **state})

    @property
    def boundary(self) -> AxisBoundary | dict[Hashable, AxisBoundary]:
        """The one mode every axis has, or ``{dim: mode}`` when they differ."""
        if len(set(self.boundaries)) == 1:
            return self.boundaries[0]
        return dict(zip(self.dims, self.boundaries))

    def wraps(self, axis: int) -> bool:
        """Whether axis ``axis`` is periodic."""
        return self.boundaries[axis] == PERIODIC

    def pads(self, axis: int) -> bool:
        """Whether patches may run past the end of axis ``axis`` (``"pad"``)."""
        return self.boundaries[axis] == "pad"

    @property
    def periodic_axes(self) -> tuple[int, ...]:
        """The positions of the periodic axes."""
        return tuple(j for j in range(len(self.dims)) if self.wraps(j))

    def ended(self) -> tuple[AxisBoundary, ...]:
        """Return the boundaries of a region of this grid: a periodic axis ends with the region.

        Examples
        --------
        >>> Geometry.build({"y": 4, "x": 8}, {"y": 2, "x": 2}, None,
        ...                {"y": "pad", "x": "periodic"}).ended()
        ('pad', 'shift')
        """
        return tuple("shift" if self.wraps(j) else b for j, b in enumerate(self.boundaries))

    def seam_reach(self) -> tuple[int, ...]:
        """Return per axis the cells a window reads past the end from the start (the seam).

        Examples
        --------
        >>> Geometry.build({"y": 4, "x": 8}, {"y": 2, "x": 3}, None,
        ...                {"y": "pad", "x": "periodic"}).seam_reach()
        (0, 2)
        """
        return tuple(s - 1 if self.wraps(j) else 0 for j, s in enumerate(self.size))

    def seam_copies(self, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(rows, copies)``: the patches at ``anchors`` that cross a seam, a turn back.

        :func:`wrapped_copies` over this grid's periodic axes (none: nothing crosses).

        Examples
        --------
        >>> g = Geometry.build({"x": 8}, {"x": 4}, 3, "periodic")
        >>> rows, copies = g.seam_copies(np.array([[0], [3], [6]]))
        >>> rows.tolist(), copies.ravel().tolist()
        ([2], [-2])
        """
        return wrapped_copies(anchors, self.size, self.shape, self.periodic_axes)

    def anchors_around(self, centres: np.ndarray) -> np.ndarray:
        """Anchors of the patches centred on ``(n, k)`` cells, kept on the grid.

        Along an ended axis a patch is shifted inside; along a periodic one its
        anchor wraps, so the centre stays the patch's centre across the seam.

        Examples
        --------
        >>> g = Geometry.build({"x": 8}, {"x": 4}, None, "periodic")
        >>> g.anchors_around(np.array([[0], [7]])).ravel().tolist()
        [6, 5]
        """
        size = np.asarray(self.size, dtype=np.int64)
        top = np.maximum(np.asarray(self.shape, dtype=np.int64) - size, 0)
        anchors = np.clip(centres - size // 2, 0, top)
        for j in self.periodic_axes:
            anchors[:, j] = (centres[:, j] - size[j] // 2) % self.shape[j]
        return anchors

    @classmethod
    def build(
        cls,
        shape: Mapping[Hashable, int],
        size: Mapping[Hashable, object],
        stride: int | Mapping[Hashable, object] | None,
        boundary: object,
    ) -> Geometry:
        """Validate the arguments and return the geometry.

        Parameters
        ----------
        shape
            ``{dim: extent}`` of the patched dims, in array order.
        size
            ``{dim: patch extent}``; keys must be those of ``shape``.
        stride
            One step for all dims, a ``{dim: step}`` mapping (dims left out step by
            their size), or ``None`` for no overlap.
        boundary
            One of ``"shift"``, ``"pad"``, ``"drop"``, ``"raise"``, ``"periodic"``, or
            ``{dim: mode}`` (dims left out: ``"shift"``).

        Examples
        --------
        >>> g = Geometry.build({"y": 10, "x": 8}, {"y": 4, "x": 4}, 3, "shift")
        >>> g.stride
        (3, 3)
        >>> len(g.grid_anchors())
        9
        >>> Geometry.build({"y": 10, "x": 8}, {"y": 4, "x": 4}, 3, {"x": "periodic"}).boundary
        {'y': 'shift', 'x': 'periodic'}
        """
        dims = tuple(shape)
        modes = axis_boundaries(boundary, dims)
        sizes = tuple(as_positive_int(size[d], f"size[{d!r}]") for d in dims)
        if stride is None:
            strides = sizes
        elif isinstance(stride, Mapping):
            check_patched_dims("stride", stride, dims, OptionError)
            strides = tuple(
                as_positive_int(stride.get(d, s), f"stride[{d!r}]") for d, s in zip(dims, sizes)
            )
        else:
            one = as_positive_int(stride, "stride")
            strides = (one,) * len(dims)
        for d, s, mode in zip(dims, sizes, modes):
            if mode == PERIODIC and s > shape[d]:
                raise GeometryError(
                    f"size[{d!r}]={s} is larger than the periodic dim {d!r} ({shape[d]} cells): "
                    f"a patch would hold some cells twice. Use a size of at most {shape[d]}."
                )
            if mode not in ("pad", PERIODIC) and s > shape[d]:
                raise GeometryError(
                    f"size[{d!r}]={s} is larger than the array along {d!r} (extent "
                    f"{shape[d]}). Use a patch size of at most {shape[d]} along {d!r}, "
                    "or boundary='pad' to pad the edges."
                )
        # boundary="raise" is checked by the samplers: a grid raises when its stride
        # does not end flush, explicit anchors only when a patch leaves the array.
        return cls(dims, tuple(int(shape[d]) for d in dims), sizes, strides, modes)

    @property
    def ndim(self) -> int:
        """Number of patched axes."""
        return len(self.dims)

    def grid_starts(self) -> tuple[np.ndarray, ...]:
        """Start indices of the regular grid along each patched axis."""
        return tuple(
            axis_starts(e, s, t, mode, d)
            for d, e, s, t, mode in zip(
                self.dims, self.shape, self.size, self.stride, self.boundaries
            )
        )

    def grid_anchors(self) -> np.ndarray:
        """All anchors of the regular grid, ``(n, ndim)`` int64 in C order."""
        return cartesian(self.grid_starts())

    def max_anchor(self) -> np.ndarray:
        """Largest start index per axis whose patch needs no padding (0 if none does).

        Along a periodic axis every cell is a start: ``extent - 1``.
        """
        top = np.maximum(np.subtract(self.shape, self.size), 0).astype(np.int64)
        for j in self.periodic_axes:
            top[j] = self.shape[j] - 1
        return top

    def uncovered_grid_cells(self) -> int:
        """Count the cells the regular grid leaves uncovered (gaps, dropped remainders)."""
        covered = 1
        for j, (e, s, starts) in enumerate(zip(self.shape, self.size, self.grid_starts())):
            covered *= covered_cells(e, s, starts, self.wraps(j))
        return int(np.prod(self.shape, dtype=np.float64)) - covered

    def check_anchors(self, anchors: object, argument: str = "anchors") -> np.ndarray:
        """Validate explicit anchors and return them as ``(n, ndim)`` int64.

        With ``boundary="pad"`` a patch may run past the end of the array (it is
        padded); otherwise it must lie inside the array.
        """
        array = np.asarray(anchors)
        if array.ndim == 1 and self.ndim == 1:
            array = array[:, None]
        if array.ndim != 2 or array.shape[1] != self.ndim:
            raise GeometryError(
                f"{argument} has shape {array.shape}; expected (n_patches, {self.ndim}), one "
                f"column per patched dimension {list(self.dims)!r}."
            )
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise GeometryError(
                f"{argument} has dtype {array.dtype}; anchors are integer start indices. "
                "To give coordinate labels, use xpatch.AtLabels."
            )
        array = array.astype(np.int64)
        upper = self.max_anchor()
        for j in range(self.ndim):
            if self.pads(j):
                upper[j] = self.shape[j] - 1
        bad = (array < 0) | (array > upper)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise GeometryError(
                f"{argument}[{row}] = {array[row].tolist()} puts a patch of size "
                f"{self.size[col]} outside the array along {self.dims[col]!r} (extent "
                f"{self.shape[col]}): starts must lie in [0, {upper[col]}]"
                + ("." if self.pads(col) or self.wraps(col) else ", or use boundary='pad'.")
            )
        return array

    def padding(self, anchors: np.ndarray) -> tuple[int, ...]:
        """Cells past the end of each axis that the patches reach (padded, or wrapped)."""
        if len(anchors) == 0:
            return (0,) * self.ndim
        reach = anchors.max(axis=0) + np.asarray(self.size)
        return tuple(int(max(r - e, 0)) for r, e in zip(reach, self.shape))


def cartesian(axes: Sequence[np.ndarray]) -> np.ndarray:
    """Cartesian product of 1-D integer arrays as ``(n, len(axes))`` int64, C order.

    Examples
    --------
    >>> cartesian([np.array([0, 5]), np.array([1, 2])]).tolist()
    [[0, 1], [0, 2], [5, 1], [5, 2]]
    """
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1).astype(np.int64, copy=False)


def wrapped_copies(
    anchors: np.ndarray, size: Sequence[int], shape: Sequence[int], axes: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Rows and anchors of the patches that run past the end of a periodic axis, a turn back.

    A patch at ``a`` along a periodic axis of ``n`` cells covers ``[a, a + size)``
    modulo ``n``. Blended at ``a`` its cells past ``n`` fall off the grid; blended
    once more at ``a - n`` (a *copy*), the cells before 0 fall off and the rest land
    on the first cells, which is where they belong. So overlap-add of the patches
    and their copies, cropped to the grid, is the periodic blend for every
    reduction: each value lands once on its own cell, weights included. A patch
    past the end of two periodic axes has three copies (one per non-empty subset).

    Returns
    -------
    rows, copies
        ``(m,)`` the row of the patch each copy repeats, and ``(m, k)`` its anchor.

    Examples
    --------
    >>> rows, copies = wrapped_copies(np.array([[0], [3], [6]]), [4], [8], [0])
    >>> rows.tolist(), copies.tolist()
    ([2], [[-2]])
    """
    anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, len(shape))
    axes = list(axes)
    if not axes or not len(anchors):
        return np.empty(0, np.int64), np.empty((0, len(shape)), np.int64)
    turn = np.asarray(shape, dtype=np.int64)
    past = anchors[:, axes] + np.asarray(size)[axes] > turn[axes]
    rows, copies = [], []
    for count in range(1, len(axes) + 1):
        for subset in itertools.combinations(range(len(axes)), count):
            picked = np.flatnonzero(past[:, list(subset)].all(axis=1))
            moved = anchors[picked].copy()
            for j in subset:
                moved[:, axes[j]] -= turn[axes[j]]
            rows.append(picked)
            copies.append(moved)
    return np.concatenate(rows).astype(np.int64), np.concatenate(copies).astype(np.int64)
