"""A patch layout's state: its options, checked, and the frozen :class:`Layout` they build.

:class:`Layout` is what every helper of the xarray layer reads (views,
reconstruction, apply, the Grain sources): the object, the geometry, the window,
the resolved sampler and the compiled :class:`~xpatch.core.plan.Plan`.
:class:`~xpatch.Patcher` holds one and adds the verbs. :class:`LayoutOptions`
spells the options besides size and stride once: their defaults, and the checks
that do not need the object.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, GeometryError, OptionError, UncoveredCellsWarning
from xpatch.core.geometry import AxisBoundary, Geometry
from xpatch.core.padding import PadMode, check_pad_mode
from xpatch.core.plan import Plan, frozen_array, max_group_size
from xpatch.core.samplers import Anchors, AtLabels, RegularGrid, Sampler, index_positions
from xpatch.core.windows import BlendWindow, WindowSpec, make_window
from xpatch.xarray.samplers import ObjectSampler
from xpatch.xarray.variables import (
    is_dask_backed,
    pad_value_for,
    patch_bytes,
    patched_variables,
    plan_grid,
    valid_fraction,
)

T = TypeVar("T", xr.DataArray, xr.Dataset)


@dataclass(frozen=True)
class LayoutOptions:
    """The options of a patch layout besides its size and stride, with their defaults.

    The one place they are spelled: :class:`~xpatch.Patcher` takes them as keyword
    arguments (its docstring says what each means), and ``obj.patch(...)``,
    :func:`~xpatch.patch_scenes` and ``dt.patch(...)`` pass them on as ``**options``.

    Examples
    --------
    >>> LayoutOptions().boundary, LayoutOptions(window="hann").window
    ('shift', 'hann')
    >>> options, sizes = LayoutOptions.split({"y": 256, "window": "hann"})
    >>> options.window, sizes
    ('hann', {'y': 256})
    """

    boundary: AxisBoundary | Mapping[Hashable, AxisBoundary] = "shift"
    window: WindowSpec | Mapping[Hashable, WindowSpec] = "boxcar"
    sampler: Sampler | AtLabels | ObjectSampler | None = None
    min_valid: float | None = None
    pad_value: Any = None
    pad_mode: PadMode | Mapping[Hashable, PadMode] = "constant"
    halo: int | Mapping[Hashable, int] | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Return the option names, in order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def split(cls, keywords: Mapping[str, Any]) -> tuple[LayoutOptions, dict[str, Any]]:
        """Split keyword arguments into the layout options and the rest (patch sizes)."""
        names = cls.names()
        options = {k: v for k, v in keywords.items() if k in names}
        return cls(**options), {k: v for k, v in keywords.items() if k not in names}

    def as_keywords(self) -> dict[str, Any]:
        """Return the options as keyword arguments of :class:`~xpatch.Patcher`."""
        return {name: getattr(self, name) for name in self.names()}

    def check_min_valid(self) -> None:
        """Refuse a ``min_valid`` that is not a fraction in [0, 1] (or None)."""
        value = self.min_valid
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0
        ):
            raise OptionError(
                f"min_valid={value!r} must be a fraction in [0, 1] (or None for no filter)."
            )


class HasLayout(Protocol):
    """Anything that carries a :class:`Layout`: a :class:`~xpatch.Patcher`."""

    @property
    def layout(self) -> Layout:  # noqa: D102
        ...


@dataclass(frozen=True, eq=False)
class Layout(Generic[T]):
    """The frozen state of a patch layout over a DataArray or Dataset.

    Built once by :meth:`build` (every argument checked, the anchors placed and
    compiled into a :class:`~xpatch.core.plan.Plan`); read by the views,
    reconstruction, apply and the Grain sources. Nothing in it changes.

    Attributes
    ----------
    obj
        The patched DataArray or Dataset.
    geometry
        Sizes, strides and boundary in axis terms, over the patched dims in the
        object's order.
    window
        The window spec as given; :attr:`blend_window` holds its values.
    blend_window
        The window's values (and 1-D factors), as overlap-add takes them.
    sampler
        The sampler that placed the patches (resolved against the object).
    min_valid, pad_value, pad_mode
        As given (``pad_mode`` checked against ``boundary`` and ``pad_value``;
        ``{dim: mode}`` when the patched dims are padded differently).
    plan
        The compiled plan: anchors by chunk, groups, boxes and the chunk grid.
    halo
        Cells read on each side of a patch beyond its window, per patched dim
        (zeros: none). The window (size, stride, boundary) is the kept part.
    grown
        With a halo, pad modes per dim or a periodic dim, the layout patches are
        read through (:attr:`reading`): the same object, each window grown by
        the halo, positions outside the array read as ``pad_mode`` says per dim
        (:func:`grown_layout`); None otherwise.
    margin
        Of a :attr:`reading` layout: the halo its windows start before the
        patches' (empty, or zeros, for a layout of windows).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> da = xr.DataArray(np.zeros((4, 6)), dims=("y", "x"))
    >>> layout = Layout.build(da, {"y": 2, "x": 3}, None, LayoutOptions())
    >>> len(layout), layout.dims, layout.size
    (4, ('y', 'x'), {'y': 2, 'x': 3})
    """

    obj: T
    geometry: Geometry
    window: WindowSpec | Mapping[Hashable, WindowSpec]
    blend_window: BlendWindow
    sampler: Sampler
    min_valid: float | None
    pad_value: Any
    pad_mode: PadMode | Mapping[Hashable, PadMode]
    plan: Plan
    halo: tuple[int, ...] = ()
    grown: Layout | None = None
    margin: tuple[int, ...] = ()

    @classmethod
    def build(
        cls,
        obj: T,
        size: Mapping[Hashable, int],
        stride: int | Mapping[Hashable, int] | None,
        options: LayoutOptions,
    ) -> Layout[T]:
        """Check everything, place the anchors and compile the plan.

        Raises before any work: the object's type, the size's dims, the options.
        Reads the object's values only for ``min_valid`` and samplers that read
        them (:class:`~xpatch.WeightedAnchors`).
        """
        if not isinstance(obj, xr.DataArray | xr.Dataset):
            raise OptionError(
                f"obj is a {type(obj).__name__}; xpatch patches xarray.DataArray and "
                "xarray.Dataset objects (wrap numpy arrays with xr.DataArray(arr, dims=...))."
            )
        check_size_dims(obj, size)
        dims = patched_dims(obj, size)
        variables = patched_variables(obj, dims)
        if not variables:
            raise DimensionError(
                f"no data variable of the Dataset has any of the patched dimensions {list(dims)!r}."
            )
        geometry = Geometry.build({d: obj.sizes[d] for d in dims}, size, stride, options.boundary)
        periodic = [geometry.dims[j] for j in geometry.periodic_axes]
        check_one_turn(obj, periodic)
        window_array = make_window(options.window, geometry.dims, geometry.size)
        sampler = RegularGrid() if options.sampler is None else options.sampler
        if isinstance(sampler, AtLabels):
            sampler = sampler.resolve(label_locator(obj))
        elif isinstance(sampler, ObjectSampler):
            sampler = sampler.resolve(obj, geometry)
        if not isinstance(sampler, Sampler):
            raise OptionError(
                f"sampler={sampler!r} has no anchors(geometry) method; use xpatch.RegularGrid(), "
                "JitteredGrid, RandomAnchors, Anchors, AtLabels, AtPoints, InBounds or "
                "WeightedAnchors."
            )
        options.check_min_valid()
        halo = check_halo(options.halo, geometry.dims)
        check_halo_reach(geometry, halo)
        # A halo reaches past the array's edges whatever the boundary: pad_mode fills it.
        padded = any(halo) or any(geometry.pads(j) for j in range(geometry.ndim))
        filled = "pad" if padded else "shift"
        pad_mode = check_pad_modes(
            options.pad_mode, geometry.dims, filled, options.pad_value, periodic
        )
        if filled == "pad":
            for name, var in variables.items():
                pad_value_for(options.pad_value, var.dtype, name)
        anchors = sampler.anchors(geometry)  # boundary="raise" refuses here, before any work
        if getattr(sampler, "covers_grid", False):
            warn_uncovered(geometry)
        if options.min_valid is not None:
            fraction = valid_fraction(variables, geometry, anchors)
            anchors = anchors[(fraction > 0) & (fraction >= options.min_valid)]
        lazy = any(is_dask_backed(var) for var in variables.values())
        plan = Plan.compile(
            anchors,
            plan_grid(variables, dims, geometry.shape),
            geometry.size,
            # Explicit anchors keep the caller's order; so does input in memory.
            keep_order=bool(getattr(sampler, "keeps_order", False)) or not lazy,
            max_group=min(max_group_size(patch_bytes(v, size)) for v in variables.values()),
        )
        layout = cls(
            obj,
            geometry,
            options.window,
            BlendWindow.of(window_array),
            sampler,
            options.min_valid,
            options.pad_value,
            pad_mode,
            plan,
            halo,
        )
        # Dims padded differently, and periodic dims, are read through a layout whose
        # windows carry the halo and one pad mode per dim (a periodic dim's is "wrap").
        grown = any(halo) or not isinstance(pad_mode, str) or bool(periodic)
        return replace(layout, grown=grown_layout(layout)) if grown else layout

    @property
    def reading(self) -> Layout[T]:
        """The layout patches are read through: :attr:`grown` with a halo, else this one."""
        return self if self.grown is None else self.grown

    def axis_pad_modes(self, columns: Sequence[int] | None = None) -> tuple[PadMode, ...]:
        """Return the pad mode of each patched dim (of ``columns`` of them), as the core reads it.

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> da = xr.DataArray(np.zeros((4, 6)), dims=("y", "x"))
        >>> Layout.build(da, {"y": 2, "x": 3}, None, LayoutOptions(
        ...     boundary={"y": "pad", "x": "periodic"}, pad_mode="edge")).axis_pad_modes()
        ('edge', 'wrap')
        """
        columns = range(len(self.dims)) if columns is None else columns
        mode = self.pad_mode
        if isinstance(mode, str):
            return tuple(mode for _ in columns)  # type: ignore[misc]
        return tuple(mode.get(self.dims[j], "constant") for j in columns)

    def read_anchors(self, anchors: np.ndarray) -> np.ndarray:
        """Where the patches at window ``anchors`` start as :attr:`reading` reads them."""
        reading = self.reading
        if not any(reading.margin):
            return anchors
        return np.asarray(anchors) - np.asarray(reading.margin, dtype=np.int64)

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims: in a DataArray's order, in a Dataset's as the size gave them."""
        return self.geometry.dims

    @property
    def size(self) -> dict[Hashable, int]:
        """Patch extent per patched dim."""
        return dict(zip(self.dims, self.geometry.size))

    @property
    def stride(self) -> dict[Hashable, int]:
        """Step between patch starts per patched dim."""
        return dict(zip(self.dims, self.geometry.stride))

    @property
    def boundary(self) -> AxisBoundary | dict[Hashable, AxisBoundary]:
        """The boundary mode; ``{dim: mode}`` when the dims differ."""
        return self.geometry.boundary

    @property
    def periodic(self) -> tuple[Hashable, ...]:
        """The periodic dims."""
        return tuple(self.geometry.dims[j] for j in self.geometry.periodic_axes)

    @property
    def variables(self) -> dict[Hashable, xr.Variable]:
        """The patched variables: the DataArray's, or each data variable with a patched dim."""
        return patched_variables(self.obj, self.dims)

    def options(self, **changes: Any) -> LayoutOptions:
        """Return the options this layout was built with, some of them changed.

        The sampler is the resolved one (a label or map sampler's anchors).
        """
        halo = dict(zip(self.dims, self.halo)) if any(self.halo) else None
        given = LayoutOptions(
            self.boundary,
            self.window,
            self.sampler,
            self.min_valid,
            self.pad_value,
            self.pad_mode,
            halo,
        )
        return replace(given, **changes)

    def over(
        self,
        obj: T | None = None,
        anchors: Mapping[Hashable, Any] | np.ndarray | None = None,
        size: Mapping[Hashable, int] | None = None,
        stride: Mapping[Hashable, int] | None = None,
        **changes: Any,
    ) -> Layout:
        """Return this layout over another object, at other anchors, or both.

        The one way to lay the same patches elsewhere: a DataTree's node at its own
        resolution, the blend across a periodic seam. ``anchors`` (``{dim: starts}``,
        or ``(n, k)`` in the order of :attr:`dims`) are kept as given, their order
        included, and nothing filters them (``min_valid`` is off). ``size``,
        ``stride`` and the options in ``changes`` default to this layout's.

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> da = xr.DataArray(np.zeros((4, 6)), dims=("y", "x"))
        >>> layout = Layout.build(da, {"y": 2, "x": 3}, None, LayoutOptions())
        >>> layout.over(anchors={"y": [2, 0], "x": [3, 1]}).plan.anchors.tolist()
        [[2, 3], [0, 1]]
        """
        if anchors is not None:
            if not isinstance(anchors, Mapping):
                columns = np.asarray(anchors).reshape(-1, len(self.dims))
                anchors = {d: columns[:, j] for j, d in enumerate(self.dims)}
            changes = {"sampler": Anchors(dict(anchors)), "min_valid": None, **changes}
        return Layout.build(
            self.obj if obj is None else obj,
            self.size if size is None else dict(size),
            self.stride if stride is None else dict(stride),
            self.options(**changes),
        )

    def __len__(self) -> int:
        return len(self.plan)

    def __repr__(self) -> str:
        g = self.geometry
        size = ", ".join(f"{d}: {s}" for d, s in zip(g.dims, g.size))
        stride = ", ".join(f"{d}: {s}" for d, s in zip(g.dims, g.stride))
        mode = "" if self.pad_mode == "constant" else f" pad_mode={self.pad_mode!r}"
        if self.grown is not None and not isinstance(self.pad_mode, str):
            mode = f" pad_mode={dict(self.pad_mode)!r}"
        if any(self.halo):
            mode += f" halo={dict(zip(g.dims, self.halo))!r}"
        return (
            f"({len(self)} patches) size=({size}) stride=({stride}) "
            f"boundary={self.boundary!r}{mode} window={self.window!r} sampler={self.sampler!r}"
        )


