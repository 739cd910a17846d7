"""Sliding-window inference on a patcher: ``Patcher.apply``'s arguments and its result.

The numpy and dask work is :mod:`xpatch.core.apply`, on the patcher's plan; this
module checks the arguments before any work starts and dresses the result with
the input's coordinates and the nodata rules of :mod:`xpatch.xarray.encoding`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import xarray as xr
from dask.base import tokenize
from numpy.typing import ArrayLike, DTypeLike

from xpatch.core.apply import BatchFunction, InferenceSetup, Output, apply_dask, apply_numpy
from xpatch.core.apply.memory import task_memory
from xpatch.core.blend.dtypes import check_rounds_exactly, plan_most_covering
from xpatch.core.blend.reductions import (
    SUM,
    ReduceOption,
    Reduction,
    as_reduction,
    label_dtype,
)
from xpatch.core.blend.weighted import check_weights
from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import DimensionError, OptionError
from xpatch.core.extract import check_pad_value
from xpatch.core.scale import ScaleSpec
from xpatch.xarray.encoding import (
    NodataOption,
    applied,
    cast_stored,
    check_nodata_option,
    check_out_dtype,
    check_stored_nodata,
    class_dim,
    default_out_dtype,
    needs_nodata,
)
from xpatch.xarray.fn_outputs import declare_returns, output_halo
from xpatch.xarray.layout import Layout
from xpatch.xarray.output_grids import OutputGrid, output_grid, resampler
from xpatch.xarray.provenance import describe_callable, layout_facts, note_result
from xpatch.xarray.reconstruct import output_coords
from xpatch.xarray.variables import check_apply_dtype, data_token
from xpatch.xarray.views import PATCH_DIM

if TYPE_CHECKING:
    import dask.array as da

#: ``apply``'s ``output_dims``: ``{dim: size}``, or per output ``{name: {dim: size} | None}``.
OutputDims = Mapping[Hashable, int] | Mapping[str, Mapping[Hashable, int] | None]
#: ``apply``'s ``dtype`` and ``out_dtype``: a dtype, or per output ``{name: dtype | None}``.
OutputDTypes = DTypeLike | Mapping[str, DTypeLike | None]

#: ``apply``'s reductions: :meth:`reconstruct`'s, and ``"argmax"`` (a label map of scores).
ApplyReduction = ReduceOption | Reduction


@dataclass(frozen=True)
class ApplyOptions:
    """``apply``'s options besides ``fn``, with their defaults: spelled once.

    :meth:`xpatch.Patcher.apply` takes them as arguments (its docstring says what
    each means); :meth:`xpatch.ScenePatcher.apply` and
    :meth:`xpatch.TreePatcher.apply` take the same and pass them on.

    Examples
    --------
    >>> ApplyOptions().batch_size, ApplyOptions(reduce="max").as_keywords()["reduce"]
    (64, 'max')
    """

    batch_size: int = 64
    output_dims: OutputDims | None = None
    dtype: OutputDTypes | None = None
    reduce: ApplyReduction = "mean"
    nodata: NodataOption = "input"
    pad_batch: bool = False
    out_dtype: OutputDTypes | None = None
    scale: ScaleSpec | None = None
    weights: str | ArrayLike | None = None
    task_memory: int | str | None = None

    def as_keywords(self) -> dict[str, Any]:
        """Return the options as keyword arguments of :meth:`xpatch.Patcher.apply`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


APPLY = ApplyOptions()


