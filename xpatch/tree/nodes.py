"""Per-node pieces of :class:`~xpatch.TreePatcher`: node patchers, inputs and results.

A tree's nodes are Datasets; :meth:`~xpatch.Patcher.apply` runs over one
DataArray. :func:`stacked_bands` stacks a node's data variables along a
``"variable"`` dim for it, and :func:`node_result` splits the result back. The
other helpers pick each node's part of the caller's arguments (a callable or a
mapping of them, predictions as a DataTree or a mapping) and assemble per-node
results into a DataTree with the input's node paths.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import OptionError
from xpatch.patcher import Patcher
from xpatch.tree.geometry import node_path
from xpatch.xarray.encoding import NODATA_ATTRS, encoded_nodata_of
from xpatch.xarray.variables import is_dask_backed
from xpatch.xarray.views import PATCH_DIM

#: The dim along which :func:`stacked_bands` stacks a node's data variables.
VARIABLE_DIM = "variable"
#: The name of a node's result that is one DataArray without ``VARIABLE_DIM``.
RESULT_NAME = "data"


def node_patcher(
    p: Patcher,
    obj: xr.DataArray | xr.Dataset,
    anchors: np.ndarray,
    size: Mapping[Hashable, int] | None = None,
    stride: Mapping[Hashable, int] | None = None,
    halo: Mapping[Hashable, int] | None = None,
) -> Patcher:
    """Return a Patcher over ``obj`` with ``p``'s options at explicit ``anchors``.

    ``anchors`` are ``(n, k)`` in the order of ``p.dims``; given per dim, so that
    ``obj``'s own dim order does not matter. Explicit anchors keep their order,
    so patch ``i`` is the same ground in every node. ``size``, ``stride`` and
    ``halo`` default to ``p``'s (a node at another resolution gives its own).
    """
    changes = {} if halo is None or not any(halo.values()) else {"halo": dict(halo)}
    return Patcher.of(p.layout.over(obj, anchors, size, stride, **changes))


def stacked_bands(p: Patcher, path: str) -> tuple[xr.DataArray, list[Hashable]]:
    """Return node ``path``'s data variables along all patched dims, stacked as one DataArray.

    The variables are stacked along :data:`VARIABLE_DIM` (first) in the
    node's order and their common dtype, one dask chunk along it. A nodata value
    is kept when every variable has the same one.

    Examples
    --------
    >>> ds = xr.Dataset({"b2": (("y", "x"), np.ones((4, 4))), "b3": (("y", "x"), np.zeros((4, 4)))})
    >>> stacked, names = stacked_bands(ds.patch(y=2, x=2), "/10m")
    >>> stacked.dims, names
    (('variable', 'y', 'x'), ['b2', 'b3'])
    """
    ds = p.obj
    names = [n for n, v in ds.data_vars.items() if set(p.dims) <= set(v.dims)]
    if not names:
        raise OptionError(
            f"node {path!r} has no data variable along all of the patched dims "
            f"{list(p.dims)!r}, so apply has nothing to run on there; leave it out with "
            "fn={path: callable, ...} for the other nodes."
        )
    if VARIABLE_DIM in ds.dims:
        raise OptionError(
            f"node {path!r} already has a dim {VARIABLE_DIM!r}, along which apply stacks the "
            f"node's variables; rename it first (.rename({{{VARIABLE_DIM!r}: 'band'}}))."
        )
    stacked = ds[names].to_dataarray(VARIABLE_DIM)
    if any(is_dask_backed(ds[n].variable) for n in names):
        stacked = stacked.chunk({VARIABLE_DIM: -1})
    # to_dataarray keeps the Dataset's attributes, not the variables': carry the
    # nodata attributes that every stacked variable shares, so apply masks them.
    for key in NODATA_ATTRS:
        values = {repr(ds[n].attrs.get(key)) for n in names}
        if len(values) == 1 and ds[names[0]].attrs.get(key) is not None:
            stacked.attrs[key] = ds[names[0]].attrs[key]
    encoded = {repr(encoded_nodata_of(ds[n])) for n in names}
    if len(encoded) == 1 and encoded_nodata_of(ds[names[0]]) is not None:
        stacked.encoding["_FillValue"] = encoded_nodata_of(ds[names[0]])
    return stacked, names


def node_result(result: xr.DataArray | xr.Dataset) -> xr.Dataset:
    """Return one node's ``apply`` result as a Dataset (split along :data:`VARIABLE_DIM`)."""
    if isinstance(result, xr.Dataset):
        return result
    if VARIABLE_DIM in result.dims:
        split = result.to_dataset(VARIABLE_DIM)
        for var in split.data_vars.values():  # to_dataset drops them: nodata, CRS, units
            var.attrs.update(result.attrs)
            var.encoding.update(result.encoding)
        return split
    return result.to_dataset(name=RESULT_NAME if result.name is None else result.name)