def check_pad_modes(
    pad_mode: object,
    dims: tuple[Hashable, ...],
    boundary: str,
    pad_value: object,
    periodic: tuple[Hashable, ...] | list = (),
) -> PadMode | dict[Hashable, PadMode]:
    """Return ``pad_mode``: one mode, or ``{dim: mode}`` (dims left out: ``"constant"``).

    A mapping of one mode for every patched dim is that mode. Each mode is checked
    as one mode is (:func:`~xpatch.core.padding.check_pad_mode`). A periodic dim
    reads the cells past its ends from the other side (``"wrap"``): one mode for
    all is the other dims' mode, and another mode named for a periodic dim is refused.

    Examples
    --------
    >>> check_pad_modes({"x": "wrap", "y": "reflect"}, ("y", "x"), "pad", None)
    {'y': 'reflect', 'x': 'wrap'}
    >>> check_pad_modes({"x": "wrap", "y": "wrap"}, ("y", "x"), "pad", None)
    'wrap'
    """
    if periodic:
        given = pad_mode if isinstance(pad_mode, Mapping) else {}
        clash = {d: m for d, m in given.items() if d in periodic and m not in ("constant", "wrap")}
        if clash:
            raise OptionError(
                f"pad_mode={pad_mode!r} pads the periodic dim(s) {list(clash)!r}: a periodic "
                "dim has no edge, its halo is read from the other side. Give pad_mode only "
                "for the other dims, e.g. pad_mode={'lat': 'reflect'}."
            )
        if not isinstance(pad_mode, Mapping):
            pad_mode = {d: pad_mode for d in dims if d not in periodic}
        else:
            pad_mode = {d: m for d, m in pad_mode.items() if d not in periodic}
        rest = tuple(d for d in dims if d not in periodic)
        modes = check_pad_modes(pad_mode, rest, boundary, pad_value) if rest else "constant"
        per_dim = dict.fromkeys(rest, modes) if isinstance(modes, str) else dict(modes)
        return {d: "wrap" if d in periodic else per_dim[d] for d in dims}
    if not isinstance(pad_mode, Mapping):
        return check_pad_mode(pad_mode, boundary, pad_value)
    unknown = [d for d in pad_mode if d not in dims]
    if unknown:
        raise OptionError(
            f"pad_mode={dict(pad_mode)!r} names {unknown!r}, which are not patched dims; "
            f"give {{dim: mode}} over {list(dims)!r} (dims left out are 'constant')."
        )
    modes = {d: pad_mode.get(d, "constant") for d in dims}
    for mode in modes.values():
        check_pad_mode(mode, boundary, None)
    if pad_value is not None and all(m != "constant" for m in modes.values()):
        check_pad_mode(next(iter(modes.values())), boundary, pad_value)  # refuses, naming it
    if len(set(modes.values())) == 1:
        return next(iter(modes.values()))
    return modes


