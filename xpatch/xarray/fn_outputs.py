"""What ``fn`` returns, found by calling it once on a zero batch when the caller did not say.

``apply`` needs the non-patched dims and the dtype of ``fn``'s output before any
work (the result's shape and dtype are part of the lazy graph and of the output
store). When ``output_dims`` or ``dtype`` is left out, :func:`declare_returns`
finds them the way :func:`dask.array.map_blocks` finds ``meta``: it calls ``fn``
once on a batch of zeros (one patch, or ``batch_size`` with ``pad_batch``) and
reads the shape and dtype of what comes back. Declaring both skips the call.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from xpatch.core.apply import BatchFunction
from xpatch.core.errors import OptionError, PredictionError
from xpatch.xarray.layout import Layout
from xpatch.xarray.variables import check_blendable

#: How the note added to an error of ``fn`` on the zero batch starts.
FN_NOTE = "xpatch: apply called fn on a batch of zeros"


def raised_by_fn(error: BaseException) -> bool:
    """Tell whether ``error`` came from ``fn``'s call on a zero batch (the user's code)."""
    return any(str(note).startswith(FN_NOTE) for note in getattr(error, "__notes__", ()))


class Returned(NamedTuple):
    """What ``fn`` returned for one output of the zero batch."""

    lead: tuple[int, ...]
    dtype: np.dtype


def call_on_zeros(
    layout: Layout, fn: BatchFunction, batch_size: int
) -> tuple[tuple[int, ...], dict[str | None, np.ndarray] | Any]:
    """Call ``fn`` on a batch of zeros; return the batch's shape and what ``fn`` returned.

    A dict result comes back as arrays by key; one array under the key None.
    """
    obj = layout.obj
    carried = [obj.sizes[d] for d in obj.dims if d not in layout.dims]
    # The patches fn sees: grown by the halo, if any.
    shape = (batch_size, *carried, *(int(s) for s in layout.reading.plan.size))
    batch = np.zeros(shape, dtype=obj.dtype)
    try:
        result = fn(batch)
    except Exception as error:
        # fn's own error, with its traceback: it is the user's code that failed.
        error.add_note(
            f"{FN_NOTE} of shape {shape} ({obj.dtype}) to "
            "find the dims and dtype of its output. Declare them to skip this call: "
            "output_dims={dim: size} ({} for none) and dtype= the dtype fn returns."
        )
        raise
    if isinstance(result, Mapping):
        return shape, {key: np.asarray(value) for key, value in result.items()}
    return shape, {None: np.asarray(result)}


def output_halo(layout: Layout, out_patch: tuple[int, ...]) -> tuple[int, ...]:
    """Return the halo in output cells (the input's times the scale), or refuse a fraction.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> p = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4, halo={"x": 1})
    >>> output_halo(p.layout, (8, 8))
    (0, 2)
    """
    cells = []
    for dim, halo, size, out in zip(layout.dims, layout.halo, layout.geometry.size, out_patch):
        grown = Fraction(halo * out, size)
        if grown.denominator != 1:
            raise OptionError(
                f"halo={{{dim!r}: {halo}}} is {grown} cells of the output, whose patches are "
                f"{out} cells for {size} input cells: choose a halo that the scale makes whole "
                f"(a multiple of {Fraction(size, out).numerator})."
            )
        cells.append(int(grown))
    return tuple(cells)


def returned_lead(
    name: str | None,
    array: np.ndarray,
    batch: tuple[int, ...],
    out_patch: tuple[int, ...],
    halo: tuple[int, ...] = (),
) -> Returned:
    """Return the non-patched shape and dtype of one output, checked against the batch.

    With a ``halo`` (in output cells) the patch may also be the grown one.
    """
    n = len(out_patch)
    patch = array.shape[array.ndim - n :]
    grown = tuple(s + 2 * h for s, h in zip(out_patch, halo)) if halo else out_patch
    if array.ndim < 1 + n or array.shape[0] != batch[0] or patch not in (out_patch, grown):
        which = "" if name is None else f" for output {name!r}"
        raise PredictionError(
            f"fn returned shape {array.shape}{which} for a batch of zeros of shape {batch}; "
            f"expected ({batch[0]}, *output dims, *{out_patch}): the batch, the output's "
            "non-patched dims, then the patch (the input's patch size times the scale; a "
            "model that changes the resolution declares scale={dim: factor})."
        )
    return Returned(tuple(array.shape[1 : array.ndim - n]), array.dtype)


def lead_dims(
    name: str | None, lead: tuple[int, ...], carried: Mapping[Hashable, int]
) -> dict[Hashable, int] | None:
    """Name the non-patched dims ``fn`` returned: the input's (None), none, or refuse.

    Sizes alone cannot name new dims (``(5,)`` may be classes or times), so an
    output whose non-patched shape is neither the input's nor empty must be
    declared.

    Examples
    --------
    >>> lead_dims(None, (3,), {"band": 3}) is None
    True
    >>> lead_dims(None, (), {"band": 3})
    {}
    """
    if lead == tuple(carried.values()):
        return None
    if not lead:
        return {}
    which = "fn's output" if name is None else f"fn's output {name!r}"
    guess = ", ".join(f"'dim{i}': {n}" for i, n in enumerate(lead))
    example = f"{{{guess}}}" if name is None else f"{{{name!r}: {{{guess}}}}}"
    raise OptionError(
        f"{which} has the non-patched shape {lead} on a batch of zeros, where the input's "
        f"non-patched dims are {dict(carried)!r}; name its dims with output_dims={example} "
        "(your names, in order)."
    )


def declare_returns(
    layout: Layout,
    fn: BatchFunction,
    options: Any,
    out_patch: tuple[int, ...],
    names: list[str] | None,
) -> tuple[Any, Any, list[str] | None]:
    """Fill in the ``output_dims`` and ``dtype`` that ``options`` leaves out, from one call.

    Returns ``(output_dims, dtype, names)``: ``names`` are the outputs of a dict
    ``fn`` (its keys, the weights' entry aside) when no option declared them.
    Nothing is called when both are declared (for every output).
    """
    output_dims, dtype = options.output_dims, options.dtype
    if output_dims is not None and not _needs_dtype(dtype, names):
        return output_dims, dtype, names
    batch_size = options.batch_size if options.pad_batch else 1
    batch, returned = call_on_zeros(layout, fn, batch_size)
    weight_key = options.weights if isinstance(options.weights, str) else None
    single = list(returned) == [None]
    if names is None and not single:
        names = [key for key in returned if key != weight_key]
    if names is not None:
        if single:
            raise PredictionError(
                f"fn returned one array for a batch of zeros where apply was declared the "
                f"outputs {names!r}; return a dict {{name: array}}, or declare one output."
            )
        missing = [n for n in names if n not in returned]
        if missing:
            raise PredictionError(
                f"fn returned the outputs {[k for k in returned if k != weight_key]!r} for a "
                f"batch of zeros where apply was declared {names!r} (missing: {missing!r})."
            )
    obj = layout.obj
    carried = {d: obj.sizes[d] for d in obj.dims if d not in layout.dims}
    halo = output_halo(layout, out_patch)
    found = {
        name: returned_lead(name, returned[name], batch, out_patch, halo)
        for name in (names or [None])
    }
    if _needs_dtype(dtype, names):
        for name, (_, kind) in found.items():
            which = "fn's output" if name is None else f"fn's output {name!r}"
            check_blendable(
                kind,
                f"{which} for a batch of zeros of the input's dtype ({obj.dtype})",
                OptionError,
                "return numbers from fn and declare their dtype= (e.g. dtype='float32')",
            )
    if names is None:
        ((_, (lead, kind)),) = found.items()
        if output_dims is None:
            output_dims = lead_dims(None, lead, carried)
        return output_dims, kind if dtype is None else dtype, None
    if output_dims is None:
        output_dims = {name: lead_dims(name, found[name].lead, carried) for name in names}
    if _needs_dtype(dtype, names):
        given = dtype if isinstance(dtype, Mapping) else {}
        dtype = {
            name: found[name].dtype if given.get(name) is None else given[name] for name in names
        }
    return output_dims, dtype, names


def _needs_dtype(dtype: object, names: list[str] | None) -> bool:
    """Tell whether some output's dtype is left out (None, or missing from a dict)."""
    if dtype is None:
        return True
    return (
        isinstance(dtype, Mapping)
        and names is not None
        and any(dtype.get(n) is None for n in names)
    )