def node_functions(fn: Any, nodes: tuple[str, ...]) -> dict[str, Callable]:
    """Return ``{path: callable}``: one callable for every node, or a mapping of some."""
    if callable(fn):
        return dict.fromkeys(nodes, fn)
    if not isinstance(fn, Mapping) or not fn:
        raise OptionError(
            f"fn={fn!r} must be a callable, fn(batch) -> batch, applied at every node, or a "
            f"mapping of node paths to callables, e.g. {{{nodes[0]!r}: model}}."
        )
    chosen = {}
    for key, value in fn.items():
        path = node_path(key, "fn key")
        if path not in nodes:
            raise OptionError(
                f"fn names the node {key!r}, which is not patched; the patched nodes are "
                f"{list(nodes)!r}."
            )
        if not callable(value):
            raise OptionError(f"fn[{key!r}]={value!r} is not callable; pass fn(batch) -> batch.")
        chosen[path] = value
    return {path: chosen[path] for path in nodes if path in chosen}


def node_predictions(predictions: Any, nodes: tuple[str, ...]) -> dict[str, Any]:
    """Return ``{path: prediction}`` from a DataTree or a ``{path: DataArray | Dataset}``.

    A DataTree's nodes without a ``"patch"`` dim (the root, metadata) are skipped.
    """
    if isinstance(predictions, xr.DataTree):
        given = {
            node.path: node.to_dataset()
            for node in predictions.subtree
            if PATCH_DIM in node.to_dataset(inherit=False).dims
        }
    elif isinstance(predictions, Mapping):
        given = {}
        for key, value in predictions.items():
            if not isinstance(value, xr.DataArray | xr.Dataset):
                raise OptionError(
                    f"predictions[{key!r}] is a {type(value).__name__}; give each node's "
                    "per-patch results as a DataArray or Dataset with a 'patch' dim."
                )
            given[node_path(key, "predictions key")] = value
    else:
        raise OptionError(
            f"predictions is a {type(predictions).__name__}; give a DataTree with the patched "
            "nodes' paths (as tp.patches() returns) or a mapping {path: DataArray | Dataset}."
        )
    unknown = [path for path in given if path not in nodes]
    if unknown or not given:
        raise OptionError(
            f"predictions name the node(s) {unknown!r}, which are not patched (or none at all); "
            f"the patched nodes are {list(nodes)!r}."
        )
    return {path: given[path] for path in nodes if path in given}


def result_tree(root_attrs: Mapping, parts: Mapping[str, xr.DataArray | xr.Dataset]) -> xr.DataTree:
    """Assemble per-node results into a DataTree with the input's paths and root attributes.

    Each node carries the coordinates it inherited in the input itself: the root
    keeps only the input root's attributes.
    """
    nodes: dict[str, Any] = {"/": xr.Dataset(attrs=dict(root_attrs))}
    for path, part in parts.items():
        nodes[path] = node_result(part)
    return xr.DataTree.from_dict(nodes)