def takes_apply_options(method: Callable) -> Callable:
    """Give ``method(self, fn, options: ApplyOptions)`` ``apply``'s public signature.

    The one place the arguments of :meth:`xpatch.Patcher.apply`,
    :meth:`xpatch.ScenePatcher.apply` and :meth:`xpatch.TreePatcher.apply` are
    spelled: each verb receives them as one :class:`ApplyOptions`.

    Examples
    --------
    >>> class Verb:
    ...     @takes_apply_options
    ...     def apply(self, fn, options):
    ...         return options.batch_size, options.reduce
    >>> Verb().apply(print, 8, reduce="max")
    (8, 'max')
    """

    def apply(
        self: Any,
        fn: BatchFunction,
        batch_size: int = APPLY.batch_size,
        *,
        output_dims: OutputDims | None = APPLY.output_dims,
        dtype: OutputDTypes | None = APPLY.dtype,
        reduce: ApplyReduction = APPLY.reduce,
        nodata: NodataOption = APPLY.nodata,
        pad_batch: bool = APPLY.pad_batch,
        out_dtype: OutputDTypes | None = APPLY.out_dtype,
        scale: ScaleSpec | None = APPLY.scale,
        weights: Any = APPLY.weights,
        task_memory: int | str | None = APPLY.task_memory,
    ) -> Any:
        options = ApplyOptions(
            batch_size,
            output_dims,
            dtype,
            reduce,
            nodata,
            pad_batch,
            out_dtype,
            scale,
            weights,
            task_memory,
        )
        return method(self, fn, options)

    # Not functools.wraps: its __wrapped__ would show the inner signature to help().
    apply.__name__, apply.__qualname__ = method.__name__, method.__qualname__
    apply.__doc__, apply.__module__ = method.__doc__, method.__module__
    own = getattr(method, "__annotations__", {})
    apply.__annotations__ = {
        **apply.__annotations__,
        **{key: own[key] for key in ("fn", "return") if key in own},
    }
    return apply


def check_output_dims(
    layout: Layout, output_dims: Mapping[Hashable, int] | None
) -> dict[Hashable, int]:
    """Return the output's non-patched dims and sizes (default: the input's)."""
    obj = layout.obj
    if output_dims is None:
        return {d: obj.sizes[d] for d in obj.dims if d not in layout.dims}
    if not isinstance(output_dims, Mapping) or any(
        isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1
        for n in output_dims.values()
    ):
        raise OptionError(
            f"output_dims={output_dims!r} must map the output's non-patched dim names to "
            "positive sizes, in order, e.g. {'class': 5}."
        )
    clash = [d for d in output_dims if d in layout.dims or d == PATCH_DIM]
    if clash:
        raise DimensionError(
            f"output_dims names {clash!r}, which are patched dims (or 'patch'); list only "
            "the non-patched dims of fn's output."
        )
    return dict(output_dims)