def check_one_turn(obj: xr.DataArray | xr.Dataset, periodic: list) -> None:
    """Refuse a periodic dim whose labels, in degrees, do not span one whole turn.

    A regional grid (longitudes 0 ... 90) marked periodic would blend 90E onto 0E.
    Only labels known to be angles are checked (a ``lon``/``longitude`` name, or
    ``units`` of degrees); other labels are the caller's to vouch for.
    """
    for d in periodic:
        if d not in obj.coords or obj[d].ndim != 1 or obj.sizes[d] < 2:
            continue
        labels = obj[d]
        units = str(labels.attrs.get("units", "")).lower()
        named = str(d).lower() in ("lon", "longitude") or labels.attrs.get("standard_name") in (
            "longitude",
            "grid_longitude",
        )
        numeric = np.issubdtype(labels.dtype, np.number)
        if not numeric or not (named or units.startswith("degree")):
            continue
        values = np.asarray(labels.values, dtype=np.float64)
        step = np.diff(values)
        turn = abs(float(values[-1] - values[0] + step[-1]))
        regular = np.allclose(step, step[0], rtol=1e-6, atol=0)
        if not regular or abs(turn - 360.0) > 1e-6 * 360.0:
            raise GeometryError(
                f"boundary={{{d!r}: 'periodic'}}: the labels of {d!r} ({values[0]:g} ... "
                f"{values[-1]:g}, {len(values)} cells{'' if regular else ', irregular'}) span "
                f"{turn:g} degrees, not one whole turn of 360: the last cell would be blended "
                f"onto the first (a last label repeating the first counts twice). Patch a "
                f"global grid; or, if {d!r} does wrap with these cells, patch it by position: "
                f"obj.drop_vars({d!r})."
            )


