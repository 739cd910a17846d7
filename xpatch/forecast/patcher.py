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
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, OptionError, PredictionError
from xpatch.core.samplers import Anchors
from xpatch.forecast.stencil import Forecast, OriginPlan, SkippedOrigins, plan_origins
from xpatch.patcher import Patcher
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
        if spatial := dict(size):
            grid = Patcher(obj, spatial, stride, **spatial_options)
            space, space_dims = grid.layout.plan.anchors, grid.dims
        else:
            space, space_dims = np.zeros((1, 0), dtype=np.int64), ()
        self.spatial_count = len(space)
        starts = self.plan.starts(obj.sizes[dim])
        indices = {dim: np.repeat(starts, len(space))}
        for j, d in enumerate(space_dims):
            indices[d] = np.tile(space[:, j], len(starts))
        # The samples are exactly the anchors given: nothing filters or reorders them.
        inner_options = {k: v for k, v in spatial_options.items() if k != "min_valid"}
        inner_options["sampler"] = Anchors(indices)
        if isinstance(inner_options.get("halo"), int):
            inner_options["halo"] = dict.fromkeys(space_dims, inner_options["halo"])
        sizes = {dim: self.plan.window, **spatial}
        self.patcher = Patcher(obj, sizes, stride, **inner_options)
        self._starts = starts
        self._spatial = (spatial, stride, spatial_options, options.get("window"))

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

    def to_grain(self, *, cache_bytes: int | None = None) -> Any:
        """Return a Grain source of the samples: ``{inputs, targets, origin, anchor, index}``.

        Read through the patcher's source (chunk cache, ``chunk_shuffle``: each
        chunk decoded once per epoch). ``inputs`` and ``targets`` are arrays for a
        DataArray, ``{variable: array}`` for a Dataset; ``origin`` the origin's label
        (``datetime64[ns]``, or its position when the dim has no coordinate).

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
        inner = self.patcher.to_grain(weights=False, **options)
        return ForecastSource(self, inner)

    def apply(self, fn: Callable, batch_size: int = 64, **options: Any) -> xr.DataArray:
        """Run a forecast model over every sample and put its outputs on the grid.

        ``fn(inputs) -> targets`` takes numpy batches ``(b, inputs, *carried, *patch)``
        (``inputs`` the input times in order; ``carried`` the input's other dims that are
        not patched, the whole field's without spatial sizes; ``patch`` the spatial
        patch) and returns ``(b, targets, *carried, *patch)``: the input times replaced
        by the target times. Overlapping spatial patches blend as
        :meth:`xpatch.Patcher.apply` blends them, lazily for lazy input.

        Returns
        -------
        xarray.DataArray
            One target: the input's dims, each result at its origin + lead on the time
            axis (the valid time). Several (a rollout): dims ``(time, lead, ...)``,
            ``time`` the origin, ``lead`` the offsets, and a ``valid_time`` coordinate
            (origin + lead).

        Other Parameters
        ----------------
        batch_size, **options
            As :meth:`xpatch.Patcher.apply` takes them (``dtype``, ``reduce``,
            ``out_dtype``, ``nodata``, ``pad_batch``, ``task_memory``); the output's
            dims are the forecast's, not an option.

        Examples
        --------
        >>> import numpy as np, pandas as pd, xarray as xr, xpatch
        >>> times = pd.date_range("2020-01-01", periods=5, freq="6h")
        >>> da = xr.DataArray(np.arange(5.0), dims="time", coords={"time": times})
        >>> fc = da.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]))
        >>> out = fc.apply(lambda inputs: inputs[:, -1:])  # persistence
        >>> out.time.dt.hour.values.tolist(), out.values.tolist()
        ([12, 18, 0], [1.0, 2.0, 3.0])
        """
        obj = self.patcher.obj
        if not isinstance(obj, xr.DataArray):
            raise OptionError(
                "ForecastPatcher.apply runs a model over a DataArray; pick or stack the "
                "variables first (ds['t2m'].patch(time=Forecast(...)), or ds.to_dataarray())."
            )
        for option in ("output_dims", "scale", "weights"):
            if option in options:
                raise OptionError(
                    f"{option}= is not an option of a forecast's apply: its outputs are "
                    "the targets, one per lead, on the input's grid."
                )
        origin, history = "__xpatch_origin__", "__xpatch_inputs__"
        positions = xr.DataArray(self.plan.inputs, dims=(origin, history))
        stacked = obj.isel({self.dim: positions}).drop_vars(self.dim, errors="ignore")
        stacked = stacked.transpose(origin, history, ...)
        spatial, stride, spatial_options, window = self._spatial
        strides = {origin: 1}
        if isinstance(stride, Mapping):
            strides.update(stride)
        elif stride is not None:
            strides.update(dict.fromkeys(spatial, stride))
        if window is not None:
            spatial_options = {**spatial_options, "window": window}
        spatial_options.pop("sampler", None)
        spatial_options.pop("min_valid", None)
        if isinstance(spatial_options.get("halo"), int):  # not along the origins
            spatial_options["halo"] = dict.fromkeys(spatial, spatial_options["halo"])
        grid = Patcher(stacked, {origin: 1, **spatial}, strides, **spatial_options)
        leads = self.plan.targets.shape[1]
        carried = {d: stacked.sizes[d] for d in stacked.dims[2:] if d not in spatial}
        axis = 2 + len(carried)  # the size-1 origin axis in fn's batch, after the carried

        def per_origin(batch: np.ndarray) -> np.ndarray:
            inputs = np.take(batch, 0, axis=axis)
            result = np.asarray(fn(inputs))
            expected = (len(batch), leads, *inputs.shape[2:])
            if result.shape != expected:
                raise PredictionError(
                    f"fn returned a batch of shape {result.shape}; a forecast of {leads} "
                    f"target time(s) needs {expected}: the input times replaced by the "
                    "target times, every other dim kept."
                )
            return np.expand_dims(result, axis=axis)

        lead = "lead"
        output_dims = {lead: leads, **carried}
        out = grid.apply(per_origin, batch_size, output_dims=output_dims, **options)
        out = out.rename({origin: self.dim})
        others = [d for d in obj.dims if d != self.dim]
        if leads == 1:
            valid = self._labels[self.plan.targets[:, 0]]
            out = out.isel({lead: 0}).assign_coords({self.dim: valid})
            return out.transpose(*obj.dims)
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