def apply(
    layout: Layout, fn: BatchFunction, options: ApplyOptions = ApplyOptions()
) -> xr.DataArray | xr.Dataset:
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
        dims in the order of :attr:`dims`, with ``b <= batch_size`` (``b ==
        batch_size`` with ``pad_batch=True``). It returns ``(b, *output_dims,
        *patch)``. The batch array may be reused for the next batch: copy it
        (``batch.copy()``) if ``fn`` keeps it; returning it, or a view of it, is
        safe. For numpy input ``fn`` runs on the calling thread, one batch at
        a time in patch order; for Dask input, in Dask's worker threads. With
        ``boundary="pad"`` the cells past the edge are filled as the
        patcher's ``pad_mode`` says, the same as in :meth:`patches`.

        **Padding and models that look at neighbours.** The default
        ``pad_mode="constant"`` fills float data with NaN, and a convolution
        spreads that NaN from the padded cells into the valid cells near the
        edge (a 3x3 filter turns the last valid row and column NaN). The
        default stays ``"constant"`` so that ``apply`` equals running ``fn`` on
        :meth:`patches` and :meth:`reconstruct`, and so that existing results do
        not change; for such models build the patcher with
        ``boundary="pad", pad_mode="reflect"`` (or ``"edge"``, or
        ``pad_mode="constant", pad_value=0``).
    batch_size
        Largest number of patches per call of ``fn``.
    output_dims
        The non-patched dims of ``fn``'s output and their sizes, in order, e.g.
        ``{"class": 5}`` (``{}`` for none). Left out (None), they are found the
        way :func:`dask.array.map_blocks` finds ``meta``: ``apply`` calls ``fn``
        once, while building, on a batch of zeros of one patch (``batch_size``
        with ``pad_batch``) in the input's dtype, and reads what comes back: the
        input's non-patched dims if ``fn`` keeps their sizes, none if it drops
        them; other sizes cannot be named from numbers alone and are refused
        with an :class:`~xpatch.OptionError` that says how to name them. No data
        is read or computed for it. Declaring ``output_dims`` and ``dtype``
        skips the call (for a ``fn`` with side effects, an expensive one, or
        one that runs only on a cluster's workers).

        **Several outputs.** A ``fn`` that returns a dict of arrays (e.g.
        ``{"seg": (b, 3, *patch), "unc": (b, *patch)}``) declares its keys by
        ``output_dims={"seg": {"class": 3}, "unc": {}}`` (a dict of dicts; None
        for the input's non-patched dims), or else by a dict ``dtype`` or
        ``out_dtype``. ``dtype`` and ``out_dtype`` may then be dicts keyed like
        it (a plain value applies to every output, a missing key takes the
        default). ``fn`` runs once per batch for all outputs, and each is
        blended as a single-output ``apply`` would blend it, with the same
        ``reduce``; the result is a Dataset with a variable per key. Keys are
        non-empty strings without ``'/'``; outputs that name the same dim give
        it the same size. A returned key that was not declared, a declared key
        missing, or a non-dict return raise a :class:`~xpatch.PredictionError`.
    dtype
        dtype of ``fn``'s output; default: the dtype ``fn`` returns for the
        batch of zeros (see ``output_dims``): a float model over integer
        imagery gives floats. Each batch ``fn`` returns is checked, then
        cast: it must be of the declared kind (bool, integer, float or complex;
        a bool or an integer of either signedness may be declared as any
        integer dtype), and its values must fit: integers
        in the dtype's range, floats finite there (NaN and inf that ``fn``
        returns pass; floats may round to a narrower float). Otherwise a
        :class:`~xpatch.PredictionError` names the batch's range, the dtype's
        and the fix; on dask input it is raised when the result is computed.
    reduce
        How overlapping results combine, as in :meth:`reconstruct`, which
        also gives the result's dtype: integers stay exact for ``"max"``,
        ``"min"`` and a ``"boxcar"`` ``"sum"`` when the patches cover every cell.
        ``"argmax"``: class scores blend as the ``"mean"``, then each cell
        stores the index of the largest score along the one non-patched output
        dim (e.g. ``output_dims={"class": 5}``), which the result drops: a
        label map in the smallest unsigned integer dtype that holds the labels
        (uint8 up to 256 classes). Ties go to the first index. A cell without a
        label (uncovered, nodata in the input, weights all 0) takes a value no
        class takes (the dtype then holds one more: 255 in uint8 up to 255
        classes), never the input's nodata.
    nodata
        The output's nodata value (``_FillValue``): ``"input"`` (default) the
        input's, for an output of the same dtype as the input (the same
        quantity; otherwise NaN marks missing cells, as the input's value could
        be a valid result: NDVI's 0 from imagery whose nodata is 0), a number,
        or None for none (NaN cells stay NaN). Cells where the input has no data
        in any band (its nodata value or NaN), and cells no valid prediction
        reached, take it. A result equal to it would be read as missing: such
        cells are counted when computed, with a
        :class:`~xpatch.NodataCollisionWarning`; choose a value the model cannot
        output (``np.nan`` is always safe for a float output).
    pad_batch
        If True, ``fn`` only ever sees batches of exactly ``batch_size``
        patches: the last batch of each group (one per input chunk) is filled
        up with copies of its last patch, and their results are discarded. A
        compiled function (``jax.jit``, ``torch.compile``) then compiles once
        per run instead of once per new batch size, at the cost of some wasted
        work on the filler patches. Values are those of ``pad_batch=False``.
    out_dtype
        dtype of the stored result, where ``dtype`` is that of ``fn``'s output:
        the blend is rounded to nearest (ties to even, ``numpy.rint``) for an
        integer ``out_dtype``, clipped to the dtype's range (finite floats stay
        finite), then cast. Default: a ``"mean"`` of integers (``dtype``, or the
        integers ``fn`` returns with ``dtype=None``) rounds back to that integer dtype, so
        uint16 in gives uint16 out, and a ``"max"``, ``"min"`` or ``"vote"``
        keeps it, when every cell gets a value or ``nodata`` gives one the
        dtype holds (else float64 with NaN, as before); ``"argmax"``'s label
        dtype; otherwise (``"sum"``, floats) the reduction's dtype. An integer
        ``out_dtype`` cannot hold NaN: cells without data (uncovered, or the
        input's nodata) take ``nodata``, and an :class:`~xpatch.OptionError`
        asks for one when it is None or does not fit; NaN that ``fn`` returns
        takes it too, or raises a :class:`~xpatch.PredictionError` (when
        computed, on dask). Lazy stays lazy: the cast is one task per block.
        Integer results are exact or refused: a ``"mean"`` of 64-bit integers
        with a window that is not integral (``"hann"``) stays float64 by
        default, and a ``"mean"`` or ``"sum"`` blended in float64 and stored
        as integers raises a :class:`~xpatch.PredictionError` (when computed)
        where it reaches ``2**52 / (2 * overlaps + 4)`` (3.8e14 for 4
        overlapping patches), past which float64 may round it to a neighbouring
        integer: subtract an offset first, or keep a float ``out_dtype``.
    scale
        Output cells per input cell, for a model whose patches come back at
        another resolution: one factor for every patched dim, or ``{dim:
        factor}`` (the others 1). E.g. ``2`` or ``4`` for super-resolution,
        ``Fraction(1, 4)`` (or ``0.25``) for a head that downsamples by 4.
        ``fn`` then returns patches of ``size * factor`` cells, and the result
        covers the input's extent at the new resolution: coordinates at the new
        cell centres (linear in the input's; regular grids stay exact), a
        raster's transform scaled and its CRS kept, the patcher's window built
        at the output's patch size, and an output cell without data only where
        no input cell under it has any. The patch size, the extent and every
        anchor times the factor must be whole numbers of cells; otherwise an
        :class:`~xpatch.OptionError` names them, before any work.
    weights
        Weights multiplied into the window (for ``"mean"``, ``"sum"``,
        ``"vote"`` and ``"argmax"``), e.g. inverse variance from the model.
        Either the name of an entry of the dict ``fn`` returns (not declared as
        an output): per patch ``(b,)`` or per cell ``(b, *patch)``, checked
        finite and >= 0 batch by batch, and weighing every declared output; or
        per-patch weights known beforehand, an array of shape ``(n_patches,)``
        in the order of :meth:`anchors`. A cell whose weights are all 0 has no
        value (NaN); a weighted mean is a float.
    task_memory
        Dask input: the memory one task may hold, in bytes or as a size such as
        ``"512MiB"`` (default: the dask config ``xpatch.task-memory``, else
        ``"192MiB"``). A task holds its group's input, the partial sums of its
        results and one batch of patches with ``fn``'s results; where the
        largest would pass the budget, the input's chunks are cut into smaller
        working blocks (the output's blocks, then), halving the longest side
        until it fits or blocks are a patch long. A write's peak memory is then
        about the threads times it, plus the imports: see "How much memory a
        write takes" in ``docs/scale.md``. Values do not depend on it.

    Returns
    -------
    xarray.DataArray or xarray.Dataset
        ``(*output_dims, *patched dims)`` on the input's grid (at ``scale``
        times its resolution) (in the input's
        dim order when the output keeps its dims), with its coordinates (CRS
        and transform included) and attributes, less those that say how
        stored values are read (``scale_factor``, ``add_offset``, ...: see
        :data:`xpatch.xarray.encoding.VALUE_ENCODING_ATTRS`), and with ``nodata`` as ``_FillValue``.
        Lazy for dask input, computed for numpy input. For several outputs, a
        Dataset of such variables, one per output.

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
    >>> labels = p.apply(lambda b: (b > 10).sum(axis=1, keepdims=True), output_dims={"n": 1},
    ...                  dtype="uint8", reduce="max")
    >>> labels.dtype, labels.isel(n=0).values[2].tolist()
    (dtype('uint8'), [1, 1, 1, 2])

    A label map from class scores, and a blend stored as rounded integers:

    >>> classes = p.apply(lambda b: np.stack([b[:, 0], 5 - b[:, 0]], axis=1),
    ...                   output_dims={"class": 2}, reduce="argmax")
    >>> classes.dims, classes.dtype, classes.values[0].tolist()
    (('y', 'x'), dtype('uint8'), [1, 1, 1, 0])
    >>> p.apply(lambda b: b / 4, out_dtype="int16").isel(band=0).values[0].tolist()
    [0, 0, 0, 1]

    Several outputs from one call of ``fn`` per batch, as a Dataset:

    >>> two = p.apply(lambda b: {"score": b[:, :1] * 2, "mean": b.mean(axis=1)},
    ...               output_dims={"score": {"s": 1}, "mean": {}}, dtype="float32")
    >>> sorted(two.data_vars), two["score"].dims, two["mean"].dtype
    (['mean', 'score'], ('s', 'y', 'x'), dtype('float32'))

    A 3-point mean filter over reflect-padded patches, in batches of exactly 2:

    >>> line = xr.DataArray(np.arange(7.0), dims="x")
    >>> p = line.patch(x=4, boundary="pad", pad_mode="reflect")
    >>> def smooth(b):
    ...     assert len(b) == 3  # 2 patches, and a copy of the last
    ...     return (np.roll(b, 1, -1) + b + np.roll(b, -1, -1)) / 3
    >>> bool(p.apply(smooth, batch_size=3, pad_batch=True).isnull().any())
    False
    """
    obj = layout.obj
    if not isinstance(obj, xr.DataArray):
        raise OptionError(
            "apply runs a function over the patches of one DataArray; this patcher cuts a "
            "Dataset. Patch ds.to_dataarray('variable') or one of its variables instead."
        )
    if not callable(fn):
        raise OptionError(f"fn={fn!r} is not callable; pass fn(batch) -> batch.")
    batch_size, pad_batch = options.batch_size, options.pad_batch
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise OptionError(f"batch_size={batch_size!r} must be a positive int, e.g. 32.")
    if not isinstance(pad_batch, bool | np.bool_):
        raise OptionError(
            f"pad_batch={pad_batch!r} must be True or False (True: fn always gets exactly "
            "batch_size patches)."
        )
    reduce = as_reduction(options.reduce, argmax=True)
    budget = task_memory(options.task_memory)
    nodata = check_nodata_option(options.nodata)
    grid = output_grid(layout, options.scale)
    out_dtype = options.out_dtype
    names = output_names(options.output_dims, options.dtype, out_dtype)
    if names is not None and options.output_dims is not None:
        check_output_layout(layout, options.output_dims, names)  # before fn is called
    out_patch = tuple(int(s) for s in grid.plan.size)
    output_dims, dtype, names = declare_returns(layout, fn, options, out_patch, names)
    for name in names or [None]:
        check_apply_dtype(obj, pick(dtype, name, names))
    patch_weights, weight_key = check_apply_weights(layout, options.weights, names, reduce)
    specs = {
        name: _output_spec(
            layout,
            pick(output_dims, name, names, dims=True),
            pick(dtype, name, names),
            pick(out_dtype, name, names),
            reduce,
            nodata,
            weighted=options.weights is not None,
            window=grid.window,
        )
        for name in (names or [None])
    }
    if names is not None:
        check_output_layout(layout, output_dims, names)
    carried = [d for d in obj.dims if d not in layout.dims]
    # With a halo, fn sees the patches of the grown layout (windows grown by it, read
    # past the edges as the pad modes say), and the inner windows blend onto the grid.
    reading = layout.reading
    data = obj.transpose(*carried, *layout.dims).data
    modes = reading.axis_pad_modes()
    outputs = {n: Output(tuple(int(s) for s in o.dims.values()), o.dtype) for n, o in specs.items()}
    inference = InferenceSetup(
        fn,
        batch_size,
        outputs,
        grid.window,
        reduce.blend,
        pad_value=check_pad_value(layout.pad_value, obj.dtype),
        pad_mode=modes[0] if len(set(modes)) == 1 else modes,
        pad_batch=bool(pad_batch),
        weight_key=weight_key,
        halo=output_halo(layout, out_patch) if reading is not layout else (),
    )
    lazy = is_dask_array(data)
    out_plan = None if grid.identity and reading is layout else grid.plan
    if lazy:
        inner = None if reading is layout else layout.plan  # the budget splits its grid
        arrays = apply_dask(data, reading.plan, inference, out_plan, patch_weights, budget, inner)
    else:
        arrays = apply_numpy(np.asarray(data), reading.plan, inference, out_plan, patch_weights)
    results = {}
    for name, (dims, declared, stored, own) in specs.items():
        given = pick(out_dtype, name, names)
        what = f"out_dtype={given!r}" if given is not None else f"out_dtype=None (kept {stored})"
        out = _labelled(layout, grid, arrays[name], dims, reduce, own, stored, what)

        def facts(name=name, dims=dims, declared=declared, out=out, own=own) -> dict:
            weighed = (
                {}
                if options.weights is None
                else {"weights": weight_key or tokenize(patch_weights)}
            )
            return {
                "input": data_token(obj.variable),
                "model (fn)": describe_callable(fn),
                **layout_facts(layout),
                **({} if name is None else {"output": name}),
                "output_dims": dims,
                "dtype": str(declared),
                "reduce": reduce.name,
                "nodata": own,
                "out_dtype": str(out.dtype),
                "pad_mode": layout.pad_mode,
                **({} if grid.identity else {"scale": grid.scale}),
                **weighed,
            }

        note_result(out, facts)
        results[name] = out
    if names is None:
        return results[None]
    return xr.Dataset(results)


def check_apply_weights(
    layout: Layout, weights: object, names: list[str] | None, reduce: Reduction
) -> tuple[np.ndarray | None, str | None]:
    """Return ``apply``'s ``weights=`` as ``(per-patch weights, name of fn's weights entry)``."""
    if weights is None:
        return None, None
    reduce.check_weights_allowed()
    if isinstance(weights, str):
        if names is None:
            raise OptionError(
                f"weights={weights!r} names an entry of the dict fn returns, but apply was "
                f"declared one output; return {{'pred': ..., {weights!r}: ...}} from fn and "
                "declare output_dims={'pred': None} (or dtype={'pred': ...})."
            )
        if weights in names:
            raise OptionError(
                f"weights={weights!r} is also declared as an output ({names!r}); weights are "
                f"not blended: leave {weights!r} out of output_dims, dtype and out_dtype."
            )
        return None, weights
    if isinstance(weights, xr.DataArray) and weights.dims == (PATCH_DIM,):
        weights = weights.data
    if is_dask_array(weights):
        raise OptionError(
            "weights= is a dask array; per-patch weights are one number per patch: pass them "
            "in memory (np.asarray(weights)), or return them from fn by name."
        )
    array = np.asarray(weights)
    if array.shape != (len(layout),):
        raise OptionError(
            f"weights has shape {array.shape}; per-patch weights are one value per patch, "
            f"shape ({len(layout)},), in the order of p.anchors(); or pass the name of an entry of "
            "the dict fn returns."
        )
    return check_weights(array), None


class OutputSpec(NamedTuple):
    """One output of ``fn``, checked: its dims, declared and stored dtypes, and nodata."""

    dims: dict[Hashable, int]
    dtype: np.dtype
    stored: np.dtype | None
    nodata: NodataOption


def _output_spec(
    layout: Layout,
    output_dims: Mapping[Hashable, int] | None,
    dtype: DTypeLike | None,
    out_dtype: DTypeLike | None,
    reduce: Reduction,
    nodata: NodataOption,
    weighted: bool = False,
    window: Any = None,
) -> OutputSpec:
    """One output's non-patched dims, declared and stored dtypes and nodata value, checked.

    ``nodata="input"`` gives the input's nodata value to an output of the same
    meaning: the same dtype as the input, not a label map. Another output's
    missing cells are NaN (a float then; an integer ``out_dtype`` asks for
    ``nodata=``), as the input's value could be a valid result of it (NDVI's 0 from
    imagery whose nodata is 0). A label map gets a value no class takes (its dtype
    holds one more value), where some cell may have no label.
    """
    obj = layout.obj
    output_dims = check_output_dims(layout, output_dims)
    try:
        dtype = obj.dtype if dtype is None else np.dtype(dtype)
    except TypeError:
        raise OptionError(
            f"dtype={dtype!r} is not a numpy dtype; pass e.g. 'float32' or np.float32."
        ) from None
    stored = check_out_dtype(out_dtype)
    if reduce.reduces_lead:  # a label map: its dtype holds the labels, and no-label
        n_classes = output_dims[class_dim(output_dims)]
        nodata = _label_nodata(layout, stored, out_dtype, n_classes, nodata, weighted)
        stored = stored or label_dtype(n_classes + (nodata is not None))
        check_stored_nodata(stored, layout.plan, obj, nodata, "the labels of reduce='argmax'")
        return OutputSpec(output_dims, dtype, stored, nodata)
    same = dtype == obj.dtype and (stored is None or stored == obj.dtype)
    if nodata == "input" and not same:  # another quantity: NaN marks its missing cells
        nodata = None
    if stored is None:
        stored = default_out_dtype(dtype, reduce, layout.plan, obj, nodata)
        if stored is not None and not rounds_back(reduce, dtype, window):
            stored = None  # the float64 blend: an int64 of it would look exact and be rounded
    else:
        check_stored_nodata(stored, layout.plan, obj, nodata, f"out_dtype={out_dtype!r}")
    return OutputSpec(output_dims, dtype, stored, nodata)


def _label_nodata(
    layout: Layout,
    stored: np.dtype | None,
    out_dtype: DTypeLike | None,
    n_classes: int,
    nodata: NodataOption,
    weighted: bool,
) -> NodataOption:
    """Return the no-label value of a label map: never the input's, never a class."""
    lacking = weighted or needs_nodata(layout.plan, layout.obj)  # zero weights: no label
    if stored is not None and (stored.kind not in "iu" or np.iinfo(stored).max < n_classes - 1):
        raise OptionError(
            f"out_dtype={out_dtype!r} cannot hold the labels 0..{n_classes - 1} of "
            f"reduce='argmax'; pass an integer dtype such as {str(label_dtype(n_classes))!r}"
            " (the default)."
        )
    if nodata == "input":  # the input's nodata is a value, which a class may take
        if not lacking:
            return None
        dtype = stored or label_dtype(n_classes + 1)
        if np.iinfo(dtype).max <= n_classes - 1:
            raise OptionError(
                f"out_dtype={out_dtype!r} holds the labels 0..{n_classes - 1} and no value "
                "besides for the cells that have no label (uncovered, nodata in the input, "
                f"or weights 0); pass a wider out_dtype ({str(label_dtype(n_classes + 1))!r}) "
                "or nodata= a value outside the classes."
            )
        return int(np.iinfo(dtype).max)
    if nodata is not None and float(nodata).is_integer() and 0 <= nodata < n_classes:
        raise OptionError(
            f"nodata={nodata!r} is one of the labels 0..{n_classes - 1} of reduce='argmax': "
            "cells of that class would read as missing. Leave nodata out (a value beyond "
            f"the classes is chosen), or pass one outside them, e.g. nodata={n_classes}."
        )
    return nodata


