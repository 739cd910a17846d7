"""Predictions back on the grid: their checks, their order, and the result's coordinates.

:func:`reconstruct` is ``Patcher.reconstruct``: it checks the predictions
against the patcher, matches them to the anchors (by their ``{dim}_anchor``
coordinates when they carry them), puts each variable back along the patched
dims it has (:func:`~xpatch.core.blend.overlap_add.overlap_add` in memory,
:func:`~xpatch.core.blend.partials.overlap_add_dask` on the plan for dask), then
applies the nodata rules of :mod:`xpatch.xarray.encoding`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from xpatch.core.blend.overlap_add import overlap_add
from xpatch.core.blend.partials import overlap_add_dask
from xpatch.core.blend.reductions import (
    ARGMAX,
    ReduceOption,
    Reduction,
    as_reduction,
    label_dtype,
)
from xpatch.core.blend.weighted import check_weights
from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import DimensionError, PredictionError
from xpatch.core.scale import ScaleSpec
from xpatch.core.windows import BlendWindow, marginal_window
from xpatch.xarray.encoding import (
    VALUE_ENCODING_ATTRS,
    mask_input_nodata,
    missing_as_nan,
    reconstructed,
)
from xpatch.xarray.fn_outputs import output_halo
from xpatch.xarray.georef import grid_mapping_name
from xpatch.xarray.layout import Layout
from xpatch.xarray.output_grids import (
    OutputGrid,
    grid_coords,
    inferred_scale,
    output_grid,
    resampler,
)
from xpatch.xarray.provenance import layout_facts, note_result
from xpatch.xarray.variables import data_token, is_dask_backed
from xpatch.xarray.views import PATCH_DIM

if TYPE_CHECKING:
    import dask.array as da


def first_surplus(given: np.ndarray, expected: np.ndarray) -> int:
    """Index of the first row of ``given`` that ``expected`` lacks (or has fewer of).

    Examples
    --------
    >>> first_surplus(np.array([[1], [2], [2]]), np.array([[2], [1], [3]]))
    2
    """
    remaining: dict[tuple, int] = {}
    for row in map(tuple, expected.tolist()):
        remaining[row] = remaining.get(row, 0) + 1
    for i, row in enumerate(map(tuple, given.tolist())):
        remaining[row] = remaining.get(row, 0) - 1
        if remaining[row] < 0:
            return i
    return 0


def check_prediction(
    layout: Layout,
    pred: xr.DataArray,
    label: str,
    required: Sequence[Hashable],
    grid: OutputGrid | None = None,
) -> tuple[np.ndarray | None, list[da.Array] | None]:
    """Check ``pred`` against the patcher; return where its patches are.

    ``required`` are the patched dims it must have, at the patch size of the
    output ``grid`` (default: the patcher's). Returns what
    :func:`prediction_rows` does.
    """
    n = len(layout)
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
    missing = [d for d in required if d not in pred.dims]
    if missing:
        raise DimensionError(
            f"{label} lacks the patched dimension(s) {missing!r}; its dims are "
            f"{pred.dims}. Keep the patched dims {list(required)!r} (rename them back "
            "if the model renamed them)."
        )
    got = {d: pred.sizes[d] for d in layout.dims if d in pred.dims}
    size = layout.size if grid is None else grid.size
    expected = {d: size[d] for d in got}
    if got != expected:
        at = "" if grid is None or grid.identity else f" at scale={grid.scale}"
        raise PredictionError(
            f"{label} has patch shape {got}; this patcher's patches{at} are {expected}. "
            "Predictions at another resolution are read as such when their patches are "
            "n or 1/n times the patcher's; pass scale={dim: factor} for other factors, "
            "or crop or pad cropped predictions back to the patch shape."
        )
    return prediction_rows(layout, pred, label)


def prediction_rows(
    layout: Layout, pred: xr.DataArray, label: str
) -> tuple[np.ndarray | None, list[da.Array] | None]:
    """Row of ``pred`` holding each patch, from its ``{dim}_anchor`` coords.

    Returns ``(rows, lazy_anchors)``. ``rows`` is None when the predictions carry
    no anchors or are already in order; predictions gathered out of order (from
    a shuffled pipeline) are matched back by anchor. Dask predictions whose
    anchor coordinates are lazy too (``pred.chunk(...)`` chunks them) are taken
    in order and their anchors checked by the reconstruction's own tasks
    (``lazy_anchors``): reading them here would compute.
    """
    anchor_coords = [f"{d}_anchor" for d in layout.dims]
    if not all(c in pred.coords for c in anchor_coords):
        return None, None
    if is_dask_array(pred.data) and any(is_dask_backed(pred[c].variable) for c in anchor_coords):
        import dask.array as da

        return None, [da.asarray(pred[c].data) for c in anchor_coords]
    given = np.stack([np.asarray(pred[c].values) for c in anchor_coords], axis=1)
    mine = layout.plan.anchors
    if np.array_equal(given, mine):
        return None, None
    mine_order = np.lexsort(mine.T[::-1])
    given_order = np.lexsort(given.T[::-1])
    if (given[given_order] != mine[mine_order]).any():
        i = first_surplus(given, mine)
        raise PredictionError(
            f"{label} patch {i} carries anchor {given[i].tolist()}, which is not an anchor "
            "of this patcher (or appears more often than in it): the predictions come from "
            "another patcher. Predict on this patcher's p.patches()."
        )
    rows = np.empty_like(mine_order)
    rows[mine_order] = given_order
    return rows, None


def prediction_weights(pred: xr.DataArray, weights: Any, label: str) -> xr.DataArray:
    """``weights`` as a DataArray over some of ``pred``'s dims (each of its size, or 1).

    A numpy or dask array is per patch if it is ``(n_patches,)``, else it must
    have ``pred``'s dims in ``pred``'s order (size 1 where the weights repeat).
    """
    n = pred.sizes[PATCH_DIM]
    if not isinstance(weights, xr.DataArray):
        array = weights if is_dask_array(weights) else np.asarray(weights)
        if array.shape == (n,):
            dims: tuple[Hashable, ...] = (PATCH_DIM,)
        elif array.ndim == pred.ndim:
            dims = pred.dims
        else:
            raise PredictionError(
                f"weights has shape {array.shape}; {label} has dims {pred.dims} and shape "
                f"{pred.shape}. Pass per-patch weights of shape ({n},), per-cell weights of "
                f"{label}'s shape (size 1 where they repeat), or a DataArray naming its dims, "
                f"e.g. dims=({PATCH_DIM!r}, 'y', 'x') to weigh every band alike."
            )
        weights = xr.DataArray(array, dims=dims)
    extra = [d for d in weights.dims if d not in pred.dims]
    wrong = {d: weights.sizes[d] for d in weights.dims if d in pred.dims}
    wrong = {d: n_w for d, n_w in wrong.items() if n_w not in (1, pred.sizes[d])}
    if extra or wrong:
        raise PredictionError(
            f"weights has dims {dict(weights.sizes)}, which do not fit {label}'s "
            f"{dict(pred.sizes)}: weights may only have {label}'s dims, each of its size or 1 "
            f"(to repeat). Offending: {extra or wrong}."
        )
    return weights


def weights_data(weights: xr.DataArray, order: Sequence[Hashable]) -> Any:
    """Return the weights' array with the dims of ``order``, size 1 where they lack one."""
    weights = weights.transpose(*[d for d in order if d in weights.dims])
    data = weights.data
    for j, d in enumerate(order):
        if d not in weights.dims:
            data = data[(slice(None),) * j + (None,)]
    return data


def reconstruct_variable(
    layout: Layout,
    grid: OutputGrid,
    pred: xr.DataArray,
    where: tuple[np.ndarray | None, list[da.Array] | None],
    template: xr.Variable | None,
    reduce: Reduction,
    weights: xr.DataArray | None = None,
) -> xr.Variable:
    """Overlap-add one prediction variable along the patched dims it has, on ``grid``.

    ``where`` is :func:`check_prediction`'s answer; ``weights`` are
    :func:`prediction_weights`', taken row for row with ``pred``.
    """
    rows, lazy_anchors = where
    present = [d for d in layout.dims if d in pred.dims]
    columns = [layout.dims.index(d) for d in present]
    lead = [d for d in pred.dims if d != PATCH_DIM and d not in layout.dims]
    data = missing_as_nan(pred).transpose(PATCH_DIM, *lead, *present).data
    wdata = None if weights is None else weights_data(weights, (PATCH_DIM, *lead, *present))
    if is_dask_array(wdata) and not is_dask_array(data):
        # Lazy weights make the reconstruction lazy: chunk pred as the weights are.
        import dask.array as da

        data = da.from_array(data, chunks=(wdata.chunks[0], *(-1,) * (data.ndim - 1)))
    plan = grid.plan if len(columns) == len(layout.dims) else grid.plan.project(columns)
    window = grid.window
    if len(columns) < len(layout.dims):
        window = BlendWindow.of(marginal_window(window.values, columns))
    if is_dask_array(data):
        if lazy_anchors is not None and len(columns) < len(layout.dims):
            lazy_anchors = [lazy_anchors[j] for j in columns]
        # The predictions carry the input's anchors: checked against the input's plan.
        input_plan = (
            layout.plan if len(columns) == len(layout.dims) else layout.plan.project(columns)
        )
        out = overlap_add_dask(
            data,
            plan,
            window,
            reduce,
            rows=rows,
            carried_anchors=lazy_anchors,
            weights=wdata,
            carried_plan=None if grid.identity else input_plan,
        )
    else:
        # Row r holds patch inverse[r]: place the rows where they are, uncopied.
        anchors = plan.anchors if rows is None else plan.anchors[np.argsort(rows)]
        dtype = reduce.result_dtype(data.dtype, window, plan, wdata is not None)
        wdata = None if wdata is None else check_weights(wdata)
        out = overlap_add(
            np.asarray(data), anchors, plan.grid.shape, window, reduce, dtype=dtype, weights=wdata
        )
    result = xr.Variable((*lead, *present), out)
    if template is not None and set(result.dims) == set(template.dims):
        result = result.transpose(*template.dims)
    return result


def output_coords(
    layout: Layout, pred: xr.DataArray | xr.Dataset, sizes: Mapping, grid: OutputGrid | None = None
) -> dict:
    """Coordinates of the result: the prediction's (off the patch axes), then the input's.

    The input's are taken on the output ``grid`` (default: the input's own). A
    prediction's coordinate along a dim the result lacks (the class dim a label map
    of ``reduce="argmax"`` drops) is not the result's.
    """
    dims = set(layout.dims)
    coords: dict[Hashable, xr.Variable] = {}
    # The input's grid mapping describes the output grid; a prediction's may be
    # one patch's (with that patch's transform).
    grid_mapping = grid_mapping_name(layout.obj)
    for name, coord in pred.coords.items():
        if name == grid_mapping:
            continue
        if PATCH_DIM in coord.dims or dims & set(coord.dims):
            continue
        if set(coord.dims) <= set(sizes):
            coords[name] = coord.variable
    grid_coordinates = (
        {n: c.variable for n, c in layout.obj.coords.items()}
        if grid is None
        else grid_coords(layout, grid)
    )
    for name, coord in grid_coordinates.items():
        fits = all(sizes.get(d) == n for d, n in coord.sizes.items())
        if name not in coords and fits:
            coords[name] = coord
    return coords


def label_variable(
    layout: Layout,
    grid: OutputGrid,
    pred: xr.DataArray,
    scores: xr.Variable,
    template: xr.Variable | None,
    attrs: Mapping,
    label: str,
) -> xr.Variable:
    """``reduce="argmax"``: the index of the largest blended score along ``pred``'s class dim.

    The labels are in the smallest unsigned integer dtype that holds them and one
    value more, its largest, for the cells that have no label (its ``_FillValue``):
    uncovered, nodata in the input, or scores all NaN (NaN predictions, or weights
    all 0 there). Predictions may hold NaN anywhere, so the value is kept even
    where the patches cover every cell. Attributes that say how to read stored
    values (the input's nodata, which a class may take) are not the labels' and
    are dropped. The class dim and its coordinates are dropped too: a class
    coordinate (``cls = ["water", "land", "urban"]``) is kept as the CF attributes
    ``flag_values`` (0, 1, ...) and ``flag_meanings`` (the names, blanks as ``_``).
    """
    lead = [d for d in pred.dims if d != PATCH_DIM and d not in layout.dims]
    if len(lead) != 1:
        raise PredictionError(
            f"reduce='argmax' takes the index of the largest score along one class dim; "
            f"{label} has {len(lead)} dims besides {PATCH_DIM!r} and the patched dims: "
            f"{lead!r}. Give it one, e.g. dims=('patch', 'class', 'y', 'x')."
        )
    (dim,) = lead
    scores = mask_input_nodata(scores, template, resampler(grid))
    data = ARGMAX.finalize(scores.data, axis=scores.dims.index(dim))
    labels = xr.Variable([d for d in scores.dims if d != dim], data)
    dtype = label_dtype(pred.sizes[dim] + 1)
    no_label = int(np.iinfo(dtype).max)
    labels = labels.fillna(no_label).astype(dtype)
    labels.attrs = {k: v for k, v in attrs.items() if k not in VALUE_ENCODING_ATTRS}
    labels.attrs["_FillValue"] = no_label
    if dim in pred.coords:  # the class names, as CF spells what the values of a category mean
        names = [str(v).replace(" ", "_") for v in pred[dim].values.tolist()]
        labels.attrs["flag_values"] = np.arange(len(names), dtype=dtype)
        labels.attrs["flag_meanings"] = " ".join(names)
    return labels


def _scale_facts(grid: OutputGrid) -> dict:
    """Return the provenance of a scaled result's grid (nothing for the input's own grid)."""
    return {} if grid.identity else {"scale": grid.scale}


def _template(layout: Layout, name: Hashable) -> xr.Variable | None:
    obj = layout.obj
    if isinstance(obj, xr.DataArray):
        return obj.variable
    return obj[name].variable if name in obj.data_vars else None


def _required(layout: Layout, template: xr.Variable | None) -> list[Hashable]:
    if template is None:
        return list(layout.dims)
    return [d for d in layout.dims if d in template.dims]


def without_halo(layout: Layout, pred: Any, scale: ScaleSpec | None = None) -> Any:
    """Return ``pred`` cropped to the inner windows where its patches have the halo's size.

    Predictions of the patches ``p[i]`` and :meth:`~xpatch.Patcher.patches` give
    (grown by the halo; at ``scale``, by the halo times the scale) lose the halo
    on each side; predictions of the inner size (a model that crops) are
    returned as they are.
    """
    if not any(layout.halo) or not isinstance(pred, xr.DataArray | xr.Dataset):
        return pred
    size = layout.geometry.size
    halo = layout.halo
    if scale is not None:
        size = tuple(output_grid(layout, scale).plan.size)
        halo = output_halo(layout, size)
    crop = {}
    for dim, cells, inner in zip(layout.dims, halo, size):
        if cells and dim in pred.dims and pred.sizes[dim] == inner + 2 * cells:
            crop[dim] = slice(cells, cells + inner)
    return pred.isel(crop) if crop else pred


def reconstruct(
    layout: Layout,
    pred: Any,
    reduce: ReduceOption | Reduction = "mean",
    *,
    weights: Any = None,
    scale: ScaleSpec | None = None,
) -> Any:
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
        unweighted. ``"vote"``, for integer or bool class labels: per cell, the
        label whose covering patches carry the largest Σ w (ties to the smallest
        label); it keeps the labels' dtype (float64 with NaN where a cell is
        covered by no patch, as for ``"max"``), costs one pass over the
        predictions per distinct label and, lazily, ``O(labels x box)`` memory
        per group of patches. Float predictions are refused. ``"argmax"``, for
        class scores: blended as the ``"mean"``, then each cell takes the index
        of the largest score along the predictions' one dim besides ``"patch"``
        and the patched dims (e.g. ``"class"``), which the result drops: labels
        in the smallest unsigned integer dtype that holds them and one value
        more (uint8 up to 255 classes), its largest, the ``_FillValue`` of the
        cells that have none (uncovered, nodata in the input, scores all NaN or
        weighed 0). Ties go to the first index. The class dim's coordinates
        are dropped; a class coordinate's values are kept as the CF attributes
        ``flag_values`` (0, 1, ...) and ``flag_meanings`` (the names, blanks as
        ``_``).
    weights
        Weights from the model multiplied into the window, e.g. ``1 / variance``:
        per patch (a DataArray with dim ``"patch"``, or an array of shape
        ``(n_patches,)``) or per cell (a DataArray over some of ``pred``'s dims,
        or an array of ``pred``'s shape with size 1 where the weights repeat),
        taken row for row with ``pred``. Finite and >= 0 (else
        :class:`~xpatch.PredictionError`; lazy weights are checked by each task).
        For ``"mean"``, ``"sum"`` and ``"vote"`` only. A cell whose total weight
        is 0 is NaN (``"mean"`` and ``"sum"``); a weighted ``"mean"`` or
        ``"sum"`` is a float. Lazy if ``pred`` or ``weights`` is.
    scale
        Output cells per input cell of predictions at another resolution (as
        for :meth:`apply`: a factor, or ``{dim: factor}``). Default: read off
        the predictions' patch shape, e.g. patches of 64 cells from a patcher
        of 32 are at scale 2. The result covers the input's extent at that
        resolution, with coordinates, transform and window made for it.

    Returns
    -------
    DataArray or Dataset
        On the input's grid, with its coordinates and attributes. Accumulated
        in, and returned as, float32 for half/single precision predictions and
        float64 for other floats. Integer predictions stay exact when the
        patches cover every cell (read off the layout, never computed):
        ``"max"`` / ``"min"`` keep their dtype, ``"sum"`` with an integral
        window (``"boxcar"``) is int64 (uint64 for unsigned) and raises
        :class:`~xpatch.PredictionError` if it would wrap around; ``"mean"``,
        and any reduction of a layout with uncovered cells (NaN there), is
        float64, and refuses integers beyond 2**53 that ``"max"``, ``"min"``
        or ``"sum"`` would round. NaN predictions are skipped; cells that no
        valid prediction covers are NaN. Lazy (dask) if ``pred`` is.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> da = xr.DataArray(np.arange(6.0), dims="x")
    >>> p = da.patch(x=4, stride=2, window="hann")
    >>> p.reconstruct(p.patches() * 2).values.tolist()
    [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    >>> p.reconstruct(p.patches(), reduce="max").values.tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    >>> ids = xr.DataArray(np.array([2**60 + 1, 3, 2**60 + 5, 7, 9, 11]), dims="x")
    >>> q = ids.patch(x=4, stride=2)
    >>> q.reconstruct(q.patches(), reduce="max").values.tolist()[:3]
    [1152921504606846977, 3, 1152921504606846981]

    A vote of class labels, and a mean weighted per patch:

    >>> labels = xr.DataArray(np.array([0, 0, 1, 1, 2, 2], dtype="uint8"), dims="x")
    >>> v = labels.patch(x=4, stride=2)
    >>> v.reconstruct(v.patches(), reduce="vote").values.tolist()
    [0, 0, 1, 1, 2, 2]
    >>> from xpatch.xarray.reconstruct import reconstruct
    >>> pred = xr.ones_like(v.patches(), float) * xr.DataArray([1.0, 3.0], dims="patch")
    >>> reconstruct(v.layout, pred, weights=np.array([1.0, 3.0])).values.tolist()
    [1.0, 1.0, 2.5, 2.5, 3.0, 3.0]
    """
    reduction = as_reduction(reduce, argmax=True)
    argmax = reduction.reduces_lead  # a label map of scores blended as its blend (the mean)
    reduce = reduction.blend
    if weights is not None:
        reduction.check_weights_allowed()
    obj = layout.obj
    if scale is None and isinstance(pred, xr.DataArray | xr.Dataset):
        # Read off the shape before the halo goes: a grown patch at 2x is not 3x a window.
        scale = inferred_scale(layout, pred.sizes)
    pred = without_halo(layout, pred, scale)
    weights = without_halo(layout, weights, scale)  # per-cell weights of the grown patch too
    if isinstance(pred, xr.DataArray):
        grid = output_grid(layout, scale)
        template = _template(layout, pred.name)
        where = check_prediction(layout, pred, "pred", _required(layout, template), grid)
        w = None if weights is None else prediction_weights(pred, weights, "pred")
        result = reconstruct_variable(layout, grid, pred, where, template, reduce, w)
        attrs = obj.attrs if isinstance(obj, xr.DataArray) else dict(pred.attrs)
        if argmax:
            variable = label_variable(layout, grid, pred, result, template, attrs, "pred")
        else:
            variable = reconstructed(result, template, attrs, resampler(grid))
        coords = output_coords(layout, pred, dict(zip(variable.dims, variable.shape)), grid)
        out = xr.DataArray(variable, coords=coords, name=pred.name)
        out.encoding.update(variable.encoding)  # a DataArray does not take a Variable's
        note_result(
            out,
            lambda: {
                "predictions": data_token(pred.variable),
                **layout_facts(layout),
                "reduce": reduction.name,
                **_scale_facts(grid),
            },
        )
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
        # One output grid for every variable: a Dataset has one size per dim.
        grid = output_grid(layout, scale)
        variables = {}
        for name, var in pred.data_vars.items():
            if name not in patched:
                variables[name] = var.variable
                continue
            template = _template(layout, name)
            label = f"pred[{name!r}]"
            where = check_prediction(layout, var, label, _required(layout, template), grid)
            w = None if weights is None else prediction_weights(var, weights, label)
            result = reconstruct_variable(layout, grid, var, where, template, reduce, w)
            attrs = obj[name].attrs if name in obj.data_vars else var.attrs
            if argmax:
                variables[name] = label_variable(layout, grid, var, result, template, attrs, label)
            else:
                variables[name] = reconstructed(result, template, attrs, resampler(grid))
        sizes = {d: n for v in variables.values() for d, n in zip(v.dims, v.shape)}
        coords = output_coords(layout, pred, sizes, grid)
        out_ds = xr.Dataset(variables, coords=coords, attrs=obj.attrs)
        note_result(
            out_ds,
            lambda: {
                "predictions": {str(n): data_token(pred[n].variable) for n in patched},
                **layout_facts(layout),
                "reduce": reduction.name,
                **_scale_facts(grid),
            },
        )
        return out_ds
    raise PredictionError(
        f"pred is a {type(pred).__name__}; pass an xarray.DataArray with a {PATCH_DIM!r} dim "
        "and the patched dims, e.g. p.patches() or xr.DataArray(arr, dims=...)."
    )
