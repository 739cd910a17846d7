"""Patches of a DataTree of co-registered resolutions: ``dt.patch(...)``.

A tree such as a Sentinel-2 product holds the same footprint at several
resolutions, one node per resolution (``/10m``, ``/20m``, ``/60m``). A
:class:`TreePatcher` lays the patches out once, in the cells of a reference
node (or in map units), and cuts the same ground from every node: a 600 m patch
is 60 cells at 10 m, 30 at 20 m and 10 at 60 m. Each node is patched by an
ordinary :class:`~xpatch.Patcher` (the reference's with the caller's sampler,
the others at the reference's anchors times the ratio of the cell sizes), so
views, reconstruction, inference and the Grain source work node by node.

``import xpatch.tree`` registers the ``.patch`` accessor on
:class:`xarray.DataTree`.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Hashable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np
import xarray as xr

from xpatch.core.apply import BatchFunction
from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES
from xpatch.core.errors import DimensionError, OptionError
from xpatch.core.geometry import Geometry
from xpatch.core.samplers import Anchors, JitteredGrid, RandomAnchors
from xpatch.core.scale import ScaleSpec
from xpatch.patcher import Patcher
from xpatch.tree.geometry import (
    check_one_crs,
    crs_layout,
    node_axis,
    node_factors,
    node_path,
    patched_nodes,
    scale_anchors,
    scale_layout,
    snapped_anchors,
)
from xpatch.tree.nodes import (
    node_functions,
    node_patcher,
    node_predictions,
    result_tree,
    stacked_bands,
)
from xpatch.tree.source import TreeSource
from xpatch.xarray.apply import (
    ApplyOptions,
    ApplyReduction,
    takes_apply_options,
)
from xpatch.xarray.layout import LayoutOptions, patched_dims, size_mapping
from xpatch.xarray.samplers import DrawnAnchors

#: Samplers whose anchors are drawn, not given: snapped to the coarsest node's grid.
DRAWN = (JitteredGrid, RandomAnchors, DrawnAnchors)

#: What sizes and strides count: the reference node's cells, or map (CRS) units.
Units = Literal["cells", "crs"]
UNITS: tuple[str, ...] = get_args(Units)


class TreePatcher:
    """The same patches cut from every node of a DataTree of co-registered resolutions.

    Each node that holds data variables along the patched dims is a grid of
    the same footprint at its own resolution. The layout is made at a
    reference node by an ordinary :class:`~xpatch.Patcher`; every other node
    gets a Patcher with the patch size, stride and anchors scaled by
    ``reference cell / node cell``, so patch ``i`` covers the same ground in
    every node. Building it reads coordinates only: nothing is computed, unless
    ``min_valid`` or a :class:`~xpatch.WeightedAnchors` sampler reads the
    reference node, as they do for a Patcher.

    Parameters
    ----------
    tree
        The DataTree. Nodes with no data variable along a patched dim (the root
        with only attributes, metadata nodes) are ignored: the results leave
        them out, and keep the root's attributes. A node with some patched dims
        but not all is refused.
    size
        Patch extent per patched dim, ``{dim: n}``, or as keyword arguments (``**options``): in the
        reference node's cells, or in map units with ``units="crs"``.
    stride
        Step between patch starts (one value or ``{dim: value}``), in the same
        units as ``size``. Default: the size.
    reference
        Path of the node whose cells ``size`` and ``stride`` count, and whose
        patcher places the patches (``sampler``, ``min_valid``). Default: the
        finest node, the one with the most cells along the patched dims (the
        first of them in tree order on a tie).
    units
        ``"cells"`` (default): sizes and strides in the reference's cells.
        ``"crs"``: in map units, e.g. ``y=1200, x=1200, stride=600`` metres;
        each must be a whole number of the reference's cells.
    **options
        :class:`~xpatch.Patcher`'s layout options (``boundary``, ``window``,
        ``sampler``, ``min_valid``, ``pad_value``, ``pad_mode``), the same at
        every node, and the patch size as keyword arguments (``y=60, x=60``).
        The sampler and ``min_valid`` act at the reference; the other nodes
        follow its anchors. ``window`` must be a name or ``{dim: name}`` (it is
        built at each node's patch size), not an array.

    Raises
    ------
    xpatch.GeometryError
        Footprints that differ between nodes, cell sizes not in a ratio of small
        whole numbers, or a size, stride or anchor that is not a whole number of
        cells at some node (with the numbers and a size that works).
    xpatch.OptionError, xpatch.DimensionError
        An unknown reference path, ``units``, or a dim no node has.

    Notes
    -----
    A node's cell size and footprint along a dim come from its regularly spaced
    numeric 1-D coordinate (labels at cell centres), or from its grid mapping's
    ``GeoTransform`` for a raster dim without one. When no node has a coordinate
    along a dim, the footprints are taken to be the same and the cell sizes
    are in the ratio of the extents.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch.tree
    >>> def grid(n, cell, names):  # n x n cells of `cell` metres over the same 240 m
    ...     centres = cell / 2 + cell * np.arange(n)
    ...     coords = {"y": 240 - centres, "x": centres}
    ...     data = {k: (("y", "x"), np.full((n, n), float(i))) for i, k in enumerate(names)}
    ...     return xr.Dataset(data, coords=coords)
    >>> tree = xr.DataTree.from_dict({"/10m": grid(24, 10, ["b2", "b3"]),
    ...                               "/20m": grid(12, 20, ["b5"]), "/60m": grid(4, 60, ["b1"])})
    >>> tp = tree.patch(y=12, x=12, stride=6)  # 120 m patches, in 10 m cells
    >>> len(tp), tp.reference, tp.nodes
    (9, '/10m', ('/10m', '/20m', '/60m'))
    >>> {path: p.size["y"] for path, p in tp.patchers.items()}
    {'/10m': 12, '/20m': 6, '/60m': 2}
    >>> dict(tp[4]["/60m"].sizes), tp.factors["/60m"]["x"]
    ({'y': 2, 'x': 2}, Fraction(1, 6))
    >>> back = tp.reconstruct(tp.patches())
    >>> bool(back["/20m"].to_dataset().equals(tree["/20m"].to_dataset()))
    True

    The same layout in metres:

    >>> tree.patch(y=120, x=120, stride=60, units="crs").anchors().equals(tp.anchors())
    True
    """

    __slots__ = ("_factors", "_patchers", "_reference", "_root_attrs", "_tree", "_units")

    def __init__(
        self,
        tree: xr.DataTree,
        size: Mapping[Hashable, Any] | None = None,
        stride: Any = None,
        *,
        reference: str | None = None,
        units: Units = "cells",
        **options: Any,
    ) -> None:
        if not isinstance(tree, xr.DataTree):
            raise OptionError(
                f"tree is a {type(tree).__name__}; TreePatcher patches an xarray.DataTree "
                "(for a DataArray or Dataset use obj.patch(...))."
            )
        if not isinstance(units, str) or units not in UNITS:
            raise OptionError(
                f"units={units!r} is not one of {UNITS}: 'cells' counts sizes and strides in "
                "the reference node's cells, 'crs' in map units (e.g. metres)."
            )
        layout_options, size_kwargs = LayoutOptions.split(options)
        size = size_mapping(size, size_kwargs)
        known = {d for node in tree.subtree for d in node.dims}
        unknown = [d for d in size if d not in known]
        if unknown:
            raise DimensionError(
                f"size names dimension(s) {unknown!r} that no node of the tree has; the "
                f"tree's dimensions are {sorted(map(str, known))!r}."
            )
        nodes = patched_nodes(tree, tuple(size))
        if not nodes:
            raise DimensionError(
                f"no node of the tree has a data variable along the patched dims "
                f"{list(size)!r}; patch the dims of the data variables of the resolution nodes."
            )
        check_one_crs(nodes)
        reference = self._pick_reference(tree, nodes, tuple(size), reference)
        _check_window(layout_options.window)
        ref_obj = nodes[reference]
        dims = patched_dims(ref_obj, size)  # the Patcher's own order
        axes = {path: {d: node_axis(ds, path, d) for d in dims} for path, ds in nodes.items()}
        factors = node_factors(axes, reference, dims)
        unit = dict.fromkeys(dims, 1.0)
        if units == "crs":
            size, stride = crs_layout(size, stride, axes[reference], reference)
            unit = {d: abs(axes[reference][d].step) for d in dims}
        # Sizes and strides are checked at every node before the reference's
        # sampler runs (min_valid and weighted samplers read data).
        shape = {d: ref_obj.sizes[d] for d in dims}
        geometry = Geometry.build(shape, size, stride, layout_options.boundary)
        sizes = scale_layout(dict(zip(dims, geometry.size)), factors, reference, "size", unit)
        strides = scale_layout(dict(zip(dims, geometry.stride)), factors, reference, "stride", unit)
        ref = Patcher(ref_obj, size, stride, **layout_options.as_keywords())
        if isinstance(ref.sampler, DRAWN):
            # Drawn anchors land anywhere: on the coarsest node's grid they are whole
            # cells at every node (a grid's or the caller's anchors are left as given).
            snapped = snapped_anchors(ref.plan.anchors, ref.dims, factors)
            ref = Patcher(
                ref_obj, size, stride, **ref.layout.options(sampler=Anchors(snapped)).as_keywords()
            )
        anchors = scale_anchors(ref.plan.anchors, ref.dims, factors, reference, ref.sampler)
        # A halo is ground, as a size is: scaled to each node's cells (whole, or refused).
        halo = dict(zip(ref.dims, ref.layout.halo))
        halos = scale_layout(halo, factors, reference, "halo", dict.fromkeys(dims, 1.0))
        self._patchers = {
            path: ref
            if path == reference
            else node_patcher(ref, ds, anchors[path], sizes[path], strides[path], halos[path])
            for path, ds in nodes.items()
        }
        self._factors = factors
        self._reference = reference
        self._units = units
        self._root_attrs = dict(tree.attrs)
        self._tree = tree

    @staticmethod
    def _pick_reference(
        tree: xr.DataTree,
        nodes: Mapping[str, xr.Dataset],
        dims: tuple[Hashable, ...],
        reference: str | None,
    ) -> str:
        if reference is None:
            cells = {path: int(np.prod([ds.sizes[d] for d in dims])) for path, ds in nodes.items()}
            return max(cells, key=cells.__getitem__)  # the first of the largest
        path = node_path(reference)
        if path in nodes:
            return path
        if path not in {node.path for node in tree.subtree}:
            raise OptionError(
                f"reference={reference!r} is not a node of the tree; the patched nodes are "
                f"{list(nodes)!r}."
            )
        raise DimensionError(
            f"reference={reference!r} has no data variable along the patched dims "
            f"{list(dims)!r}, so it has no cells to count sizes in; pick one of the patched "
            f"nodes {list(nodes)!r}."
        )

    def __repr__(self) -> str:
        ref = self._patchers[self._reference]
        size = ", ".join(f"{d}: {s}" for d, s in ref.size.items())
        stride = ", ".join(f"{d}: {s}" for d, s in ref.stride.items())
        return (
            f"<xpatch.TreePatcher ({len(self)} patches) nodes={list(self._patchers)} "
            f"reference={self._reference!r} size=({size}) stride=({stride}) cells "
            f"boundary={ref.boundary!r} window={ref.window!r} sampler={ref.sampler!r}>"
        )

    # -- layout ----------------------------------------------------------------------

    @property
    def tree(self) -> xr.DataTree:
        """The patched DataTree."""
        return self._tree

    @property
    def reference(self) -> str:
        """The path of the reference node, whose cells sizes and anchors count."""
        return self._reference

    @property
    def nodes(self) -> tuple[str, ...]:
        """The paths of the patched nodes, in tree order."""
        return tuple(self._patchers)

    @property
    def units(self) -> Units:
        """The units ``size`` and ``stride`` were given in (``"cells"`` or ``"crs"``)."""
        return self._units

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims, in the reference node's order."""
        return self._patchers[self._reference].dims

    @property
    def patchers(self) -> Mapping[str, Patcher]:
        """Each patched node's :class:`~xpatch.Patcher`, by path (read-only)."""
        return MappingProxyType(self._patchers)

    @property
    def factors(self) -> dict[str, dict[Hashable, Fraction]]:
        """``{path: {dim: reference cell / node cell}}``: 1/6 for 60 m against 10 m."""
        return {path: dict(f) for path, f in self._factors.items()}

    def __len__(self) -> int:
        return len(self._patchers[self._reference])

    def anchors(self) -> xr.DataArray:
        """Start of every patch in the reference node's cells (see :meth:`Patcher.anchors`).

        Node ``path``'s anchors are these times ``factors[path]``:
        ``tp.patchers[path].anchors()``.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.zeros((4, 6)))}),
        ...                               "/b": xr.Dataset({"v": (("y", "x"), np.zeros((2, 3)))})})
        >>> tree.patch(y=2, x=2).anchors().values.tolist()
        [[0, 0], [0, 2], [0, 4], [2, 0], [2, 2], [2, 4]]
        """
        return self._patchers[self._reference].anchors()

    def bounds(self) -> xr.DataTree:
        """Extent of every patch at every node, ``(left, bottom, right, top)`` in map units.

        Each node holds a ``"bounds"`` variable as :meth:`Patcher.bounds` gives it;
        the nodes cover the same ground, so they agree to float precision.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> def grid(n, cell):
        ...     centres = cell / 2 + cell * np.arange(n)
        ...     return xr.Dataset({"v": (("y", "x"), np.zeros((n, n)))},
        ...                       coords={"y": 60 - centres, "x": centres})
        >>> b = xr.DataTree.from_dict({"/10m": grid(6, 10), "/30m": grid(2, 30)}).patch(
        ...     y=3, x=3).bounds()
        >>> b["/30m"]["bounds"].values[1].tolist(), b["/10m"]["bounds"].values[1].tolist()
        ([30.0, 30.0, 60.0, 60.0], [30.0, 30.0, 60.0, 60.0])
        """
        return self._tree_of({path: p.bounds() for path, p in self._patchers.items()})

    # -- patches ------------------------------------------------------------------------

    def __getitem__(self, index: int) -> xr.DataTree:
        """Patch ``index`` of every node, as a DataTree with the patched nodes' paths.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.zeros((4, 6)))}),
        ...                               "/b": xr.Dataset({"w": (("y", "x"), np.zeros((2, 3)))})})
        >>> patch = tree.patch(y=2, x=2)[-1]
        >>> dict(patch["/a"].sizes), dict(patch["/b"].sizes)
        ({'y': 2, 'x': 2}, {'y': 1, 'x': 1})
        """
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"patch index {index!r} must be an int; for several patches use "
                "tp.patches() and .isel(patch=...)."
            ) from None
        n = len(self)
        if not -n <= position < n:
            raise IndexError(f"patch index {position} is out of range for {n} patches.")
        return self._tree_of({path: p[position] for path, p in self._patchers.items()})

    def patches(self) -> xr.DataTree:
        """All patches of every node, stacked along ``"patch"`` (see :meth:`Patcher.patches`).

        Lazy for dask-backed nodes. Row ``i`` of every node is the same ground.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.zeros((4, 6)))}),
        ...                               "/b": xr.Dataset({"w": (("y", "x"), np.zeros((2, 3)))})})
        >>> dict(tree.patch(y=2, x=2).patches()["/b"].sizes)
        {'patch': 6, 'y': 1, 'x': 1}
        """
        return self._tree_of({path: p.patches() for path, p in self._patchers.items()})

    # -- reconstruction and inference ----------------------------------------------------

    def reconstruct(
        self,
        predictions: Any,
        reduce: ApplyReduction = "mean",
        *,
        weights: Any = None,
        scale: ScaleSpec | None = None,
    ) -> xr.DataTree:
        """Blend per-node per-patch results back onto each node's grid.

        Parameters
        ----------
        predictions
            A DataTree with the patched nodes' paths (as :meth:`patches` gives;
            nodes without a ``"patch"`` dim are skipped) or a mapping ``{path:
            DataArray | Dataset}``, each with a ``"patch"`` dim in the order of
            :meth:`anchors` and the node's patch size. Nodes left out are left
            out of the result.
        reduce, weights, scale
            As for :meth:`Patcher.reconstruct`, the same at every node.

        Returns
        -------
        xarray.DataTree
            Each node's reconstruction (a DataArray's under its name, or
            ``"data"``), lazy for dask input.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.ones((4, 6)))}),
        ...                               "/b": xr.Dataset({"w": (("y", "x"), np.ones((2, 3)))})})
        >>> tp = tree.patch(y=2, x=2)
        >>> out = tp.reconstruct({"/b": tp.patches()["/b"]["w"] * 2})
        >>> list(out.children), out["/b"]["w"].values[0].tolist()
        (['b'], [2.0, 2.0, 2.0])
        """
        given = node_predictions(predictions, self.nodes)
        return self._tree_of(
            {
                path: self._patchers[path].reconstruct(pred, reduce, weights=weights, scale=scale)
                for path, pred in given.items()
            }
        )

    @takes_apply_options
    def apply(
        self, fn: BatchFunction | Mapping[str, BatchFunction], options: ApplyOptions
    ) -> xr.DataTree:
        """Run ``fn`` over every node's patches in batches and blend the results per node.

        At each node the data variables that have all the patched dims are
        stacked along a leading ``"variable"`` dim (in their common dtype), so
        ``fn`` gets numpy batches ``(b, variable, *other dims, *patch)`` at that
        node's patch size, and :meth:`Patcher.apply` blends what it returns. A
        nodata value is kept when the node's variables share it.

        Parameters
        ----------
        fn
            One callable for every node, or ``{path: callable}`` for some of
            them (the others are left out of the result).
        batch_size, output_dims, dtype, reduce, nodata, pad_batch, out_dtype, scale, weights
            As for :meth:`Patcher.apply`, the same at every node.

        Returns
        -------
        xarray.DataTree
            Per node: with the ``"variable"`` dim kept (the default
            ``output_dims``), one variable per input variable; a dict ``fn``'s
            outputs under their keys; another single output as ``"data"``. Lazy
            for dask input.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.ones((4, 6)))}),
        ...                               "/b": xr.Dataset({"w": (("y", "x"), np.ones((2, 3)))})})
        >>> out = tree.patch(y=2, x=2).apply(lambda batch: batch * 3)
        >>> out["/a"]["v"].values.max(), out["/b"]["w"].values[0].tolist()
        (np.float64(3.0), [3.0, 3.0, 3.0])
        """
        options = options.as_keywords()
        functions = node_functions(fn, self.nodes)
        # Every node is checked before the first runs: numpy nodes compute at once.
        patchers = {}
        for path in functions:
            p = self._patchers[path]
            patchers[path] = node_patcher(p, stacked_bands(p, path)[0], p.plan.anchors)
        return self._tree_of(
            {path: p.apply(functions[path], **options) for path, p in patchers.items()}
        )

    # -- training pipelines --------------------------------------------------------------

    def to_grain(
        self,
        *,
        variables: Mapping[str, Sequence[Hashable]] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        transform: bool = False,
        weights: bool = False,
        cache_dir: str | os.PathLike | None = None,
    ) -> TreeSource:
        """Serve patch ``i`` of every node as one item (a Grain data source, a torch dataset).

        Item ``i`` is ``{"anchor": ..., "index": i, "<path>": {var: array, ...}}``
        (see :class:`xpatch.tree.TreeSource`), from one
        :class:`~xpatch.grain.PatchSource` per node.

        Parameters
        ----------
        variables
            ``{path: [names]}``: the data variables to serve at some nodes
            (default: every variable with a patched dim).
        cache_bytes
            Chunk cache of each node's source, per process.
        transform, weights
            Add each node's patch transform, or its blending window (off by
            default), to its entry.
        cache_dir
            A local folder keeping the nodes' decoded zarr chunks for later epochs
            (each node under its own fingerprint); see :class:`~xpatch.grain.PatchSource`.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch.tree
        >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.ones((4, 6)))}),
        ...                               "/b": xr.Dataset({"w": (("y", "x"), np.ones((2, 3)))})})
        >>> item = tree.patch(y=2, x=2).to_grain()[5]
        >>> sorted(item), item["index"], item["/b"]["w"].shape
        (['/a', '/b', 'anchor', 'index'], np.int64(5), (1, 1))
        """
        given = {} if variables is None else dict(variables)
        picked = {node_path(key, "variables key"): (key, names) for key, names in given.items()}
        unknown = [key for path, (key, _) in picked.items() if path not in self._patchers]
        if unknown:
            raise OptionError(
                f"variables names the node(s) {unknown!r}, which are not patched; the patched "
                f"nodes are {list(self._patchers)!r}."
            )
        sources = {
            path: p.to_grain(
                variables=picked.get(path, (None, None))[1],
                cache_bytes=cache_bytes,
                transform=transform,
                weights=weights,
                cache_dir=cache_dir,
            )
            for path, p in self._patchers.items()
        }
        return TreeSource(sources, self._reference, self)

    # -- helpers ---------------------------------------------------------------------------

    def _tree_of(self, parts: Mapping[str, Any]) -> xr.DataTree:
        return result_tree(self._root_attrs, parts)


