"""The xarray layer: dims by name, coordinates and attributes around the core.

:class:`Patcher` is the immutable patch layout that ``da.patch(...)`` returns;
``xpatch.patch(obj, ...)`` is its functional spelling.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import dask.array as da
import numpy as np
import xarray as xr
from numpy.typing import DTypeLike

from xpatch.core.apply import BatchFunction, apply_dask, apply_numpy
from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES
from xpatch.core.errors import (
    DimensionError,
    GeometryError,
    OptionError,
    PredictionError,
    UncoveredCellsWarning,
)
from xpatch.core.extract import (
    check_pad_value,
    chunk_order,
    extract_dask,
    extract_numpy,
    max_group_size,
    patch_groups,
)
from xpatch.core.geometry import Boundary, Geometry
from xpatch.core.overlap_add import (
    BlendWindow,
    Reduction,
    accumulation_dtype,
    check_reduction,
    overlap_add,
    overlap_add_dask,
)
from xpatch.core.samplers import AtLabels, RegularGrid, Sampler, anchor_array
from xpatch.core.validity import window_sums
from xpatch.core.windows import WindowSpec, make_window
from xpatch.geo import (
    AtPoints,
    InBounds,
    encoded_nodata_of,
    fits_dtype,
    grid_mapping_name,
    nodata_in,
    nodata_of,
    patch_bounds,
    patch_transforms,
    to_gdal,
    valid_cells,
    with_transform,
)

if TYPE_CHECKING:
    from xpatch.grain import PatchSource

T = TypeVar("T", xr.DataArray, xr.Dataset)

PATCH_DIM = "patch"

#: Attributes that say how to read an array's stored values (CF packing, fill
#: values); ``apply`` does not pass them on to a function's output.
VALUE_ENCODING_ATTRS = frozenset(
    {"_FillValue", "missing_value", "fill_value", "scale_factor", "add_offset", "_Unsigned",
     "valid_range", "valid_min", "valid_max", "nodata"}
)  # fmt: skip


def is_dask_backed(var: xr.Variable) -> bool:
    """Whether ``var`` holds a dask array, asked without loading lazily opened data.

    ``Variable.data`` reads a lazily opened (unchunked) file variable whole;
    ``chunks`` is None for it and does not read.
    """
    return var.chunks is not None and isinstance(var.data, da.Array)


def _fill_nodata(variable: xr.Variable, attrs: Mapping) -> xr.Variable:
    """Cells no valid prediction reached (NaN) take the nodata value of ``attrs``, if any."""
    nodata = nodata_in(attrs)
    if nodata is None or not fits_dtype(nodata, variable.dtype):
        return variable
    if isinstance(nodata, float) and np.isnan(nodata):
        return variable
    return variable.fillna(nodata)


def _mask_input_nodata(result: xr.Variable, source: xr.Variable | None) -> xr.Variable:
    """NaN where the input ``source`` has no data, if it has a nodata value.

    Band by band when ``result`` keeps the input's dims and sizes; otherwise a
    cell has no data when no band of the input has any.
    """
    if source is None or (nodata_of(source) is None and encoded_nodata_of(source) is None):
        return result
    valid = valid_cells(source)
    if set(result.dims) == set(source.dims) and all(
        result.sizes[d] == source.sizes[d] for d in source.dims
    ):
        return result.where(valid.transpose(*result.dims).variable)
    carried = [d for d in source.dims if d not in result.dims or result.sizes[d] != source.sizes[d]]
    spatial = valid.any(carried) if carried else valid
    return result.where(spatial.variable)


def _carry_encoded_nodata(source: xr.Variable | None, target: xr.Variable | xr.DataArray) -> None:
    """Give ``target`` the masked input's ``encoding["_FillValue"]``, which writers use."""
    value = None if source is None else encoded_nodata_of(source)
    if value is not None and fits_dtype(value, target.dtype):
        target.encoding["_FillValue"] = value


def _size_mapping(size: Mapping[Hashable, int] | None, size_kwargs: Mapping[str, int]) -> dict:
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


def _patched_variables(obj: xr.DataArray | xr.Dataset, dims: Sequence[Hashable]) -> dict:
    """Return the data variables that hold every patched dim (the rest are carried)."""
    if isinstance(obj, xr.DataArray):
        return {obj.name: obj.variable}
    return {name: var.variable for name, var in obj.data_vars.items() if set(dims) <= set(var.dims)}


def _first_surplus(given: np.ndarray, expected: np.ndarray) -> int:
    """Index of the first row of ``given`` that ``expected`` lacks (or has fewer of)."""
    remaining: dict[tuple, int] = {}
    for row in map(tuple, expected.tolist()):
        remaining[row] = remaining.get(row, 0) + 1
    for i, row in enumerate(map(tuple, given.tolist())):
        remaining[row] = remaining.get(row, 0) - 1
        if remaining[row] < 0:
            return i
    return 0


def _extended_labels(values: np.ndarray, start: int, size: int) -> np.ndarray:
    """Coordinate labels of ``[start, start + size)``, extrapolated past the end."""
    inside = values[start : start + size]
    missing = size - len(inside)
    if missing == 0:
        return inside
    if len(values) >= 2 and (
        np.issubdtype(values.dtype, np.number) or np.issubdtype(values.dtype, np.datetime64)
    ):
        step = values[-1] - values[-2]
        return np.concatenate([inside, values[-1] + step * np.arange(1, missing + 1)])
    fill = np.array([None] * missing, dtype=object)
    return np.concatenate([inside.astype(object), fill])