def _labelled(
    layout: Layout,
    grid: OutputGrid,
    out: np.ndarray | da.Array,
    output_dims: dict[Hashable, int],
    reduce: Reduction,
    nodata: NodataOption,
    stored: np.dtype | None,
    what: str = "out_dtype",
) -> xr.DataArray:
    """One output's blend as a DataArray on the input's grid, with its nodata and dtype.

    A float blend of a mean or sum stored as integers is refused, when computed,
    where float64 may have rounded it to another integer (:func:`check_rounds_exactly`,
    ``what`` names the stored dtype).
    """
    obj = layout.obj
    if stored is not None and stored.kind in "iu" and out.dtype.kind == "f" and reduce.sums:
        most = plan_most_covering(grid.plan)
        if is_dask_array(out):
            out = out.map_blocks(check_rounds_exactly, most, stored, what, dtype=out.dtype)
        else:
            out = check_rounds_exactly(out, most, stored, what)
    out = reduce.finalize(out, axis=0)  # a label map drops the class dim (first)
    lead = {} if reduce.reduces_lead else output_dims
    result = xr.Variable((*lead, *layout.dims), out)
    if set(result.dims) == set(obj.dims):
        result = result.transpose(*obj.dims)
    coords = output_coords(layout, xr.Dataset(), dict(zip(result.dims, result.shape)), grid)
    dressed = applied(result, obj, coords, nodata, resampler(grid))
    return dressed if stored is None else cast_stored(dressed, stored)