def _check_window(window: Any) -> None:
    specs = window.values() if isinstance(window, Mapping) else [window]
    if any(isinstance(s, np.ndarray) for s in specs):
        raise OptionError(
            "window= is an array, which fits the reference node's patch shape only; give a "
            "window name (e.g. window='hann') or {dim: name}, which is built at every node's "
            "patch size."
        )


@xr.register_datatree_accessor("patch")
class TreePatchAccessor:
    """``dt.patch(...)``: the same patches cut from every resolution node of a DataTree.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch.tree
    >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": (("y", "x"), np.zeros((8, 8)))}),
    ...                               "/b": xr.Dataset({"v": (("y", "x"), np.zeros((4, 4)))})})
    >>> tree.patch(y=4, x=4, stride=2)
    <xpatch.TreePatcher (9 patches) nodes=['/a', '/b'] reference='/a' size=(y: 4, x: 4) ...>
    """

    def __init__(self, tree: xr.DataTree) -> None:
        self._tree = tree

    def __call__(
        self,
        size: Mapping[Hashable, Any] | None = None,
        stride: Any = None,
        *,
        reference: str | None = None,
        units: Units = "cells",
        **options: Any,
    ) -> TreePatcher:
        """Build a :class:`TreePatcher`; see it for the parameters."""
        return TreePatcher(self._tree, size, stride, reference=reference, units=units, **options)