def check_halo_reach(geometry: Geometry, halo: tuple[int, ...]) -> None:
    """Refuse a halo longer than its dim: past that it reads padding (or repeats) only.

    The size check of the grown patch (:meth:`~xpatch.core.geometry.Geometry.build`
    refuses a patch larger than its dim): a halo of 10**6 cells on a 100-cell dim
    would otherwise cut patches of two million cells per side.
    """
    for j, (d, h, n) in enumerate(zip(geometry.dims, halo, geometry.shape)):
        if h > n:
            what = "a whole turn of the periodic dim" if geometry.wraps(j) else "the array along"
            raise GeometryError(
                f"halo[{d!r}]={h} reaches past {what} {d!r} ({n} cells): each patch would "
                f"read {h} cells on each side of its {geometry.size[j]}. Use a halo of at "
                f"most {n} along {d!r} (a model's receptive field, e.g. halo={{{d!r}: 8}})."
            )


def check_size_dims(obj: xr.DataArray | xr.Dataset, size: Mapping[Hashable, object]) -> None:
    """Raise a :class:`~xpatch.DimensionError` if ``size`` names a dim ``obj`` lacks."""
    unknown = [d for d in size if d not in obj.dims]
    if unknown:
        raise DimensionError(
            f"size names dimension(s) {unknown!r} that the {type(obj).__name__} does not "
            f"have; its dimensions are {list(obj.dims)!r}."
        )