def rounds_back(reduce: Reduction, dtype: np.dtype, window: Any) -> bool:
    """Whether a blend of ``dtype`` integers is stored in their dtype by default.

    A mean rounds back to its integers (uint16 in, uint16 out), unless they are
    64-bit and the window is not integral (``"hann"``): such a weighted mean of
    large values (microsecond timestamps, ~1.7e15) is off by one or two after
    float64 and ``rint``, so it stays the float64 it is. With an integral window
    (``"boxcar"``) float64 adds them exactly up to 2**53 / overlaps; past what it
    rounds right, the int64 result is refused when computed.

    Examples
    --------
    >>> from xpatch.core.blend.reductions import MEAN
    >>> i8 = np.dtype("int64")
    >>> rounds_back(MEAN, i8, np.ones(4)), rounds_back(MEAN, i8, np.hanning(4))
    (True, False)
    >>> rounds_back(MEAN, np.dtype("uint16"), np.hanning(4))
    True
    """
    if not reduce.sums or np.dtype(dtype).itemsize < 8:
        return True
    return SUM.exact_integer_dtype(dtype, window) is not None


def output_names(output_dims: object, dtype: object, out_dtype: object) -> list[str] | None:
    """Return the names of ``fn``'s outputs when declared by dicts, else None (one output).

    ``output_dims`` declares several outputs when its values are mappings (or
    None), ``dtype`` and ``out_dtype`` when they are dicts. The first of them
    that does gives the names; the others may only use those names.

    Examples
    --------
    >>> output_names({"seg": {"class": 3}, "unc": {}}, "float32", None)
    ['seg', 'unc']
    >>> output_names({"class": 3}, None, None) is None
    True
    """
    declared = []
    if per_output(output_dims):
        declared.append(("output_dims", list(output_dims)))
    for what, value in (("dtype", dtype), ("out_dtype", out_dtype)):
        if isinstance(value, Mapping):
            declared.append((what, list(value)))
    if not declared:
        return None
    what, names = declared[0]
    if not names:
        raise OptionError(f"{what}={{}} declares no output; name fn's outputs, or pass a value.")
    bad = [n for n in names if not isinstance(n, str) or not n or "/" in n]
    if bad:
        raise OptionError(
            f"{what} names the outputs {bad!r}, which are not usable as variable names: use "
            "non-empty strings without '/', e.g. {'seg': {'class': 3}, 'unc': {}}."
        )
    for other, keys in declared[1:]:
        unknown = [k for k in keys if k not in names]
        if unknown:
            raise OptionError(
                f"{other} names the outputs {unknown!r}, which {what} does not declare "
                f"({names!r}); use the same keys, or add them to {what}."
            )
    return names


