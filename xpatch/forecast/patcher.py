"""Forecast samples of a labelled array: inputs and targets by time label, patches in space.

``obj.patch(time=xpatch.Forecast(...), lat=64, lon=64)`` builds a
:class:`ForecastPatcher`. Underneath it is an ordinary :class:`~xpatch.Patcher` whose
time window holds every label of a sample (from the earliest input to the last
target), anchored at each valid origin and combined with each spatial patch: its
reads, chunk cache and chunk-shuffled order serve forecast samples unchanged. A
sample is that window's patch, split into the labels of its inputs and its targets.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple

import numpy as np
import xarray as xr

from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import DimensionError, OptionError, PredictionError
from xpatch.core.samplers import Anchors
from xpatch.forecast.stencil import Forecast, OriginPlan, SkippedOrigins, plan_origins
from xpatch.grid.guard import check_one_grid
from xpatch.patcher import Patcher
from xpatch.xarray.apply import output_names, per_output
from xpatch.xarray.layout import size_mapping

#: Layout options that concern the spatial patches only.
_SPATIAL_OPTIONS = ("boundary", "sampler", "min_valid", "pad_value", "pad_mode", "halo")
#: Every option ``obj.patch(...)`` takes besides sizes.
_OPTIONS = (*_SPATIAL_OPTIONS, "window")


def forecast_dim(
    size: Mapping[Hashable, Any] | None, options: Mapping[str, Any]
) -> Hashable | None:
    """Return the dim given a :class:`Forecast` in ``size`` or ``options``, or None.

    Raises :class:`~xpatch.OptionError` when more than one dim is given one.

    Examples
    --------
    >>> forecast_dim(None, {"time": Forecast(inputs=["0h"], targets=["6h"]), "x": 4})
    'time'
    """
    given = {**(dict(size) if isinstance(size, Mapping) else {}), **options}
    dims = [d for d, v in given.items() if isinstance(v, Forecast)]
    if len(dims) > 1:
        raise OptionError(
            f"Forecast given for {dims!r}: one dim (time) takes a Forecast, the others sizes."
        )
    return dims[0] if dims else None


def forecast_layout(
    obj: xr.DataArray | xr.Dataset,
    size: Mapping[Hashable, Any] | None,
    stride: int | Mapping[Hashable, int] | None,
    options: Mapping[str, Any],
) -> ForecastPatcher:
    """Build the :class:`ForecastPatcher` of an ``obj.patch(...)`` call given a Forecast."""
    sizes = {k: v for k, v in options.items() if k not in _OPTIONS}
    given = size_mapping(size, sizes)  # the errors of Patcher's: given twice, not a mapping
    dim = forecast_dim(given, {})
    spatial = {d: v for d, v in given.items() if d != dim}
    layout_options = {k: v for k, v in options.items() if k in _OPTIONS}
    return ForecastPatcher(obj, dim, given[dim], spatial, stride, layout_options)


class ForecastPatcher:
    """Forecast samples: each valid origin's inputs and targets, in every spatial patch.

    Built by ``obj.patch(time=xpatch.Forecast(...), **spatial sizes)``; see
    :class:`~xpatch.Forecast`. Sample ``i`` is origin ``i // n`` in spatial patch
    ``i % n`` (``n`` spatial patches; 1 for the whole field).

    Examples
    --------
    >>> import numpy as np, pandas as pd, xarray as xr, xpatch
    >>> times = pd.date_range("2020-01-01", periods=6, freq="6h")
    >>> da = xr.DataArray(np.zeros((6, 8, 8)), dims=("time", "y", "x"),
    ...                   coords={"time": times})
    >>> fc = da.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]), y=4, x=4)
    >>> len(fc), fc[0]["inputs"].shape, fc[0]["targets"].shape
    (16, (2, 4, 4), (1, 4, 4))
    >>> str(fc[0]["origin"])
    '2020-01-01T06:00:00.000000000'
    """

    def __init__(
        self,
        obj: xr.DataArray | xr.Dataset,
        dim: Hashable,
        forecast: Forecast,
        size: Mapping[Hashable, int],
        stride: int | Mapping[Hashable, int] | None,
        options: Mapping[str, Any],
    ) -> None:
        check_one_grid(obj)  # a Dataset mixing CRSs or grids: refused before the origins
        if dim not in obj.dims:
            raise DimensionError(
                f"Forecast given for {dim!r}, which is not a dim of the object "
                f"(dims {list(obj.dims)!r})."
            )
        if isinstance(stride, Mapping) and dim in stride:
            raise OptionError(
                f"stride={dict(stride)!r} gives the forecast dim {dim!r} a stride: its "
                "samples start at every valid origin. Leave it out (Forecast(origins=...) "
                "chooses them)."
            )
        halo = options.get("halo")
        if isinstance(halo, Mapping) and dim in halo:
            raise OptionError(
                f"halo={dict(halo)!r} grows the forecast dim {dim!r}: a halo is for the "
                "spatial dims; the forecast's offsets say which times a sample reads."
            )
        unknown = set(options) - set(_OPTIONS)
        if unknown:
            raise OptionError(f"unknown option(s) {sorted(unknown)!r} for a forecast layout.")
        coordinate = obj.indexes[dim] if dim in obj.indexes else np.arange(obj.sizes[dim])
        self.dim = dim
        self.forecast = forecast
        self.plan: OriginPlan = plan_origins(coordinate, dim, forecast)
        self._labels = np.asarray(coordinate)
        roles = _roles(obj, dim, forecast)
        self._input_variables, self._target_variables, self._forcing_variables = roles
        spatial_options = {k: v for k, v in options.items() if k in _SPATIAL_OPTIONS}
        spatial_layout = None
        if spatial := dict(size):
            spatial_layout = Patcher(obj, spatial, stride, **spatial_options).layout
            space, space_dims = spatial_layout.plan.anchors, spatial_layout.dims
        else:
            space, space_dims = np.zeros((1, 0), dtype=np.int64), ()
        self.spatial_count = len(space)
        starts = self.plan.starts(obj.sizes[dim])
        indices = {dim: np.repeat(starts, len(space))}
        for j, d in enumerate(space_dims):
            indices[d] = np.tile(space[:, j], len(starts))
        # The samples are exactly the anchors given: nothing filters or reorders them.
        sizes = {dim: self.plan.window, **spatial}
        if spatial_layout is None:
            inner_options = {k: v for k, v in spatial_options.items() if k != "min_valid"}
            self.patcher = Patcher(obj, sizes, stride, sampler=Anchors(indices), **inner_options)
        else:
            strides = stride if stride is None or isinstance(stride, Mapping) else None
            if strides is None and stride is not None:
                strides = dict.fromkeys(sizes, stride)
            self.patcher = Patcher.of(spatial_layout.over(obj, indices, sizes, strides))
        self._starts = starts
        self._space, self._space_dims = space, space_dims
        self._spatial = (spatial, stride, spatial_options, options.get("window"))
        self._spatial_layout = spatial_layout

    def __len__(self) -> int:
        return len(self._starts) * self.spatial_count

    def __repr__(self) -> str:
        f = self.forecast
        return (
            f"<xpatch.ForecastPatcher {len(self)} samples: {len(self._starts)} origins along "
            f"{self.dim!r} (inputs {f.inputs!r}, targets {f.targets!r}; {self.skipped}) x "
            f"{self.spatial_count} spatial patches>"
        )

    @property
    def skipped(self) -> SkippedOrigins:
        """The origins left out, and which offset each lacked."""
        return self.plan.skipped

    @property
    def origins(self) -> xr.DataArray:
        """The label of every valid origin, in sample order (dim ``"origin"``)."""
        return xr.DataArray(self._labels[self.plan.origins], dims="origin")

    def relative_positions(self, origin: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions of origin ``origin``'s input and target labels within its window."""
        start = self._starts[origin]
        return self.plan.inputs[origin] - start, self.plan.targets[origin] - start

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Sample ``index``: ``{"inputs", "targets", "origin"}`` (and ``"forcings"``), lazy."""
        position = operator.index(index)
        if not -len(self) <= position < len(self):
            raise IndexError(f"sample index {position} is out of range for {len(self)} samples.")
        position %= len(self)
        window = self.patcher[position]
        origin = position // self.spatial_count
        inputs, targets = self.relative_positions(origin)
        sample = {
            "inputs": self._role(window, self._input_variables).isel(
                {self.dim: inputs}, missing_dims="ignore"
            ),
            "targets": self._role(window, self._target_variables).isel({self.dim: targets}),
            "origin": self._labels[self.plan.origins[origin]],
        }
        if self._forcing_variables:
            sample["forcings"] = window[self._forcing_variables].isel({self.dim: targets})
        return sample

    def _role(self, window: xr.DataArray | xr.Dataset, variables: list | None) -> Any:
        return window if variables is None else window[variables]

    def to_grain(self, *, cache_bytes: int | None = None, cache_dir: Any = None) -> Any:
        """Return a Grain source of the samples: ``{inputs, targets, origin, anchor, index}``.

        Read through the patcher's source (chunk cache, ``chunk_shuffle``: each
        chunk decoded once per epoch). ``inputs`` and ``targets`` are arrays for a
        DataArray, ``{variable: array}`` for a Dataset; ``origin`` the origin's label
        (``datetime64[ns]``, or its position when the dim has no coordinate).
        ``cache_dir`` keeps the decoded zarr chunks on local disk for later epochs
        (:class:`~xpatch.grain.PatchSource`).

        Examples
        --------
        >>> import numpy as np, pandas as pd, xarray as xr, xpatch
        >>> times = pd.date_range("2020-01-01", periods=6, freq="6h")
        >>> da = xr.DataArray(np.arange(6.0), dims="time", coords={"time": times})
        >>> fc = da.patch(time=xpatch.Forecast(inputs=["0h"], targets=["6h", "12h"]))
        >>> src = fc.to_grain()
        >>> item = src[0]
        >>> item["inputs"].tolist(), item["targets"].tolist()
        ([0.0], [1.0, 2.0])
        """
        from xpatch.forecast.source import ForecastSource

        options = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
        inner = self.patcher.to_grain(weights=False, cache_dir=cache_dir, **options)
        return ForecastSource(self, inner)

    def apply(
        self,
        fn: Callable,
        batch_size: int = 64,
        *,
        output_dims: Mapping[Hashable, Any] | None = None,
        **options: Any,
    ) -> xr.DataArray | xr.Dataset:
        """Run a forecast model over every sample and put its outputs on the grid.

        ``fn(inputs) -> targets`` takes numpy batches ``(b, inputs, *carried, *patch)``
        (``inputs`` the input times in order; ``carried`` the input's other dims that are
        not patched, the whole field's without spatial sizes; ``patch`` the spatial
        patch, in the DataArray's dim order) and returns ``(b, targets, *carried,
        *patch)``: the input times replaced by the target times. With a halo ``patch``
        is the grown patch, and ``fn`` returns either it or the inner patch (a model
        that crops). The patches are the layout's (its ``sampler`` and ``min_valid``
        included; cells no patch covers are NaN), one per spatial patch and origin;
        overlapping ones blend as :meth:`xpatch.Patcher.apply` blends them, lazily for
        lazy input.

        A Dataset's ``fn`` takes ``{variable: batch}`` of the input variables (a
        static field, one without the time dim, as ``(b, *carried, *patch)``: once
        per sample, as its training samples serve it), each patch in its variable's
        dim order (without the patched dims it lacks), and returns ``{output: batch}``,
        by default one per target variable (a patch in its variable's dim order; for
        another output, in the order of the patched dims).

        Parameters
        ----------
        fn
            The model, as above.
        batch_size
            Largest number of samples per call of ``fn``.
        output_dims
            The outputs' dims other than the lead and the patched dims, as
            :meth:`xpatch.Patcher.apply` takes them: ``{dim: size}`` for a DataArray's
            one output (default: the input's carried dims); ``{name: {dim: size} |
            None}`` for outputs ``fn`` returns as a dict (None: the carried dims of
            the variable of that name, or of the DataArray). A Dataset's default:
            its target variables, each with its carried dims.

        Returns
        -------
        xarray.DataArray or xarray.Dataset
            One target: the input's dims, each result at its origin + lead on the time
            axis (the valid time). Several (a rollout): dims ``(time, lead, ...)``,
            ``time`` the origin, ``lead`` the offsets, and a ``valid_time`` coordinate
            (origin + lead). A Dataset of such variables, one per output, when ``fn``
            returns a dict.

        Other Parameters
        ----------------
        **options
            As :meth:`xpatch.Patcher.apply` takes them (``dtype``, ``reduce``,
            ``out_dtype``, ``nodata``, ``pad_batch``, ``task_memory``).

        Examples
        --------
        >>> import numpy as np, pandas as pd, xarray as xr, xpatch
        >>> times = pd.date_range("2020-01-01", periods=5, freq="6h")
        >>> da = xr.DataArray(np.arange(5.0), dims="time", coords={"time": times})
        >>> fc = da.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]))
        >>> out = fc.apply(lambda inputs: inputs[:, -1:])  # persistence
        >>> out.time.dt.hour.values.tolist(), out.values.tolist()
        ([12, 18, 0], [1.0, 2.0, 3.0])

        A Dataset with a static field, and a model of one of its variables:

        >>> ds = xr.Dataset({"t": da, "z": 2 * da, "oro": ((), 10.0)})
        >>> fc = ds.patch(time=xpatch.Forecast(inputs=["0h"], targets=["6h"]))
        >>> out = fc.apply(lambda x: {"t": x["t"] + x["oro"][:, None]}, output_dims={"t": None})
        >>> list(out.data_vars), out["t"].values.tolist()
        (['t'], [10.0, 11.0, 12.0, 13.0])
        """
        for option in ("scale", "weights"):
            if option in options:
                raise OptionError(
                    f"{option}= is not an option of a forecast's apply: its outputs are "
                    "the targets, one per lead, on the input's grid."
                )
        if not callable(fn):
            raise OptionError(f"fn={fn!r} is not callable; pass fn(inputs) -> targets.")
        spatial, stride, spatial_options, window = self._spatial
        order = [d for d in self.patcher.dims if d != self.dim]  # the patch's axes
        sizes = dict(zip(self.patcher.dims, self.patcher.layout.plan.size))
        inner_patch = tuple(int(sizes[d]) for d in order)
        outputs, returns_dict = self._outputs(output_dims, options, order)
        pieces, stacked = self._stacked_inputs(order)
        # A Dataset's variable sees and returns its patch in its own dims' order, as its
        # training samples serve it: per output, the layout's axes in that order.
        turns = {}
        for name in outputs:
            obj = self.patcher.obj
            single = isinstance(obj, xr.DataArray)
            like = obj if single else obj[name] if name in obj.data_vars else None
            own = [d for d in like.dims if d in order] if like is not None else order
            turns[name] = tuple(order.index(d) for d in own)
        origin = stacked.dims[0]

        strides = {origin: 1}
        if isinstance(stride, Mapping):
            strides.update(stride)
        elif stride is not None:
            strides.update(dict.fromkeys(spatial, stride))
        # The layout's own patches (its sampler and min_valid chose them), at every origin.
        origins = len(self.plan.origins)
        anchors = {origin: np.repeat(np.arange(origins), self.spatial_count)}
        for j, d in enumerate(self._space_dims):
            anchors[d] = np.tile(self._space[:, j], origins)
        changes = {} if window is None else {"window": window}
        if self._spatial_layout is None:
            grid_options = {
                k: v for k, v in spatial_options.items() if k not in ("sampler", "min_valid")
            }
            grid = Patcher(
                stacked, {origin: 1}, strides, sampler=Anchors(anchors), **grid_options, **changes
            )
        else:
            layout = self._spatial_layout.over(
                stacked, anchors, {origin: 1, **spatial}, strides, **changes
            )
            grid = Patcher.of(layout)
        leads = self.plan.targets.shape[1]
        lead = "lead"
        internal = {name: f"__xpatch_output_{k}__" for k, name in enumerate(outputs)}

        def per_origin(batch: np.ndarray) -> dict[str, np.ndarray]:
            inputs = np.take(batch, 0, axis=2)  # (b, channels, *patch): the origin axis off
            grown = inputs.shape[2:]
            given = {name: piece.unpack(inputs) for name, piece in pieces.items()}
            result = fn(given[None] if None in given else given)
            if returns_dict:
                if not isinstance(result, Mapping) or set(result) != set(outputs):
                    got = sorted(result) if isinstance(result, Mapping) else type(result).__name__
                    raise PredictionError(
                        f"fn returned {got!r}; this forecast's apply declared the outputs "
                        f"{sorted(outputs)!r}: return a dict with exactly those keys (or "
                        "declare others with output_dims={name: {dim: size} | None})."
                    )
            else:
                result = {None: result}
            blended = {}
            for name, dims in outputs.items():
                values = np.asarray(result[name])
                head = (len(batch), leads, *dims.values())
                turn = turns[name]  # the output's patch axes in its own order, to the layout's
                patch, inner = tuple(grown[j] for j in turn), tuple(inner_patch[j] for j in turn)
                if values.shape not in ((*head, *patch), (*head, *inner)):
                    what = "fn returned" if name is None else f"fn's output {name!r} is"
                    crop = "" if patch == inner else f" (or the inner {(*head, *inner)})"
                    raise PredictionError(
                        f"{what} a batch of shape {values.shape}; a forecast of {leads} "
                        f"target time(s) needs {(*head, *patch)}{crop}: the input times "
                        "replaced by the target times, every other dim kept."
                    )
                back = [len(head) + turn.index(j) for j in range(len(turn))]
                values = values.transpose(*range(len(head)), *back)
                blended[internal[name]] = np.expand_dims(values, axis=2 + len(dims))
            return blended

        declared = {internal[name]: {lead: leads, **dims} for name, dims in outputs.items()}
        for option in ("dtype", "out_dtype"):  # keyed by the user's names: by ours inside
            if isinstance(options.get(option), Mapping):
                options[option] = {internal[k]: v for k, v in options[option].items()}
        out = grid.apply(per_origin, batch_size, output_dims=declared, **options)
        results = {}
        for name, dims in outputs.items():
            labelled = self._labelled(
                out[internal[name]].rename({origin: self.dim}), name, dims, order
            )
            # Named as the input (a DataArray) or as the output, never by our inner key.
            labelled.name = self.patcher.obj.name if name is None else name
            results[name] = labelled
        return results[None] if None in results else xr.Dataset(results)

    def _outputs(
        self, output_dims: Any, options: Mapping[str, Any], order: list
    ) -> tuple[dict[Hashable, dict[Hashable, int]], bool]:
        # Each output's dims besides the lead and the patched ones (None: the DataArray's
        # one output), and whether fn returns a dict; checked before any work.
        obj = self.patcher.obj
        single = isinstance(obj, xr.DataArray)
        names = output_names(output_dims, options.get("dtype"), options.get("out_dtype"))

        def carried(name: Hashable | None) -> dict[Hashable, int]:
            var = obj if single else obj[name]
            return {d: var.sizes[d] for d in var.dims if d != self.dim and d not in order}

        if names is None and not single:
            if output_dims is not None:
                raise OptionError(
                    f"output_dims={output_dims!r} declares one output; a Dataset's forecast "
                    "model returns a dict: key output_dims by its outputs, e.g. "
                    "{'t2m': None} (None: the variable's own dims)."
                )
            names = list(self._target_variables)
            output_dims = dict.fromkeys(names)
        if names is None:
            outputs = {None: carried(None) if output_dims is None else dict(output_dims)}
        else:
            outputs = {}
            for name in names:
                dims = output_dims.get(name) if per_output(output_dims) else None
                if dims is None:
                    if not single and (name not in obj.data_vars or self.dim not in obj[name].dims):
                        raise OptionError(
                            f"output_dims gives the output {name!r} None, the dims of the "
                            f"variable of that name; the Dataset has no such variable with the "
                            f"{self.dim!r} dim. Declare its dims: {{{name!r}: {{}}}}."
                        )
                    dims = carried(name)
                    if not single and not set(order) <= set(obj[name].dims):
                        raise OptionError(
                            f"the output {name!r} lacks patched dims "
                            f"{sorted(set(order) - set(obj[name].dims), key=str)!r}: a "
                            "forecast's outputs are blended on the whole patched grid: "
                            "name the outputs fn returns, e.g. output_dims={'t2m': None}, or "
                            "choose Forecast(target_variables=...)."
                        )
                outputs[name] = dict(dims)
        for dims in outputs.values():
            bad = [d for d in dims if d in (self.dim, "lead", *order)]
            sizes_ok = all(
                isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0
                for n in dims.values()
            )
            if bad or not sizes_ok:
                raise OptionError(
                    f"output_dims={output_dims!r}: the output's dims {dims!r} must map dims "
                    f"other than the time dim {self.dim!r}, 'lead' and the patched dims "
                    f"{order!r} to positive sizes, e.g. {{'level': 3}}."
                )
        return outputs, names is not None

    def _stacked_inputs(self, order: list) -> tuple[dict[Hashable, _Piece], xr.DataArray]:
        # Every origin's inputs as one array (origin, channel, *patched dims), the
        # channel axis holding each variable's input times and carried dims in turn:
        # a static field once per origin, broadcast along the patched dims it lacks.
        obj = self.patcher.obj
        single = isinstance(obj, xr.DataArray)
        variables = {None: obj} if single else {v: obj[v] for v in self._input_variables}
        origin, history = "__xpatch_origin__", "__xpatch_inputs__"
        positions = xr.DataArray(self.plan.inputs, dims=(origin, history))
        origins = len(self.plan.origins)
        pieces, arrays, start = {}, [], 0
        for name, var in variables.items():
            var = var.drop_vars(list(var.coords))
            carried = [d for d in var.dims if d != self.dim and d not in order]
            lacking = [d for d in order if d not in var.dims]
            if self.dim in var.dims:
                var = var.isel({self.dim: positions})
                lead = [history, *carried]
            else:
                var = var.expand_dims({origin: origins})
                lead = list(carried)
            var = var.expand_dims({d: obj.sizes[d] for d in lacking})
            var = var.transpose(origin, *lead, *order)
            shape = tuple(var.sizes[d] for d in lead)
            width = int(np.prod(shape, dtype=np.int64))
            data = var.data.reshape(origins, width, *(obj.sizes[d] for d in order))
            arrays.append(data)
            axes = [1 + len(shape) + order.index(d) for d in lacking]
            present = [d for d in order if d not in lacking]
            own = [d for d in variables[name].dims if d in order]
            turn = (*range(1 + len(shape)), *(1 + len(shape) + present.index(d) for d in own))
            pieces[name] = _Piece(start, start + width, shape, tuple(axes), turn, var.dtype)
            start += width
        dtype = np.result_type(*(piece.dtype for piece in pieces.values()))
        arrays = [a.astype(dtype, copy=False) for a in arrays]
        if any(is_dask_array(a) for a in arrays):
            import dask.array as da

            data = da.concatenate([da.asarray(a) for a in arrays], axis=1)
        else:
            data = np.concatenate(arrays, axis=1) if len(arrays) > 1 else arrays[0]
        coords = {
            k: c.variable for k, c in obj.coords.items() if c.dims and set(c.dims) <= set(order)
        }
        stacked = xr.DataArray(data, dims=(origin, "__xpatch_channel__", *order), coords=coords)
        if single:  # its nodata and attributes carry to the output, as Patcher.apply's do
            stacked.attrs, stacked.encoding = dict(obj.attrs), dict(obj.encoding)
        return pieces, stacked

    def _labelled(
        self, out: xr.DataArray, name: Hashable | None, dims: Mapping, order: list
    ) -> xr.DataArray:
        # One output at its valid times (one lead) or origins and leads, in the input's
        # dim order when it keeps the input's dims, with the carried dims' coordinates.
        obj = self.patcher.obj
        like = obj if name is None else obj[name] if name in obj.data_vars else None
        if like is not None:
            out = out.assign_coords(
                {
                    k: c.variable
                    for k, c in like.coords.items()
                    if c.dims
                    and self.dim not in c.dims
                    and k not in out.coords
                    and all(out.sizes.get(d) == n for d, n in c.sizes.items())
                }
            )
            if name is not None:
                out.attrs = {**like.attrs, **out.attrs}
        keeps = like is not None and set(out.dims) - {"lead"} == set(like.dims)
        others = [d for d in like.dims if d != self.dim] if keeps else [*dims, *order]
        lead = "lead"
        if self.plan.targets.shape[1] == 1:
            valid = self._labels[self.plan.targets[:, 0]]
            out = out.isel({lead: 0}).assign_coords({self.dim: valid})
            return out.transpose(*like.dims) if keeps else out.transpose(self.dim, *others)
        out = out.assign_coords(
            {self.dim: self._labels[self.plan.origins], lead: self.plan.target_offsets}
        )
        out = out.assign_coords(valid_time=((self.dim, lead), self._labels[self.plan.targets]))
        return out.transpose(self.dim, lead, *others)

    def roles(self) -> tuple[list | None, list | None, list | None]:
        """Return the variables of the inputs, targets and forcings (None: a DataArray)."""
        return self._input_variables, self._target_variables, self._forcing_variables


def _roles(obj: xr.DataArray | xr.Dataset, dim: Hashable, forecast: Forecast) -> tuple:
    # The variables of each role of a Dataset (None: the DataArray itself).
    chosen_roles = (forecast.input_variables, forecast.target_variables, forecast.forcing_variables)
    if isinstance(obj, xr.DataArray):
        if any(chosen is not None for chosen in chosen_roles):
            raise OptionError(
                "Forecast(input_variables=..., target_variables=..., forcing_variables=...) "
                "choose variables of a Dataset; this is a DataArray."
            )
        return None, None, None
    # By name unless given: xarray may open a zarr's variables in another order each time.
    names = sorted(obj.data_vars, key=str)
    inputs = names if forecast.input_variables is None else list(forecast.input_variables)
    targets = (
        [v for v in names if dim in obj[v].dims]
        if forecast.target_variables is None
        else list(forecast.target_variables)
    )
    forcings = [] if forecast.forcing_variables is None else list(forecast.forcing_variables)
    given = (("input_variables", inputs), ("target_variables", targets))
    for argument, chosen in (*given, ("forcing_variables", forcings)):
        absent = [v for v in chosen if v not in obj.data_vars]
        if absent:
            raise OptionError(
                f"Forecast({argument}=...) names {absent!r}, not variables of the Dataset "
                f"({names!r})."
            )
    for argument, chosen in (("target_variables", targets), ("forcing_variables", forcings)):
        timeless = [v for v in chosen if dim not in obj[v].dims]
        if timeless:
            raise OptionError(
                f"Forecast({argument}=...) names {timeless!r}, which have no {dim!r} dim: "
                "they are taken at lead times; give static fields as inputs."
            )
    if not targets:
        raise OptionError(f"the Dataset has no variable with the {dim!r} dim to forecast.")
    return inputs, targets, forcings


class _Piece(NamedTuple):
    """Where one input variable sits in the stacked inputs' channels, and its shape."""

    start: int
    stop: int
    shape: tuple[int, ...]  # its input times (none for a static field) and carried dims
    lacking: tuple[int, ...]  # the axes of the patched dims it lacks, broadcast
    turn: tuple[int, ...]  # then its patch axes from the layout's order to its own
    dtype: np.dtype

    def unpack(self, inputs: np.ndarray) -> np.ndarray:
        """Return ``(b, *shape, *patch)`` of a batch ``(b, channels, *patch)``."""
        part = inputs[:, self.start : self.stop].reshape(
            len(inputs), *self.shape, *inputs.shape[2:]
        )
        part = part[tuple(0 if a in self.lacking else slice(None) for a in range(part.ndim))]
        part = part.transpose(self.turn)
        return part.astype(self.dtype, copy=False)
