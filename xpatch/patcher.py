"""The patcher: the verbs of a patch layout over a DataArray or Dataset.

:class:`Patcher` is what ``da.patch(...)`` returns (``xpatch.patch(obj, ...)`` is
its functional spelling). Building one builds its state, a frozen
:class:`~xpatch.xarray.layout.Layout` (every argument validated, the anchors
placed and compiled, once, into the :class:`~xpatch.core.plan.Plan` that every
lazy path shares). The verbs hand that layout to the rooms below: the views
(:mod:`xpatch.xarray.views`), reconstruction (:mod:`xpatch.xarray.reconstruct`),
inference (:mod:`xpatch.xarray.apply`) and the Grain source (:mod:`xpatch.grain`).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Generic

import xarray as xr

from xpatch.core.apply import BatchFunction
from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES
from xpatch.core.errors import GeometryError
from xpatch.core.geometry import AxisBoundary, Geometry
from xpatch.core.padding import PadMode
from xpatch.core.plan import Plan
from xpatch.core.samplers import AtLabels, Sampler, anchor_array
from xpatch.core.scale import ScaleSpec
from xpatch.core.windows import BlendWindow, WindowSpec
from xpatch.grain.source import PatchSource
from xpatch.grid.guard import check_one_grid
from xpatch.xarray import apply as xarray_apply
from xpatch.xarray import reconstruct as xarray_reconstruct
from xpatch.xarray import seam, views
from xpatch.xarray.apply import (
    ApplyOptions,
    ApplyReduction,
    takes_apply_options,
)
from xpatch.xarray.georef import patch_bounds, patch_transforms
from xpatch.xarray.layout import Layout, LayoutOptions, T, size_mapping
from xpatch.xarray.samplers import ObjectSampler
from xpatch.xarray.variables import check_blendable_predictions

#: The defaults of the layout options, spelled once (:class:`~xpatch.xarray.layout.LayoutOptions`;
#: apply's are :data:`xpatch.xarray.apply.APPLY`).
DEFAULT = LayoutOptions()


class Patcher(Generic[T]):
    """An immutable layout of (overlapping) patches over a DataArray or Dataset.

    Parameters
    ----------
    obj
        The array (or Dataset, whose data variables are patched together) to cut.
        Numpy- or dask-backed; dask input stays lazy. A Dataset's variable that
        has only some of the patched dims is patched along those; one with none
        of them is carried whole.
    size
        Patch extent per patched dim, ``{dim: int}``. Dims not named are carried
        whole (bands, time, variables). Or give ``**size_kwargs``. The patched
        dims (:attr:`dims`, the columns of :meth:`anchors`) are in a DataArray's
        own order, and in a Dataset's in the order given here: a variable that
        joins the Dataset does not reorder them.
    stride
        Step between patch starts: one int for all patched dims, or ``{dim: int}``.
        Default: the size (no overlap).
    boundary
        ``"shift"`` (default): the last patch along a dim is moved back to end flush
        with the edge, every cell is covered. ``"pad"``: edge patches run past the
        edge and are padded as ``pad_mode`` says; padded cells carry no weight.
        ``"drop"``: incomplete patches are left out, with an
        :class:`~xpatch.UncoveredCellsWarning` that counts the uncovered cells.
        ``"raise"``: raise if the grid's stride does not end flush with the edge
        (with explicit or random anchors: if a patch leaves the array).
        ``"periodic"``: the dim wraps (a global grid's longitude): patches start at
        ``0, stride, ...`` below its extent, those past the end go on with its first
        cells, and their results land back there (through :meth:`apply`, such a
        patch goes through ``fn`` twice, once for each side of the seam). One mode
        for every dim, or ``{dim: mode}`` (dims left out take ``"shift"``).
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
        This reads the whole input once, when the patcher is built (a dask
        computation for dask input, with a progress bar if it takes more than a
        few seconds); the patcher keeps the result, pickled copies included, and
        nothing else it does computes anything.
    pad_value
        Fill of padded cells with ``boundary="pad"``; default NaN for float data
        and 0 for integer data (0 cast to other dtypes: give ``""`` for strings,
        ``np.datetime64("NaT")`` for datetimes). Only with ``pad_mode="constant"``.
    pad_mode
        How ``boundary="pad"`` fills the cells past the array's end, with
        :func:`numpy.pad`'s meanings relative to the whole array's edges (never a
        chunk's): ``"constant"`` (default) with ``pad_value``, ``"reflect"``
        (mirrored about the last cell), ``"symmetric"`` (mirrored, the last cell
        repeated), ``"edge"`` (the last cell repeated) or ``"wrap"`` (continued
        from the array's start). Every view, :meth:`apply` and the Grain source
        use it. A model that looks at neighbours (a convolution) spreads the
        default NaN fill of float data into valid cells near the edge: use
        ``"reflect"`` (or ``"edge"``) for those. With a ``halo`` it also fills
        the halo past both edges of the array. ``{dim: mode}`` pads each patched
        dim its own way (dims left out: ``"constant"``), one dim after another in
        the patched dims' order, e.g. ``{"lat": "reflect", "lon": "wrap"}`` for a
        global grid.
    halo
        Cells read on each side of every patch beyond its window, for a model
        that looks at neighbours or crops (a U-Net without padding): one int, or
        ``{dim: int}``. ``p[i]``, :meth:`patches`, the Grain source and ``fn`` in
        :meth:`apply` see patches grown by ``2 * halo`` cells (filled from the
        neighbouring chunks, and past the array's edges as ``pad_mode`` says);
        ``size``, ``stride``, ``boundary``, :meth:`anchors`, :meth:`bounds` and
        the blending are the inner window's. ``fn`` (and :meth:`reconstruct`'s
        predictions) may return either the grown shape (xpatch crops the halo)
        or the inner shape (a model that crops); only the inner window is
        blended. The anchor numbers are the inner windows'.
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

    Reflect padding past the edge, as :func:`numpy.pad` does:

    >>> line = xr.DataArray(np.arange(5.0), dims="x")
    >>> line.patch(x=4, boundary="pad", pad_mode="reflect")[1].values.tolist()
    [4.0, 3.0, 2.0, 1.0]
    """

    __slots__ = ("_layout",)

    def __init__(
        self,
        obj: T,
        size: Mapping[Hashable, int] | None = None,
        stride: int | Mapping[Hashable, int] | None = None,
        *,
        boundary: AxisBoundary | Mapping[Hashable, AxisBoundary] = DEFAULT.boundary,
        window: WindowSpec | Mapping[Hashable, WindowSpec] = DEFAULT.window,
        sampler: Sampler | AtLabels | ObjectSampler | None = DEFAULT.sampler,
        min_valid: float | None = DEFAULT.min_valid,
        pad_value: Any = DEFAULT.pad_value,
        pad_mode: PadMode | Mapping[Hashable, PadMode] = DEFAULT.pad_mode,
        halo: int | Mapping[Hashable, int] | None = DEFAULT.halo,
        **size_kwargs: int,
    ) -> None:
        check_one_grid(obj)
        options = LayoutOptions(boundary, window, sampler, min_valid, pad_value, pad_mode, halo)
        layout = Layout.build(obj, size_mapping(size, size_kwargs), stride, options)
        object.__setattr__(self, "_layout", layout)

    # -- immutability and pickling -------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"Patcher is immutable (cannot set {name!r}); build a new one with obj.patch(...)."
        )

    def __getstate__(self) -> dict:
        return {"_layout": self._layout}

    def __setstate__(self, state: dict) -> None:
        if "_layout" not in state:  # pickled before the layout had a class of its own
            state = {
                "_layout": Layout(
                    state["_obj"],
                    state["_geometry"],
                    state["_window_spec"],
                    state["_window"],
                    state["_sampler"],
                    state["_min_valid"],
                    state["_pad_value"],
                    state.get("_pad_mode", "constant"),
                    state["_plan"],
                )
            }
        object.__setattr__(self, "_layout", state["_layout"])

    def __repr__(self) -> str:
        return f"<xpatch.Patcher {self._layout!r}>"

    @classmethod
    def of(cls, layout: Layout[T]) -> Patcher[T]:
        """Return the Patcher of a built :class:`~xpatch.xarray.layout.Layout` (nothing re-checked).

        With :meth:`Layout.over <xpatch.xarray.layout.Layout.over>`: this layout's
        patches over another object or at other anchors, ``Patcher.of(p.layout.over(obj))``.
        """
        patcher = cls.__new__(cls)
        object.__setattr__(patcher, "_layout", layout)
        return patcher

    # -- layout ---------------------------------------------------------------------

    @property
    def layout(self) -> Layout[T]:
        """The frozen state these verbs read: object, geometry, window, sampler, plan."""
        return self._layout

    @property
    def obj(self) -> T:
        """The patched DataArray or Dataset."""
        return self._layout.obj

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims: in a DataArray's order, in a Dataset's as the size gave them."""
        return self._layout.dims

    @property
    def size(self) -> dict[Hashable, int]:
        """Patch extent per patched dim."""
        return self._layout.size

    @property
    def stride(self) -> dict[Hashable, int]:
        """Step between patch starts per patched dim."""
        return self._layout.stride

    @property
    def boundary(self) -> AxisBoundary | dict[Hashable, AxisBoundary]:
        """The boundary mode."""
        return self._layout.boundary

    @property
    def window(self) -> WindowSpec | Mapping[Hashable, WindowSpec]:
        """The window spec as given (see :meth:`weights` for its values)."""
        return self._layout.window

    @property
    def blend_window(self) -> BlendWindow:
        """The window's values (and 1-D factors), as overlap-add takes them."""
        return self._layout.blend_window

    @property
    def geometry(self) -> Geometry:
        """The core geometry (sizes, strides, boundary) in axis terms."""
        return self._layout.geometry

    @property
    def sampler(self) -> Sampler:
        """The sampler that placed the patches."""
        return self._layout.sampler

    @property
    def pad_value(self) -> Any:
        """The fill of padded cells as given (None: NaN for floats, 0 for integers)."""
        return self._layout.pad_value

    @property
    def pad_mode(self) -> PadMode:
        """How ``boundary="pad"`` fills the cells past the array's end (numpy.pad's modes)."""
        return self._layout.pad_mode

    @property
    def plan(self) -> Plan:
        """The compiled plan: anchors by chunk, groups, boxes and the chunk grid.

        Every lazy path reads it: one task per group (one group per input chunk
        for every sampler), output blocks on its grid.
        """
        return self._layout.plan

    def __len__(self) -> int:
        return len(self._layout)

    def anchors(self) -> xr.DataArray:
        """Start index of every patch along each patched dim.

        The patch order: for dask input, grid and random samplers give the
        patches chunk by chunk (grouped by the input chunk that holds their
        anchor, chunks in C order); explicit anchors (:class:`~xpatch.Anchors`,
        :class:`~xpatch.AtLabels`, :class:`~xpatch.AtPoints`) keep the order
        given, and numpy input keeps the sampler's order.

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
            self._layout.plan.anchors.copy(),
            dims=(views.PATCH_DIM, "dim"),
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
        values = patch_bounds(self._layout.obj, self.dims, self.size, self._layout.plan.anchors)
        return xr.DataArray(
            values,
            dims=(views.PATCH_DIM, "bound"),
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
        values = patch_transforms(self._layout.obj, self.dims, self._layout.plan.anchors)
        if values is None:
            raise GeometryError(
                "transforms need a raster: y and x dims with regularly spaced numeric "
                "coordinates, or a grid mapping with a GeoTransform (da.rio.write_transform())."
            )
        return xr.DataArray(
            values,
            dims=(views.PATCH_DIM, "affine"),
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
        return xr.DataArray(self._layout.blend_window.values.copy(), dims=self.dims, name="weights")

    # -- patches ----------------------------------------------------------------------

    def __getitem__(self, index: int) -> T:
        """Patch ``index`` (negative counts from the end), with its own coordinates."""
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"patch index {index!r} must be an int; for several patches use "
                "p.patches().isel(patch=...)."
            ) from None
        anchors = self._layout.plan.anchors
        if not -len(anchors) <= position < len(anchors):
            raise IndexError(f"patch index {position} is out of range for {len(anchors)} patches.")
        return views.cut(self._layout, anchors[position : position + 1 or None])

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
        anchors = anchor_array(anchor, self._layout.geometry, "anchor")
        if len(anchors) != 1:
            raise GeometryError(f"anchor={anchor!r} must be one start per patched dimension.")
        return views.cut(self._layout, anchors)

    def patches(self) -> T:
        """All patches stacked along a leading ``"patch"`` dim, in the order of :meth:`anchors`.

        Coordinates along ``"patch"``: ``{dim}_anchor`` (start index) and
        ``{dim}_start`` (coordinate label of the first cell) per patched dim.
        Non-index coordinates that span patched dims are patched alongside.

        For dask input the result is lazy: the patches anchored in one input
        chunk are cut by one task that reads only the chunks they touch (a
        bounded number of tasks per input chunk, whatever the sampler). With
        explicit anchors in an order other than the chunks', one more task per
        group hands them out in that order: a computation of the whole stack
        then holds every group until the last is handed out.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.zeros((3, 8, 8)), dims=("band", "y", "x"))
        >>> da.patch(y=4, x=4).patches().sizes
        Frozen({'patch': 4, 'band': 3, 'y': 4, 'x': 4})
        """
        return views.cut(self._layout, None)

    # -- reconstruction and inference --------------------------------------------------

    def reconstruct(  # noqa: D102 (doc below)
        self,
        pred: T,
        reduce: ApplyReduction = "mean",
        *,
        weights: Any = None,
        scale: ScaleSpec | None = None,
    ) -> T:
        check_blendable_predictions(pred, self._layout.obj, views.PATCH_DIM)
        return seam.reconstruct_across(self._layout, pred, reduce, weights=weights, scale=scale)

    @takes_apply_options
    def apply(  # noqa: D102 (doc below)
        self, fn: BatchFunction, options: ApplyOptions
    ) -> xr.DataArray | xr.Dataset:
        return seam.apply_across(self._layout, fn, options)

    reconstruct.__doc__ = xarray_reconstruct.reconstruct.__doc__
    apply.__doc__ = xarray_apply.apply.__doc__

    # -- training pipelines -----------------------------------------------------------

    def to_grain(
        self,
        *,
        variables: Sequence[Hashable] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        transform: bool = False,
        weights: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> PatchSource:
        """Serve the patches as a Grain ``RandomAccessDataSource`` (or PyTorch dataset).

        Item ``i`` is a dict of numpy arrays: ``"data"`` (or one entry per Dataset
        variable), ``"weights"`` (unless ``weights=False``), ``"anchor"`` and
        ``"index"`` (and the patch's ``"transform"`` with ``transform=True``).
        Dask input is read chunk by chunk
        through a cache of ``cache_bytes`` per process; building the source computes
        nothing. ``cache_dir`` keeps the decoded zarr chunks on local disk for later
        epochs. See :class:`xpatch.grain.PatchSource`.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> scene = xr.DataArray(np.zeros((3, 64, 64), "float32"), dims=("band", "y", "x"))
        >>> src = scene.chunk(x=32, y=32).patch(y=32, x=32, stride=16).to_grain()
        >>> len(src), src[0]["data"].shape, src[0]["anchor"].tolist()
        (9, (3, 32, 32), [0, 0])
        """
        return PatchSource(
            self,
            variables=variables,
            cache_bytes=cache_bytes,
            transform=transform,
            weights=weights,
            cache_dir=cache_dir,
        )


#: The functional form of ``obj.patch(...)``: ``xpatch.patch(obj, size, stride, ...)``.
patch = Patcher
