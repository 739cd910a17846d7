"""A Grain source of forecast samples: the window patches of a source, split by role.

:class:`ForecastSource` serves what its inner :class:`~xpatch.grain.PatchSource`
reads (each sample's time window, through the chunk cache) as
``{"inputs", "targets", "origin", "anchor", "index"}``. It is a
:class:`~xpatch.grain.base.WrappedSource`: its chunk reads (ordering, reading ahead,
the cache) are the inner source's, so ``ds.pipe(src.chunk_shuffle, seed=...)``
decodes each chunk once per epoch, time chunks included.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
from dask.base import tokenize

from xpatch.grain.base import WrappedSource
from xpatch.grain.source import PatchSource


class ForecastSource(WrappedSource):
    """Random access to forecast samples (build it with ``ForecastPatcher.to_grain()``).

    Parameters
    ----------
    forecast
        The :class:`~xpatch.forecast.patcher.ForecastPatcher` served.
    inner
        The source of its window patches (``forecast.patcher.to_grain(weights=False)``).
    """

    def __init__(self, forecast: Any, inner: PatchSource) -> None:
        super().__init__(inner)
        self._forecast = forecast
        obj = forecast.patcher.obj
        dim = forecast.dim
        # Per served key, the axis of the forecast dim in its arrays (None: a static field).
        self._single = not hasattr(obj, "data_vars")
        if self._single:
            self._axes = {"data": obj.dims.index(dim)}
        else:
            self._axes = {
                name: (obj[name].dims.index(dim) if dim in obj[name].dims else None)
                for name in inner.variables
            }
        self._roles = forecast.roles()
        # Inputs the window source does not serve: those without any patched dim (a
        # static field of a whole-field forecast). Read whole, once per process, on first use.
        input_names = self._roles[0] or []
        self._whole = [v for v in input_names if str(v) not in self._axes]
        self._whole_values: dict[str, np.ndarray] = {}
        positions = [forecast.relative_positions(o) for o in range(len(forecast.plan.origins))]
        self._inputs = [inputs for inputs, _ in positions]
        self._targets = [targets for _, targets in positions]
        self._origin_labels = forecast.origins.values
        self._per_origin = forecast.spatial_count

    # -- protocol -------------------------------------------------------------------

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Sample ``index``: ``{"inputs", "targets", "origin", "anchor", "index"}`` (+ forcings)."""
        item = self.inner[index]
        position = int(item["index"])
        origin = position // self._per_origin
        inputs, targets = self._inputs[origin], self._targets[origin]
        if self._single:
            values = item["data"]
            axis = self._axes["data"]
            split = {
                "inputs": np.take(values, inputs, axis=axis),
                "targets": np.take(values, targets, axis=axis),
            }
        else:
            input_names, target_names, forcing_names = self._roles
            split = {
                "inputs": {v: self._take(item, v, inputs) for v in input_names},
                "targets": {v: self._take(item, v, targets) for v in target_names},
            }
            if forcing_names:
                split["forcings"] = {v: self._take(item, v, targets) for v in forcing_names}
        return {
            **split,
            "origin": self._origin_labels[origin],
            "anchor": item["anchor"],
            "index": item["index"],
        }

    def _take(self, item: dict, name: Hashable, positions: np.ndarray) -> np.ndarray:
        if name in self._whole:
            return self._whole_field(name)
        axis = self._axes[str(name)]
        values = item[str(name)]
        return values if axis is None else np.take(values, positions, axis=axis)

    def _whole_field(self, name: Hashable) -> np.ndarray:
        # Read once; each sample gets its own copy, writable like its other arrays.
        values = self._whole_values.get(str(name))
        if values is None:
            values = np.asarray(self._forecast.patcher.obj[name].values)
            self._whole_values[str(name)] = values
        return values.copy()

    def __getstate__(self) -> dict:
        # A worker reads the static fields again rather than receiving them pickled.
        return {**self.__dict__, "_whole_values": {}}

    def __repr__(self) -> str:
        return f"xpatch.ForecastSource({len(self)} samples; {self._forecast!r})"

    # -- what differs from the inner source ---------------------------------------------

    @property
    def patcher(self) -> Any:
        """The :class:`~xpatch.forecast.patcher.ForecastPatcher` served."""
        return self._forecast

    @property
    def variables(self) -> tuple[str, ...]:
        """The variables read (every role; a static field the windows lack at the end)."""
        return (*self.inner.variables, *(str(v) for v in self._whole))

    def make_fingerprint(self) -> str:
        """Hash the window patches' fingerprint, the roles and every sample's label positions."""
        return tokenize(
            "xpatch.ForecastSource v1",
            self.inner.fingerprint,
            self._roles,
            self._inputs,
            self._targets,
            self._origin_labels,
        )[:16]