def per_output(output_dims: object) -> bool:
    """Tell whether ``output_dims`` is keyed by output names (its values are mappings)."""
    return (
        isinstance(output_dims, Mapping)
        and bool(output_dims)
        and all(v is None or isinstance(v, Mapping) for v in output_dims.values())
    )


def pick(value: object, name: str | None, names: list[str] | None, dims: bool = False) -> object:
    """Return the part of a dict option for output ``name`` (a plain value applies to all).

    ``dims``: ``value`` is ``output_dims``, a plain mapping unless keyed by outputs.
    """
    if names is None or not (per_output(value) if dims else isinstance(value, Mapping)):
        return value
    return value.get(name)


def check_output_layout(layout: Layout, output_dims: object, names: list[str]) -> None:
    """Refuse several outputs that cannot share one Dataset with the input's coordinates."""
    declared = {n: check_output_dims(layout, pick(output_dims, n, names, dims=True)) for n in names}
    taken = set(layout.obj.dims) | set(layout.obj.coords)
    taken |= {dim for dims in declared.values() for dim in dims}
    sizes: dict[Hashable, tuple[str, int]] = {}
    for name, dims in declared.items():
        if name in taken:
            raise OptionError(
                f"the output name {name!r} is also a dim or coordinate of the result; "
                "rename that output (e.g. to 'pred_' + name)."
            )
        for dim, n in dims.items():
            first, size = sizes.setdefault(dim, (name, n))
            if size != n:
                raise OptionError(
                    f"outputs {first!r} and {name!r} give the dim {dim!r} sizes {size} and {n}; "
                    "outputs share one Dataset, so name their dims apart (e.g. "
                    f"{{{name!r}: {{'{dim}_{name}': {n}}}}})."
                )
