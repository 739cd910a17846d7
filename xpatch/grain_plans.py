"""How :class:`~xpatch.grain.PatchSource` cuts each variable: its patched axes and fill.

One :class:`VariablePlan` per served variable says which of the patcher's
patched dims the variable has, where, and how its patches are shaped and padded;
:func:`variable_index` turns a region of the patcher's dims into an index of it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import xarray as xr

from xpatch.core.extract import check_pad_value
from xpatch.variables import is_dask_backed


class VariablePlan:
    """How to cut one variable's patches: its patched axes, patch shape and pad value."""

    __slots__ = (
        "axes", "columns", "dtype", "extents", "lazy", "name", "pad_value", "patch_shape",
        "patch_size", "var",
    )  # fmt: skip

    def __init__(
        self, name: Hashable, var: xr.Variable, dims: Sequence[Hashable], size, pad_value
    ) -> None:
        self.name = name
        self.var = var
        # The patched axes the variable has, in its own order, and for each the
        # column of the patcher's anchors (which follow the patcher's dim order).
        present = [j for j in range(len(dims)) if dims[j] in var.dims]
        self.columns = sorted(present, key=lambda j: var.dims.index(dims[j]))
        self.axes = [var.dims.index(dims[j]) for j in self.columns]
        shape = list(var.shape)
        for ax, j in zip(self.axes, self.columns):
            shape[ax] = size[j]
        self.patch_shape = tuple(shape)
        self.patch_size = [shape[ax] for ax in self.axes]
        self.extents = [var.shape[ax] for ax in self.axes]
        self.dtype = var.dtype
        self.pad_value = check_pad_value(pad_value, var.dtype)
        self.lazy = is_dask_backed(var)


def variable_index(plan: VariablePlan, region: Sequence[slice], clip: bool = False) -> tuple:
    """Index of ``plan.var`` for ``region`` (slices in the patcher's dim order)."""
    index: list[slice] = [slice(None)] * plan.var.ndim
    for ax, j in zip(plan.axes, plan.columns):
        sl = region[j]
        index[ax] = slice(sl.start, min(sl.stop, plan.var.shape[ax])) if clip else sl
    return tuple(index)