def check_halo(halo: object, dims: tuple[Hashable, ...]) -> tuple[int, ...]:
    """Return ``halo`` (one int, or ``{dim: int}``; None: 0) per patched dim, or raise.

    Examples
    --------
    >>> check_halo({"x": 2}, ("y", "x")), check_halo(1, ("y", "x")), check_halo(None, ("y",))
    ((0, 2), (1, 1), (0,))
    """
    if halo is None:
        return (0,) * len(dims)
    given = halo if isinstance(halo, Mapping) else dict.fromkeys(dims, halo)
    unknown = [d for d in given if d not in dims]
    bad = [v for v in given.values() if isinstance(v, bool) or not isinstance(v, int | np.integer)]
    if unknown or bad or any(v < 0 for v in given.values() if v not in bad):
        raise OptionError(
            f"halo={halo!r} must be cells read on each side of a patch: one int >= 0, or "
            f"{{dim: int}} over the patched dims {list(dims)!r}, e.g. halo={{'y': 2, 'x': 2}}."
        )
    return tuple(int(given.get(d, 0)) for d in dims)


def grown_layout(layout: Layout) -> Layout:
    """Return ``layout`` as its patches are read: windows grown by the halo, modes per dim.

    The same object, no copy of it: each read window is ``[a - halo, a + size + halo)``
    (:attr:`Layout.margin` holds the halo), and the core reads the positions it
    has outside the array as ``pad_mode`` says per dim (a periodic dim wrapped:
    :func:`~xpatch.core.padding.source_indices`). The windows' plan keeps its
    groups and order, so that patches are read chunk by chunk as before.
    """
    geometry, halo = layout.geometry, layout.halo
    size = tuple(s + 2 * h for s, h in zip(geometry.size, halo))
    boundaries = tuple(b if geometry.wraps(j) else "pad" for j, b in enumerate(geometry.boundaries))
    grown = Geometry(geometry.dims, geometry.shape, size, geometry.stride, boundaries)
    plan = layout.plan
    anchors = frozen_array(plan.anchors - np.asarray(halo)) if any(halo) else plan.anchors
    plan = Plan(plan.grid, size, anchors, plan.order, plan.groups)
    # The halo is read, not kept: its cells weigh nothing.
    window = np.pad(layout.blend_window.values, [(h, h) for h in halo])
    modes = dict(zip(geometry.dims, layout.axis_pad_modes()))
    return replace(
        layout,
        geometry=grown,
        blend_window=BlendWindow.of(window),
        pad_mode=next(iter(set(modes.values()))) if len(set(modes.values())) == 1 else modes,
        plan=plan,
        halo=(0,) * len(halo),
        grown=None,
        margin=tuple(halo),
    )