class Patcher(Generic[T]):
    """An immutable layout of (overlapping) patches over a DataArray or Dataset.

    Parameters
    ----------
    obj
        The array (or Dataset, whose data variables are patched together) to cut.
        Numpy- or dask-backed; dask input stays lazy.
    size
        Patch extent per patched dim, ``{dim: int}``. Dims not named are carried
        whole (bands, time, variables). Or give ``**size_kwargs``.
    stride
        Step between patch starts: one int for all patched dims, or ``{dim: int}``.
        Default: the size (no overlap).
    boundary
        ``"shift"`` (default): the last patch along a dim is moved back to end flush
        with the edge, every cell is covered. ``"pad"``: edge patches run past the
        edge and are padded with ``pad_value``; padded cells carry no weight.
        ``"drop"``: incomplete patches are left out, with an
        :class:`~xpatch.UncoveredCellsWarning` that counts the uncovered cells.
        ``"raise"``: raise if the stride does not end flush with the edge.
    window
        Blending window for :meth:`reconstruct`: ``"boxcar"`` (default), ``"hann"``,
        ``"triangular"``, ``"tukey"`` / ``("tukey", alpha)``, ``("gaussian", sigma)``,
        any :func:`scipy.signal.get_window` spec, a ``{dim: spec}`` mapping, or an
        array of the patch shape. Windows are evaluated so that they are never 0:
        every covered cell gets positive total weight.
    sampler
        Where patches start: :class:`~xpatch.RegularGrid` (default),
        :class:`~xpatch.JitteredGrid`, :class:`~xpatch.RandomAnchors`,
        :class:`~xpatch.Anchors` (indices) or :class:`~xpatch.AtLabels`
        (coordinate labels).
    min_valid
        Validity filter: keep only patches whose fraction of non-NaN values is at
        least ``min_valid`` and above 0 (``min_valid=0`` drops all-NaN patches).
        Computed when the anchors are first needed, as one small dask computation
        for dask input.
    pad_value
        Fill of padded cells with ``boundary="pad"``; default NaN for float data
        and 0 for integer data.
    **size_kwargs
        The patch size as keyword arguments, ``y=256, x=256``.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> da = xr.DataArray(np.arange(20.0).reshape(4, 5), dims=("y", "x"))
    >>> p = da.patch(y=2, x=3, stride={"x": 2})
    >>> len(p), p.anchors().values.tolist()
    (4, [[0, 0], [0, 2], [2, 0], [2, 2]])
    >>> bool(p.reconstruct(p.patches()).equals(da))
    True

    The functional form, and the seed recipe's layout (256 x 256, 32 x 32 patches,
    stride 24): ``boundary="drop"`` leaves the remainder out and says so.

    >>> import warnings
    >>> scene = xr.DataArray(np.zeros((256, 256)), dims=("y", "x"))
    >>> len(xpatch.patch(scene, y=32, x=32, stride=24))
    121
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     n = len(xpatch.patch(scene, y=32, x=32, stride=24, boundary="drop"))
    >>> n, caught[0].category.__name__
    (100, 'UncoveredCellsWarning')
    """

    __slots__ = (
        "_anchor_cache",
        "_geometry",
        "_group_cache",
        "_min_valid",
        "_obj",
        "_pad_value",
        "_sampler",
        "_window",
        "_window_spec",
    )

    def __init__(
        self,
        obj: T,
        size: Mapping[Hashable, int] | None = None,
        stride: int | Mapping[Hashable, int] | None = None,
        *,
        boundary: Boundary = "shift",
        window: WindowSpec | Mapping[Hashable, WindowSpec] = "boxcar",
        sampler: Sampler | AtLabels | None = None,
        min_valid: float | None = None,
        pad_value: Any = None,
        **size_kwargs: int,
    ) -> None:
        if not isinstance(obj, xr.DataArray | xr.Dataset):
            raise OptionError(
                f"obj is a {type(obj).__name__}; xpatch patches xarray.DataArray and "
                "xarray.Dataset objects (wrap numpy arrays with xr.DataArray(arr, dims=...))."
            )
        size = _size_mapping(size, size_kwargs)
        unknown = [d for d in size if d not in obj.dims]
        if unknown:
            raise DimensionError(
                f"size names dimension(s) {unknown!r} that the {type(obj).__name__} does not "
                f"have; its dimensions are {list(obj.dims)!r}."
            )
        dims = [d for d in obj.dims if d in size]
        if isinstance(obj, xr.Dataset) and not _patched_variables(obj, dims):
            raise DimensionError(
                f"no data variable of the Dataset has all of the patched dimensions {dims!r}."
            )
        geometry = Geometry.build({d: obj.sizes[d] for d in dims}, size, stride, boundary)
        window_array = make_window(window, geometry.dims, geometry.size)
        sampler = RegularGrid() if sampler is None else sampler
        if isinstance(sampler, AtLabels):
            sampler = sampler.resolve(self._locator(obj))
        elif isinstance(sampler, AtPoints | InBounds):
            sampler = sampler.resolve(obj, geometry)
        if not isinstance(sampler, Sampler):
            raise OptionError(
                f"sampler={sampler!r} has no anchors(geometry) method; use xpatch.RegularGrid(), "
                "JitteredGrid, RandomAnchors, Anchors, AtLabels, AtPoints or InBounds."
            )
        if min_valid is not None and not (
            isinstance(min_valid, int | float) and 0.0 <= min_valid <= 1.0
        ):
            raise OptionError(
                f"min_valid={min_valid!r} must be a fraction in [0, 1] (or None for no filter)."
            )
        if boundary == "pad":
            for var in _patched_variables(obj, dims).values():
                check_pad_value(pad_value, var.dtype)
        for name, value in (
            ("_obj", obj),
            ("_geometry", geometry),
            ("_window_spec", window),
            ("_window", BlendWindow.of(window_array)),
            ("_sampler", sampler),
            ("_min_valid", min_valid),
            ("_pad_value", pad_value),
            ("_anchor_cache", None),
            ("_group_cache", None),
        ):
            object.__setattr__(self, name, value)
        if getattr(sampler, "covers_grid", False):
            uncovered = geometry.uncovered_grid_cells()
            if uncovered:
                total = int(np.prod(geometry.shape, dtype=np.float64))
                warnings.warn(
                    f"{uncovered} of {total} cells ({uncovered / total:.1%}) along "
                    f"{list(geometry.dims)!r} are covered by no patch (boundary={boundary!r}, "
                    f"size={dict(zip(dims, geometry.size))}, "
                    f"stride={dict(zip(dims, geometry.stride))}); they reconstruct to NaN. "
                    "Use boundary='shift' or 'pad', or a stride <= size, to cover every cell.",
                    UncoveredCellsWarning,
                    stacklevel=3,
                )

    # -- immutability and pickling -------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"Patcher is immutable (cannot set {name!r}); build a new one with obj.patch(...)."
        )

    def __getstate__(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        g = self._geometry
        size = ", ".join(f"{d}: {s}" for d, s in zip(g.dims, g.size))
        stride = ", ".join(f"{d}: {s}" for d, s in zip(g.dims, g.stride))
        count = len(self) if self._anchor_cache is not None or self._min_valid is None else "?"
        return (
            f"<xpatch.Patcher ({count} patches) size=({size}) stride=({stride}) "
            f"boundary={g.boundary!r} window={self._window_spec!r} sampler={self._sampler!r}>"
        )

    # -- layout ---------------------------------------------------------------------

    @property
    def obj(self) -> T:
        """The patched DataArray or Dataset."""
        return self._obj

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims, in the order they have in the object."""
        return self._geometry.dims

    @property
    def size(self) -> dict[Hashable, int]:
        """Patch extent per patched dim."""
        return dict(zip(self.dims, self._geometry.size))

    @property
    def stride(self) -> dict[Hashable, int]:
        """Step between patch starts per patched dim."""
        return dict(zip(self.dims, self._geometry.stride))

    @property
    def boundary(self) -> Boundary:
        """The boundary mode."""
        return self._geometry.boundary

    @property
    def window(self) -> WindowSpec | Mapping[Hashable, WindowSpec]:
        """The window spec as given (see :meth:`weights` for its values)."""
        return self._window_spec

    @property
    def geometry(self) -> Geometry:
        """The core geometry (sizes, strides, boundary) in axis terms."""
        return self._geometry

    @property
    def sampler(self) -> Sampler:
        """The sampler that placed the patches."""
        return self._sampler

    def _anchor_array(self) -> np.ndarray:
        if self._anchor_cache is None:
            anchors = self._sampler.anchors(self._geometry)
            if self._min_valid is not None:
                anchors = anchors[self._valid_patches(anchors)]
            bounds = self._chunk_bounds()
            if bounds is not None and not getattr(self._sampler, "keeps_order", False):
                anchors = anchors[chunk_order(anchors, bounds)]
            anchors.setflags(write=False)
            object.__setattr__(self, "_anchor_cache", anchors)
        return self._anchor_cache

    def _chunk_bounds(self) -> list[np.ndarray] | None:
        """Cumulative chunk ends along the patched dims of the first dask variable."""
        for var in _patched_variables(self._obj, self.dims).values():
            if is_dask_backed(var):
                return [np.cumsum(var.chunks[var.dims.index(d)]) for d in self.dims]
        return None

    def _patch_groups(self) -> list[tuple[int, int]]:
        """Split the patch index into runs that one task handles: one per input chunk."""
        if self._group_cache is None:
            anchors = self._anchor_array()
            bounds = self._chunk_bounds() or [np.array([n]) for n in self._geometry.shape]
            largest = max(
                (
                    max_group_size(
                        [self.size.get(d, n) for d, n in var.sizes.items()], var.dtype.itemsize
                    )
                    for var in _patched_variables(self._obj, self.dims).values()
                ),
                default=1,
            )
            object.__setattr__(self, "_group_cache", patch_groups(anchors, bounds, largest))
        return self._group_cache

    def _valid_patches(self, anchors: np.ndarray) -> np.ndarray:
        counts = 0
        per_cell = 0
        for var in _patched_variables(self._obj, self.dims).values():
            carried = [d for d in var.dims if d not in self.dims]
            valid = valid_cells(var)
            counts = counts + valid.sum(carried).transpose(*self.dims).data
            per_cell += int(np.prod([var.sizes[d] for d in carried], dtype=np.int64))
        valid_in_patch = window_sums(counts, anchors, self._geometry.size)
        fraction = valid_in_patch / (per_cell * np.prod(self._geometry.size, dtype=np.float64))
        return (fraction > 0) & (fraction >= self._min_valid)

    def __len__(self) -> int:
        return len(self._anchor_array())

    def anchors(self) -> xr.DataArray:
        """Start index of every patch along each patched dim.

        Returns
        -------
        xarray.DataArray
            int64, dims ``("patch", "dim")``, with ``dim`` labelled by the patched
            dims in the order of :attr:`dims`.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.zeros((4, 6)), dims=("y", "x"))
        >>> da.patch(y=4, x=3).anchors().values.tolist()
        [[0, 0], [0, 3]]
        """
        return xr.DataArray(
            self._anchor_array().copy(),
            dims=(PATCH_DIM, "dim"),
            coords={"dim": list(self.dims)},
            name="anchors",
        )

    def bounds(self) -> xr.DataArray:
        """Extent of every patch in map units: ``(left, bottom, right, top)``.

        From the array's transform (its regularly spaced y and x coordinates, or
        its grid mapping's ``GeoTransform``), so for a rioxarray raster on a
        north-up (rectilinear) grid row ``i`` equals ``p[i].rio.bounds()``; for a
        rotated grid it is the envelope of the rotated patch. Padded patches
        extend past the array.

        Returns
        -------
        xarray.DataArray
            float64, dims ``("patch", "bound")`` with ``bound`` labelled
            ``left, bottom, right, top``.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.zeros((4, 6)), dims=("y", "x"),
        ...                   coords={"y": [35.0, 25.0, 15.0, 5.0], "x": 5.0 + 10 * np.arange(6)})
        >>> da.patch(y=2, x=3).bounds().values[:2].tolist()
        [[0.0, 20.0, 30.0, 40.0], [30.0, 20.0, 60.0, 40.0]]
        """
        values = patch_bounds(self._obj, self.dims, self.size, self._anchor_array())
        return xr.DataArray(
            values,
            dims=(PATCH_DIM, "bound"),
            coords={"bound": ["left", "bottom", "right", "top"]},
            name="bounds",
        )

    def transforms(self) -> xr.DataArray:
        """Affine transform of every patch, in rasterio's ``Affine(a, b, c, d, e, f)`` order.

        The parent's transform translated by the patch's anchor, as rioxarray's
        ``isel_window`` computes it: ``rasterio.Affine(*p.transforms()[i].values)``
        is ``p[i].rio.transform()``.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.zeros((4, 6)), dims=("y", "x"),
        ...                   coords={"y": [35.0, 25.0, 15.0, 5.0], "x": 5.0 + 10 * np.arange(6)})
        >>> da.patch(y=2, x=3).transforms().values[3].tolist()
        [10.0, 0.0, 30.0, 0.0, -10.0, 20.0]
        """
        values = patch_transforms(self._obj, self.dims, self._anchor_array())
        if values is None:
            raise GeometryError(
                "transforms need a raster: y and x dims with regularly spaced numeric "
                "coordinates, or a grid mapping with a GeoTransform (da.rio.write_transform())."
            )
        return xr.DataArray(
            values,
            dims=(PATCH_DIM, "affine"),
            coords={"affine": list("abcdef")},
            name="transforms",
        )

    def weights(self) -> xr.DataArray:
        """Return the blending window over the patched dims (float64, strictly positive).

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.zeros(8), dims="t")
        >>> da.patch(t=4, window="hann").weights().round(3).values.tolist()
        [0.146, 0.854, 0.854, 0.146]
        """
        return xr.DataArray(self._window.values.copy(), dims=self.dims, name="weights")

    # -- patches ----------------------------------------------------------------------

    def _extract(self, var: xr.Variable, anchors: np.ndarray, pad_value: Any) -> Any:
        """Stack the patches of one variable: ``(n, *var.shape)`` with patch extents."""
        present = [d for d in self.dims if d in var.dims]
        columns = [self.dims.index(d) for d in present]
        axes = [var.dims.index(d) for d in present]
        size = [self.size[d] for d in present]
        pad_value = check_pad_value(pad_value, var.dtype)
        if isinstance(var.data, da.Array):
            groups = self._patch_groups() if anchors is self._anchor_array() else None
            return extract_dask(var.data, axes, anchors[:, columns], size, pad_value, groups)
        return extract_numpy(np.asarray(var.data), axes, anchors[:, columns], size, pad_value)

    def _cut(self, anchors: np.ndarray, stacked: bool) -> T:
        """Patches at ``anchors`` as one object (``stacked``) or the first one alone."""
        obj = self._obj
        dims = set(self.dims)
        data_vars = _patched_variables(obj, self.dims)
        variables: dict[Hashable, xr.Variable] = {}
        for name, var in data_vars.items():
            data = self._extract(var, anchors, self._pad_value)
            variables[name] = (
                xr.Variable((PATCH_DIM, *var.dims), data, var.attrs)
                if stacked
                else xr.Variable(var.dims, data[0], var.attrs)
            )
        coords: dict[Hashable, Any] = {}
        for name, coord in obj.coords.items():
            if not dims & set(coord.dims):
                coords[name] = coord.variable
            elif name in dims and stacked:
                column = anchors[:, self.dims.index(name)]
                coords[f"{name}_start"] = (PATCH_DIM, coord.values[column], coord.attrs)
            elif name in dims:
                start = int(anchors[0, self.dims.index(name)])
                labels = _extended_labels(coord.values, start, self.size[name])
                coords[name] = xr.Variable(name, labels, coord.attrs)
            else:
                data = self._extract(coord.variable, anchors, None)
                coords[name] = (
                    xr.Variable((PATCH_DIM, *coord.dims), data, coord.attrs)
                    if stacked
                    else xr.Variable(coord.dims, data[0], coord.attrs)
                )
        transforms = None
        if grid_mapping_name(obj) is not None:
            try:
                transforms = patch_transforms(obj, self.dims, anchors)
            except GeometryError:  # irregular labels: no single transform to carry
                transforms = None
        if stacked:
            for j, d in enumerate(self.dims):
                coords[f"{d}_anchor"] = (PATCH_DIM, anchors[:, j].copy())
            if transforms is not None:
                coords["geotransform"] = (PATCH_DIM, [to_gdal(t) for t in transforms])
        if isinstance(obj, xr.DataArray):
            (data,) = variables.values()
            result = xr.DataArray(data, coords=coords, name=obj.name, attrs=obj.attrs)
        else:
            for name, var in obj.data_vars.items():
                variables.setdefault(name, var.variable)
            ordered = {name: variables[name] for name in obj.data_vars}
            result = xr.Dataset(ordered, coords=coords, attrs=obj.attrs)
        if not stacked and transforms is not None:
            # One patch: its grid mapping says where it is, as rioxarray's isel_window does.
            result = with_transform(result, tuple(transforms[0].tolist()))
        return result

    def __getitem__(self, index: int) -> T:
        """Patch ``index`` (negative counts from the end), with its own coordinates."""
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"patch index {index!r} must be an int; for several patches use "
                "p.patches().isel(patch=...)."
            ) from None
        anchors = self._anchor_array()
        if not -len(anchors) <= position < len(anchors):
            raise IndexError(f"patch index {position} is out of range for {len(anchors)} patches.")
        return self._cut(anchors[position : position + 1 or None], stacked=False)

    def patch_at(self, anchor: Sequence[int] | Mapping[Hashable, int]) -> T:
        """Return the patch that starts at ``anchor``, with its own coordinate labels.

        Parameters
        ----------
        anchor
            Start index per patched dim: a sequence in the order of :attr:`dims`
            or a ``{dim: int}`` mapping. It need not be one of :meth:`anchors`.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.arange(10), dims="x", coords={"x": np.arange(10) * 10})
        >>> da.patch(x=3).patch_at({"x": 4}).x.values.tolist()
        [40, 50, 60]
        """
        if not isinstance(anchor, Mapping):
            anchor = [anchor]
        anchors = anchor_array(anchor, self._geometry, "anchor")
        if len(anchors) != 1:
            raise GeometryError(f"anchor={anchor!r} must be one start per patched dimension.")
        return self._cut(anchors, stacked=False)

    def patches(self) -> T:
        """All patches stacked along a leading ``"patch"`` dim.

        Coordinates along ``"patch"``: ``{dim}_anchor`` (start index) and
        ``{dim}_start`` (coordinate label of the first cell) per patched dim.
        Non-index coordinates that span patched dims are patched alongside.

        For dask input the result is lazy and the patches are ordered chunk by
        chunk: grouped by the input chunk that holds their anchor (chunks in C
        order), in the sampler's order within a chunk. Each group is one task that
        reads only the chunks its patches touch, and one chunk along ``"patch"``.
        Numpy input and explicit anchors (:class:`~xpatch.Anchors`,
        :class:`~xpatch.AtLabels`) keep the sampler's order. :meth:`anchors`
        always gives the order.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.zeros((3, 8, 8)), dims=("band", "y", "x"))
        >>> da.patch(y=4, x=4).patches().sizes
        Frozen({'patch': 4, 'band': 3, 'y': 4, 'x': 4})
        """
        return self._cut(self._anchor_array(), stacked=True)

    # -- reconstruction ---------------------------------------------------------------

    def _check_prediction(self, pred: xr.DataArray, label: str) -> np.ndarray | None:
        n = len(self)
        if PATCH_DIM not in pred.dims:
            raise PredictionError(
                f"{label} has dims {pred.dims}; it needs a {PATCH_DIM!r} dim with one entry per "
                "patch, in the order of p.anchors()."
            )
        if pred.sizes[PATCH_DIM] != n:
            raise PredictionError(
                f"{label} has {pred.sizes[PATCH_DIM]} patches along {PATCH_DIM!r}; this patcher "
                f"has {n}. Predict on p.patches() (or on every p[i]) and keep all of them."
            )
        missing = [d for d in self.dims if d not in pred.dims]
        if missing:
            raise DimensionError(
                f"{label} lacks the patched dimension(s) {missing!r}; its dims are "
                f"{pred.dims}. Keep the patched dims {list(self.dims)!r} (rename them back "
                "if the model renamed them)."
            )
        got = {d: pred.sizes[d] for d in self.dims}
        if got != self.size:
            raise PredictionError(
                f"{label} has patch shape {got}; this patcher's patches are {self.size}. "
                "Predictions must keep the patch size (crop or resize them back)."
            )
        return self._prediction_order(pred, label)

    def _prediction_order(self, pred: xr.DataArray, label: str) -> np.ndarray | None:
        """Permutation that puts predictions carrying ``{dim}_anchor`` coords in anchor order.

        None when they carry no anchors or are already in order. Predictions gathered
        out of order (from a shuffled pipeline) are matched back by anchor.
        """
        anchor_coords = [f"{d}_anchor" for d in self.dims]
        if not all(c in pred.coords for c in anchor_coords):
            return None
        given = np.stack([np.asarray(pred[c].values) for c in anchor_coords], axis=1)
        mine = self._anchor_array()
        if np.array_equal(given, mine):
            return None
        mine_order = np.lexsort(mine.T[::-1])
        given_order = np.lexsort(given.T[::-1])
        if (given[given_order] != mine[mine_order]).any():
            i = _first_surplus(given, mine)
            raise PredictionError(
                f"{label} patch {i} carries anchor {given[i].tolist()}, which is not an anchor "
                "of this patcher (or appears more often than in it): the predictions come from "
                "another patcher. Predict on this patcher's p.patches()."
            )
        order = np.empty_like(mine_order)
        order[mine_order] = given_order
        return order

    def _grid_chunks(self, template: xr.Variable | None, lead: Sequence[int], dtype) -> list:
        if template is not None and is_dask_backed(template):
            return [template.chunks[template.dims.index(d)] for d in self.dims]
        shape = (*lead, *self._geometry.shape)
        chunks = da.core.normalize_chunks(
            (-1,) * len(lead) + ("auto",) * len(self.dims), shape, dtype=dtype
        )
        return list(chunks[len(lead) :])

    def _reconstruct_variable(
        self, pred: xr.DataArray, template: xr.Variable | None, reduce: Reduction
    ) -> xr.Variable:
        lead = [d for d in pred.dims if d != PATCH_DIM and d not in self.dims]
        if nodata_of(pred) is not None:
            # Nodata cells are missing, as NaN is: they must not enter the average.
            pred = pred.where(valid_cells(pred.variable))
        data = pred.transpose(PATCH_DIM, *lead, *self.dims).data
        anchors = self._anchor_array()
        if isinstance(data, da.Array):
            lead_shape = [pred.sizes[d] for d in lead]
            chunks = self._grid_chunks(template, lead_shape, accumulation_dtype(data.dtype))
            out = overlap_add_dask(
                data, anchors, self._geometry.shape, chunks, self._window, reduce
            )
        else:
            out = overlap_add(np.asarray(data), anchors, self._geometry.shape, self._window, reduce)
        result = xr.Variable((*lead, *self.dims), out)
        if template is not None and set(result.dims) == set(template.dims):
            result = result.transpose(*template.dims)
        return result

    def _output_coords(self, pred: xr.DataArray | xr.Dataset, sizes: Mapping) -> dict:
        """Coordinates of the result: the prediction's (off the patch axes), then the input's."""
        dims = set(self.dims)
        coords: dict[Hashable, xr.Variable] = {}
        # The input's grid mapping describes the output grid; a prediction's may be
        # one patch's (with that patch's transform).
        grid_mapping = grid_mapping_name(self._obj)
        for name, coord in pred.coords.items():
            if name == grid_mapping:
                continue
            if PATCH_DIM not in coord.dims and not dims & set(coord.dims):
                coords[name] = coord.variable
        for name, coord in self._obj.coords.items():
            fits = all(sizes.get(d) == self._obj.sizes[d] for d in coord.dims)
            if name not in coords and fits:
                coords[name] = coord.variable
        return coords

    def reconstruct(self, pred: T, reduce: Reduction = "mean") -> T:
        """Put per-patch results back on the original grid by weighted overlap-add.

        Parameters
        ----------
        pred
            Per-patch results with a ``"patch"`` dim (in the order of
            :meth:`anchors`) and every patched dim at patch size. Other dims are
            free: ``"class"`` scores instead of ``"band"`` values are fine. A
            Dataset (for a Dataset patcher) reconstructs each variable that has a
            ``"patch"`` dim and keeps the others.
        reduce
            ``"mean"`` (default): Σ w·x / Σ w with the patcher's window.
            ``"sum"``: Σ w·x. ``"max"`` / ``"min"``: over the covering patches,
            unweighted.

        Returns
        -------
        DataArray or Dataset
            On the input's grid, with its coordinates and attributes. Float32 for
            half/single precision input, float64 otherwise (accumulated in that
            dtype). NaN predictions are skipped; cells that no valid prediction
            covers are NaN. Lazy (dask) if ``pred`` is.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.arange(6.0), dims="x")
        >>> p = da.patch(x=4, stride=2, window="hann")
        >>> p.reconstruct(p.patches() * 2).values.tolist()
        [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        >>> p.reconstruct(p.patches(), reduce="max").values.tolist()
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        """
        reduce = check_reduction(reduce)
        obj = self._obj
        if isinstance(pred, xr.DataArray):
            order = self._check_prediction(pred, "pred")
            if order is not None:
                pred = pred.isel({PATCH_DIM: order})
            template = obj.variable if isinstance(obj, xr.DataArray) else None
            if isinstance(obj, xr.Dataset) and pred.name in obj.data_vars:
                template = obj[pred.name].variable
            variable = _mask_input_nodata(
                self._reconstruct_variable(pred, template, reduce), template
            )
            coords = self._output_coords(pred, dict(zip(variable.dims, variable.shape)))
            attrs = obj.attrs if isinstance(obj, xr.DataArray) else dict(pred.attrs)
            variable = _fill_nodata(variable, attrs)
            out = xr.DataArray(variable, coords=coords, name=pred.name, attrs=attrs)
            _carry_encoded_nodata(obj.variable if isinstance(obj, xr.DataArray) else template, out)
            return out
        if isinstance(pred, xr.Dataset):
            if not isinstance(obj, xr.Dataset):
                raise PredictionError(
                    "pred is a Dataset but this patcher cuts a DataArray; pass a DataArray "
                    "(or patch a Dataset)."
                )
            patched = [name for name, v in pred.data_vars.items() if PATCH_DIM in v.dims]
            if not patched:
                raise PredictionError(
                    f"pred has no data variable with a {PATCH_DIM!r} dim; its variables are "
                    f"{list(pred.data_vars)!r}."
                )
            for name in patched:
                order = self._check_prediction(pred[name], f"pred[{name!r}]")
                if order is not None:
                    pred = pred.isel({PATCH_DIM: order})
            variables = {}
            for name, var in pred.data_vars.items():
                if name not in patched:
                    variables[name] = var.variable
                    continue
                template = obj[name].variable if name in obj.data_vars else None
                result = _mask_input_nodata(
                    self._reconstruct_variable(var, template, reduce), template
                )
                attrs = dict(obj[name].attrs if name in obj.data_vars else var.attrs)
                variables[name] = _fill_nodata(result, attrs)
                variables[name].attrs = attrs
                _carry_encoded_nodata(template, variables[name])
            sizes = {d: n for v in variables.values() for d, n in zip(v.dims, v.shape)}
            coords = self._output_coords(pred, sizes)
            return xr.Dataset(variables, coords=coords, attrs=obj.attrs)
        raise PredictionError(
            f"pred is a {type(pred).__name__}; pass an xarray.DataArray with a {PATCH_DIM!r} dim "
            "and the patched dims, e.g. p.patches() or xr.DataArray(arr, dims=...)."
        )

    # -- sliding-window inference ----------------------------------------------------

    def apply(
        self,
        fn: BatchFunction,
        batch_size: int = 64,
        *,
        output_dims: Mapping[Hashable, int] | None = None,
        dtype: DTypeLike | None = None,
        reduce: Reduction = "mean",
        nodata: float | Literal["input"] | None = "input",
    ) -> xr.DataArray:
        """Run ``fn`` over every patch in batches and blend the results onto the grid.

        Sliding-window inference: patches are cut group by group (one group per
        input chunk), ``fn`` sees numpy batches, and the per-patch results are put
        back with :meth:`reconstruct`'s weighted overlap-add. Every patch goes
        through ``fn`` exactly once per computation.

        Parameters
        ----------
        fn
            ``fn(batch) -> batch``. It receives numpy arrays ``(b, *carried,
            *patch)``: the input's non-patched dims in its order, then the patched
            dims in the order of :attr:`dims`, with ``b <= batch_size``. It returns
            ``(b, *output_dims, *patch)``. With ``boundary="pad"`` the padded cells
            hold ``pad_value``.
        batch_size
            Largest number of patches per call of ``fn``.
        output_dims
            The non-patched dims of ``fn``'s output and their sizes, in order, e.g.
            ``{"class": 5}``. Default: the input's non-patched dims (``fn`` keeps
            them). Declared, not discovered: nothing is computed to find them.
        dtype
            dtype of ``fn``'s output; default the input's dtype. Results are cast
            to it within their kind; an output of another kind raises.
        reduce
            How overlapping results combine, as in :meth:`reconstruct`.
        nodata
            The output's nodata value (``_FillValue``): ``"input"`` (default) the
            input's, a number, or None for none (NaN cells stay NaN). Cells where
            the input has no data in any band (its nodata value or NaN), and cells
            no valid prediction reached, take it. A prediction equal to it would be
            read as missing: choose one the model cannot output (``np.nan`` is
            always safe for the float output).

        Returns
        -------
        xarray.DataArray
            ``(*output_dims, *patched dims)`` on the input's grid (in the input's
            dim order when the output keeps its dims), with its coordinates (CRS
            and transform included) and attributes, less those that say how
            stored values are read (``scale_factor``, ``add_offset``, ...: see
            :data:`VALUE_ENCODING_ATTRS`), and with ``nodata`` as ``_FillValue``.
            Lazy for dask input, computed for numpy input.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.arange(24.0).reshape(2, 3, 4), dims=("band", "y", "x"))
        >>> p = da.patch(y=2, x=2, stride=1, window="hann")
        >>> bool(np.allclose(p.apply(lambda batch: batch * 10, batch_size=4), da * 10))
        True
        >>> scores = p.apply(lambda b: b.sum(axis=1, keepdims=True), output_dims={"score": 1})
        >>> scores.dims, scores.isel(score=0).values[0].tolist()
        (('score', 'y', 'x'), [12.0, 14.0, 16.0, 18.0])
        """
        obj = self._obj
        if not isinstance(obj, xr.DataArray):
            raise OptionError(
                "apply runs a function over the patches of one DataArray; this patcher cuts a "
                "Dataset. Patch ds.to_dataarray('variable') or one of its variables instead."
            )
        if not callable(fn):
            raise OptionError(f"fn={fn!r} is not callable; pass fn(batch) -> batch.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise OptionError(f"batch_size={batch_size!r} must be a positive int, e.g. 32.")
        reduce = check_reduction(reduce)
        carried = [d for d in obj.dims if d not in self.dims]
        if output_dims is None:
            output_dims = {d: obj.sizes[d] for d in carried}
        if not isinstance(output_dims, Mapping) or any(
            isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1
            for n in output_dims.values()
        ):
            raise OptionError(
                f"output_dims={output_dims!r} must map the output's non-patched dim names to "
                "positive sizes, in order, e.g. {'class': 5}."
            )
        clash = [d for d in output_dims if d in self.dims or d == PATCH_DIM]
        if clash:
            raise DimensionError(
                f"output_dims names {clash!r}, which are patched dims (or 'patch'); list only "
                "the non-patched dims of fn's output."
            )
        try:
            dtype = obj.dtype if dtype is None else np.dtype(dtype)
        except TypeError:
            raise OptionError(
                f"dtype={dtype!r} is not a numpy dtype; pass e.g. 'float32' or np.float32."
            ) from None
        encoded = None
        if isinstance(nodata, str):
            if nodata != "input":
                raise OptionError(
                    f"nodata={nodata!r} must be 'input' (the input's nodata value), a number, "
                    "or None."
                )
            nodata = nodata_of(obj)
            # A masked input (NaN cells) keeps its nodata in the encoding: so does the output.
            encoded = encoded_nodata_of(obj) if nodata is None else None
        elif isinstance(nodata, bool) or (
            nodata is not None and not isinstance(nodata, int | float | np.number)
        ):
            raise OptionError(
                f"nodata={nodata!r} must be 'input' (the input's nodata value), a number, or None."
            )
        data = obj.transpose(*carried, *self.dims).data
        lead_shape = [int(n) for n in output_dims.values()]
        common = dict(
            anchors=self._anchor_array(),
            groups=self._patch_groups(),
            size=self._geometry.size,
            pad_value=check_pad_value(self._pad_value, obj.dtype),
            fn=fn,
            batch_size=batch_size,
            lead_shape=lead_shape,
            dtype=dtype,
            window=self._window,
            reduce=reduce,
        )
        if isinstance(data, da.Array):
            chunks = self._grid_chunks(obj.variable, lead_shape, accumulation_dtype(dtype))
            out = apply_dask(data, grid_chunks=chunks, **common)
        else:
            out = apply_numpy(np.asarray(data), **common)
        result = xr.Variable((*output_dims, *self.dims), out)
        if set(result.dims) == set(obj.dims):
            result = result.transpose(*obj.dims)
        coords = self._output_coords(xr.Dataset(), dict(zip(result.dims, result.shape)))
        # fn's output is a new quantity: the input's packing attributes (scale_factor,
        # add_offset, ...) would misread it. Its nodata carries over, as a float.
        attrs = {k: v for k, v in obj.attrs.items() if k not in VALUE_ENCODING_ATTRS}
        out = xr.DataArray(_mask_input_nodata(result, obj.variable), coords=coords,
                           name=obj.name, attrs=attrs)  # fmt: skip
        if encoded is not None and fits_dtype(encoded, out.dtype):
            out.encoding["_FillValue"] = encoded
        if nodata is None:
            return out
        if not fits_dtype(nodata, out.dtype):
            return out  # the input's nodata cannot be stored in the output: NaN it is
        out.attrs["_FillValue"] = nodata
        return out.copy(data=_fill_nodata(out.variable, out.attrs).data)

    # -- training pipelines -----------------------------------------------------------

    def to_grain(
        self,
        *,
        variables: Sequence[Hashable] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        transform: bool = False,
    ) -> PatchSource:
        """Serve the patches as a Grain ``RandomAccessDataSource`` (or PyTorch dataset).

        Item ``i`` is a dict of numpy arrays: ``"data"`` (or one entry per Dataset
        variable), ``"weights"``, ``"anchor"`` and ``"index"`` (and the patch's
        ``"transform"`` with ``transform=True``). Dask input is read chunk by chunk
        through a cache of ``cache_bytes`` per process; building the source computes
        nothing. See :class:`xpatch.grain.PatchSource`.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> scene = xr.DataArray(np.zeros((3, 64, 64), "float32"), dims=("band", "y", "x"))
        >>> src = scene.chunk(x=32, y=32).patch(y=32, x=32, stride=16).to_grain()
        >>> len(src), src[0]["data"].shape, src[0]["anchor"].tolist()
        (9, (3, 32, 32), [0, 0])
        """
        from xpatch.grain import PatchSource

        return PatchSource(self, variables=variables, cache_bytes=cache_bytes, transform=transform)

    @staticmethod
    def _locator(obj: xr.DataArray | xr.Dataset):
        def locate(dim: Hashable, labels: np.ndarray, method: str | None) -> np.ndarray:
            if dim not in obj.indexes:
                raise DimensionError(
                    f"AtLabels: dimension {dim!r} has no coordinate to look labels up in; "
                    "give start indices with xpatch.Anchors instead."
                )
            positions = obj.indexes[dim].get_indexer(labels, method=method)
            if (positions < 0).any():
                missing = labels[positions < 0][:5].tolist()
                raise GeometryError(
                    f"AtLabels: label(s) {missing} not found along {dim!r}; pass labels of the "
                    "coordinate, or method='nearest' to snap to the closest one."
                )
            return positions

        return locate


#: The functional form of ``obj.patch(...)``: ``xpatch.patch(obj, size, stride, ...)``.
patch = Patcher
