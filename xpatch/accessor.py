"""The ``.patch`` accessor on :class:`xarray.DataArray` and :class:`xarray.Dataset`.

Thin and stateless: calling it builds a :class:`~xpatch.Patcher`; its methods
build one and forward to it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import xarray as xr

from xpatch.forecast.patcher import ForecastPatcher, forecast_dim, forecast_layout
from xpatch.patcher import Patcher


@xr.register_dataarray_accessor("patch")
@xr.register_dataset_accessor("patch")
class PatchAccessor:
    """``obj.patch(...)``: lay out patches; ``obj.patch.anchors(...)`` and co. forward.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> da = xr.DataArray(np.zeros((64, 64)), dims=("y", "x"))
    >>> len(da.patch(y=32, x=32, stride=16))
    9
    >>> da.patch.anchors(y=32, x=32).shape
    (4, 2)
    """

    def __init__(self, xarray_obj: xr.DataArray | xr.Dataset) -> None:
        self._obj = xarray_obj

    def __call__(
        self,
        size: Mapping[Hashable, int] | None = None,
        stride: int | Mapping[Hashable, int] | None = None,
        **options: Any,
    ) -> Patcher | ForecastPatcher:
        """Build a :class:`~xpatch.Patcher`: ``Patcher(obj, size, stride, **options)``.

        ``options`` are the Patcher's layout options (``boundary``, ``window``,
        ``sampler``, ``min_valid``, ``pad_value``, ``pad_mode``, ``halo``) and the patch
        size as keyword arguments (``y=256, x=256``); see :class:`~xpatch.Patcher`.
        A :class:`~xpatch.Forecast` as the value of a time dim builds forecast samples
        instead (:class:`~xpatch.forecast.patcher.ForecastPatcher`).
        ``boundary={dim: "periodic"}`` patches across a global grid's seam.
        """
        if forecast_dim(size, options) is not None:
            return forecast_layout(self._obj, size, stride, options)
        return Patcher(self._obj, size, stride, **options)

    def anchors(self, size=None, stride=None, **options: Any) -> xr.DataArray:
        """``obj.patch(size, stride, **options).anchors()``."""
        return self(size, stride, **options).anchors()

    def patches(self, size=None, stride=None, **options: Any) -> xr.DataArray | xr.Dataset:
        """``obj.patch(size, stride, **options).patches()``."""
        return self(size, stride, **options).patches()

    def weights(self, size=None, stride=None, **options: Any) -> xr.DataArray:
        """``obj.patch(size, stride, **options).weights()``."""
        return self(size, stride, **options).weights()