def patched_dims(obj: xr.DataArray | xr.Dataset, size: Mapping[Hashable, int]) -> tuple:
    """Return the patched dims: in a DataArray's own order, a Dataset's as the caller gave them.

    A Dataset's dims come in the order its variables brought them: adding a
    ``(lat, lon)`` mask before a ``(time, lat, lon)`` field would turn anchors
    from ``(time, lat, lon)`` into ``(lat, lon, time)``. The caller's order does not
    move whatever variables join.

    Examples
    --------
    >>> field = xr.DataArray(np.zeros((2, 4, 6)), dims=("time", "lat", "lon"))
    >>> ds = xr.Dataset({"mask": field.isel(time=0), "t": field})
    >>> list(ds.dims), patched_dims(ds, {"time": 1, "lat": 2, "lon": 3})
    (['lat', 'lon', 'time'], ('time', 'lat', 'lon'))
    >>> patched_dims(field, {"lon": 3, "lat": 2})
    ('lat', 'lon')
    """
    if isinstance(obj, xr.Dataset):
        return tuple(d for d in size if d in obj.dims)
    return tuple(d for d in obj.dims if d in size)


def layout_of(laid: Layout | HasLayout) -> Layout:
    """Return the :class:`Layout` itself, or the one a :class:`~xpatch.Patcher` carries."""
    return laid if isinstance(laid, Layout) else laid.layout


def size_mapping(size: Mapping[Hashable, int] | None, size_kwargs: Mapping[str, int]) -> dict:
    """Return the patch size given as ``size=`` or as keyword arguments, checked."""
    if size is not None and size_kwargs:
        raise OptionError(
            f"the patch size was given twice: size={size!r} and keyword arguments "
            f"{dict(size_kwargs)!r}; use one of them."
        )
    size = size_kwargs if size is None else size
    if not isinstance(size, Mapping):
        raise OptionError(
            f"size={size!r} must map dimension names to patch extents, "
            "e.g. size={'y': 256, 'x': 256} or .patch(y=256, x=256)."
        )
    if not size:
        raise OptionError("no patch size given: pass size={'y': 256, 'x': 256} or y=256, x=256.")
    return dict(size)


def label_locator(obj: xr.DataArray | xr.Dataset):
    """Return a function that finds the positions of coordinate labels (for ``AtLabels``)."""

    def locate(dim: Hashable, labels: np.ndarray, method: str | None) -> np.ndarray:
        if dim not in obj.indexes:
            raise DimensionError(
                f"AtLabels: dimension {dim!r} has no coordinate to look labels up in; "
                "give start indices with xpatch.Anchors instead."
            )
        return index_positions(obj.indexes[dim], dim, labels, method)

    return locate


def warn_uncovered(geometry: Geometry) -> None:
    """Warn with an :class:`~xpatch.UncoveredCellsWarning` if some cells get no patch."""
    uncovered = geometry.uncovered_grid_cells()
    if not uncovered:
        return
    total = int(np.prod(geometry.shape, dtype=np.float64))
    size = dict(zip(geometry.dims, geometry.size))
    stride = dict(zip(geometry.dims, geometry.stride))
    warnings.warn(
        f"{uncovered} of {total} cells ({uncovered / total:.1%}) along "
        f"{list(geometry.dims)!r} are covered by no patch (boundary={geometry.boundary!r}, "
        f"size={size}, stride={stride}); they reconstruct to NaN. "
        "Use boundary='shift' or 'pad', or a stride <= size, to cover every cell.",
        UncoveredCellsWarning,
        stacklevel=5,  # the caller of obj.patch(...)
    )
