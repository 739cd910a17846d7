"""How ``fn`` runs in an inference: the :class:`InferenceSetup`, batches, what fn returns.

:func:`run_batches` calls ``fn`` on consecutive batches of patches and checks what it
returns against the declared outputs (:func:`check_declared`,
:func:`check_returned`); one output (the name ``None``: ``fn`` returns an array) is a
dict of one. :func:`result_dtypes` and :func:`weighing` say what each output blends
into and with which weights.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from xpatch.core.blend.reductions import Reduction
from xpatch.core.blend.weighted import check_weights
from xpatch.core.errors import PredictionError
from xpatch.core.padding import PadMode
from xpatch.core.plan import Plan
from xpatch.core.windows import BlendWindow

#: ``fn(batch) -> batch``: numpy ``(b, *lead_in, *patch)`` to ``(b, *lead_out, *patch)``,
#: or to a dict of such arrays, one per declared output.
BatchFunction = Callable[[np.ndarray], Any]


class Output(NamedTuple):
    """One output of ``fn``: its declared non-patched shape and dtype."""

    lead: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True, eq=False)
class InferenceSetup:
    """What one sliding-window inference fixes, for every group of patches.

    Attributes
    ----------
    fn, batch_size, pad_batch
        The function, the largest batch it gets, and whether every batch is
        filled up to ``batch_size`` (copies of its last patch, results dropped).
    outputs
        Output name -> :class:`Output`. The one name ``None``: ``fn`` returns an
        array; else a dict with these keys.
    weight_key
        The key of the weights ``fn`` returns beside the outputs, or None.
    pad_value, pad_mode
        How cells past the array's end are filled.
    window, reduce
        How the results blend (:mod:`xpatch.core.blend`).
    halo
        Per patched axis, the cells of ``fn``'s results on each side beyond the
        blended patch (the patcher's halo in output cells): results of the grown
        shape are cropped to the patch; results of the patch's shape are taken
        as they are (a model that crops). Empty: no halo.
    """

    fn: BatchFunction
    batch_size: int
    outputs: Mapping[str | None, Output]
    window: BlendWindow
    reduce: Reduction
    pad_value: object = None
    pad_mode: PadMode = "constant"
    pad_batch: bool = False
    weight_key: str | None = None
    halo: tuple[int, ...] = ()

    def call(self, batch: np.ndarray) -> dict[str | None, np.ndarray]:
        """Call ``fn`` on ``batch``: what it returns, as arrays by output name (and weights)."""
        result = self.fn(batch)
        if self.single:
            return {None: np.asarray(result)}
        return check_returned(result, self.returned)

    @functools.cached_property
    def single(self) -> bool:
        """Whether ``fn`` returns one array (the output ``None``) rather than a dict."""
        return list(self.outputs) == [None]

    @functools.cached_property
    def returned(self) -> list[str]:
        """The keys of the dict ``fn`` returns: the outputs, and its weights if any."""
        return [*self.outputs, *([self.weight_key] if self.weight_key is not None else [])]


def run_batches(
    patches: np.ndarray,
    apply: InferenceSetup,
    out_patch: Sequence[int],
    split: bool = False,
    into_patches: bool = False,
) -> dict[str | None, Any]:
    """Call ``fn`` on consecutive batches of ``patches`` and stack each output it returns.

    Each patch goes through ``fn`` exactly once. Every call's result is checked
    against the declared ``(b, *lead, *patch)`` shape and dtype
    (:func:`check_declared`), then cast to that dtype. With ``pad_batch`` a short
    last batch is filled up to ``batch_size`` with copies of its last patch,
    whose results are dropped: ``fn`` sees one batch shape only, so a compiled
    function (``jax.jit``) compiles once. With ``weight_key``, ``fn``'s weights
    (per patch ``(b,)`` or per cell ``(b, *patch)``) come back under that key as
    ``(n, *patch)`` float64, checked finite and >= 0.

    Parameters
    ----------
    patches
        ``(n, *lead_in, *patch)`` patches, the patched axes last.
    apply
        The function, its batches and its outputs.
    out_patch
        The output's patch shape (the input's, unless ``fn`` changes the resolution).
    split
        Return each batch's result (cast) in a list instead of one stacked
        array: the batch blend (:mod:`xpatch.core.blend.batch_blend`) adds batches
        where they are, sparing a copy of every prediction.
    into_patches
        Write each batch's results over its patches when they have the declared
        shape and dtype (``patches`` is the caller's own scratch): a batch is only
        valid during ``fn``'s call, as with a reused buffer.

    Returns
    -------
    dict
        Per output name (``None`` for a single output), the stacked results.

    Examples
    --------
    >>> x = np.arange(12.0).reshape(3, 1, 4)
    >>> one = InferenceSetup(lambda b: b * 2, 2, {None: Output((1,), np.dtype("f8"))}, None, None)
    >>> run_batches(x, one, (4,))[None][:, 0]
    array([[ 0.,  2.,  4.,  6.],
           [ 8., 10., 12., 14.],
           [16., 18., 20., 22.]])
    >>> two = {"a": Output((1,), np.dtype("f8")), "b": Output((), np.dtype("f4"))}
    >>> both = InferenceSetup(lambda b: {"a": b, "b": b[:, 0]}, 2, two, None, None)
    >>> out = run_batches(x, both, (4,))
    >>> out["a"].shape, out["b"].shape, out["b"].dtype
    ((3, 1, 4), (3, 4), dtype('float32'))
    """
    n, patch_shape = len(patches), tuple(int(s) for s in out_patch)
    # Per output: (name, declared shape past the batch axis, dtype, where results go).
    outputs = []
    for name, (lead, dtype) in apply.outputs.items():
        stacked = (n, *lead, *patch_shape)
        if split:
            store = []
        elif into_patches and apply.single and patches.shape == stacked and patches.dtype == dtype:
            # Each batch's results over its own patches, which fn is done with: fresh pages
            # for a second array of the group cost more than the small patches' arithmetic.
            store = patches
        else:
            store = np.empty(stacked, dtype=dtype)
        outputs.append((name, stacked[1:], np.dtype(dtype), store))
    key = apply.weight_key
    weight_store = None if key is None else np.empty((n, *patch_shape), dtype=np.float64)
    size, fill = apply.batch_size, apply.pad_batch
    for start in range(0, n, size):
        batch = patches[start : start + size]
        m = len(batch)
        if fill and m < size:
            # Copies of a real patch, not zeros: values the model has seen, no NaN or
            # out-of-range input that could trip it; their results are dropped below.
            batch = np.concatenate([batch, np.repeat(batch[-1:], size - m, axis=0)])
        results = apply.call(batch)
        if key is not None:
            weights = returned_weights(
                cropped(np.asarray(results[key]), patch_shape, apply.halo),
                key,
                len(batch),
                patch_shape,
            )
            weight_store[start : start + m] = weights[:m]
        for name, shape, dtype, store in outputs:
            result = cropped(results[name], shape, apply.halo)
            if result.shape[1:] != shape or len(result) != len(batch):
                raise shape_error(name, result.shape, batch.shape, (len(batch), *shape))
            result = result[:m]
            if result.dtype != dtype:  # the common case, no cast, skips the check and errstate
                check_declared(result, dtype)
                with np.errstate(over="ignore", invalid="ignore"):  # checked; inf and NaN pass
                    result = result.astype(dtype)
            if split:
                store.append(result)
            else:
                store[start : start + m] = result
    stores = {name: store for name, _, _, store in outputs}
    if key is not None:
        stores[key] = weight_store
    return stores


def cropped(result: np.ndarray, shape: tuple[int, ...], halo: tuple[int, ...]) -> np.ndarray:
    """Return ``result`` without its ``halo`` cells if it has the grown shape, else as it is.

    Examples
    --------
    >>> cropped(np.arange(12).reshape(2, 6), (4,), (1,)).tolist()
    [[1, 2, 3, 4], [7, 8, 9, 10]]
    """
    if not any(halo) or result.ndim != len(shape) + 1:
        return result
    k = len(halo)
    patch = shape[len(shape) - k :]
    if result.shape[result.ndim - k :] != tuple(s + 2 * h for s, h in zip(patch, halo)):
        return result
    inner = tuple(slice(h, h + s) for h, s in zip(halo, patch))
    return result[(Ellipsis, *inner)]


def shape_error(name: str | None, got: tuple, batch: tuple, expected: tuple) -> PredictionError:
    """Return the error for a result of another shape than declared, naming the fix."""
    if name is None:
        return PredictionError(
            f"fn returned shape {got} for a batch of shape {batch}; expected {expected} "
            "(batch, *output_dims, *patch). Declare the output's non-patched dims with "
            "output_dims={name: size}, and a patch shape other than the input's with "
            "scale={dim: factor}."
        )
    return PredictionError(
        f"fn returned shape {got} for output {name!r} of a batch of shape {batch}; expected "
        f"{expected} (batch, *output_dims, *patch). Declare its non-patched dims with "
        f"output_dims={{{name!r}: {{dim: size}}}}, and a patch shape other than the input's "
        "with scale={dim: factor}."
    )


def check_returned(result: object, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Return ``fn``'s dict result as arrays, or raise :class:`~xpatch.PredictionError`.

    Examples
    --------
    >>> sorted(check_returned({"a": [1], "b": [2]}, ["a", "b"]))
    ['a', 'b']
    >>> check_returned({"a": [1], "c": [2]}, ["a", "b"])
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: fn returned the outputs ['a', 'c'] where ...
    """
    declared = ", ".join(repr(n) for n in names)
    if not isinstance(result, Mapping):
        raise PredictionError(
            f"fn returned a {type(result).__name__} where apply was declared several outputs "
            f"({declared}) through dicts of output_dims / dtype / out_dtype; return a dict "
            f"{{{', '.join(f'{n!r}: array' for n in names)}}}, or declare a single output."
        )
    got = list(result)
    if set(got) != set(names):
        extra = [k for k in got if k not in names]
        missing = [n for n in names if n not in result]
        raise PredictionError(
            f"fn returned the outputs {got!r} where apply was declared {list(names)!r} "
            f"(not declared: {extra!r}; missing: {missing!r}). Declare every output fn "
            "returns as a key of output_dims={name: {dim: size}, ...} (or of dtype), "
            "and return all of them from every call."
        )
    return {n: np.asarray(result[n]) for n in names}


def returned_weights(
    weights: np.ndarray, key: str, b: int, patch_shape: tuple[int, ...]
) -> np.ndarray:
    """Return the weights ``fn`` returned under ``key`` per cell, ``(b, *patch)``, checked.

    Examples
    --------
    >>> returned_weights(np.array([1.0, 2.0]), "w", 2, (3,)).tolist()
    [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    """
    weights = np.asarray(weights)
    if weights.shape == (b,):
        weights = weights.reshape(b, *(1,) * len(patch_shape))
    elif weights.shape != (b, *patch_shape):
        raise PredictionError(
            f"fn returned weights {key!r} of shape {weights.shape} for a batch of {b}; "
            f"expected ({b},) per patch or {(b, *patch_shape)} per cell."
        )
    return np.broadcast_to(check_weights(weights), (b, *patch_shape))


#: Per declared kind, the kinds ``fn`` may return: the same, and the exact cases of a
#: bool or an integer of the other signedness declared as an integer dtype.
ACCEPTED_KINDS = {"b": "b", "i": "iub", "u": "iub", "f": "f", "c": "c"}
KIND_NAMES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}


def check_declared(result: np.ndarray, dtype: np.dtype) -> None:
    """Raise :class:`~xpatch.PredictionError` unless ``result`` fits the declared ``dtype``.

    ``result`` must be of the declared kind (bool, integer, float, complex; a
    bool or an integer of either signedness may be declared as any integer
    dtype), and its values must fit: integers within the dtype's range, finite
    floats not overflowing to inf (NaN and inf that ``fn`` returns pass, and a
    float may round to a narrower float). The check costs a min and a max.

    Examples
    --------
    >>> check_declared(np.array([0, 255], dtype=np.int64), np.dtype("uint8"))
    >>> check_declared(np.array([-3, 300], dtype=np.int64), np.dtype("uint8"))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: fn returned int64 values from -3 to 300, ...
    """
    dtype, kind = np.dtype(dtype), result.dtype.kind
    if kind not in ACCEPTED_KINDS.get(dtype.kind, dtype.kind):
        raise PredictionError(
            f"fn returned dtype {result.dtype} ({KIND_NAMES.get(kind, kind)}), another kind "
            f"than the declared dtype={str(dtype)!r} ({KIND_NAMES.get(dtype.kind, dtype.kind)}); "
            f"apply casts within a kind only: pass dtype={str(result.dtype)!r} to apply, or "
            f"return {dtype} values from fn (out.astype({str(dtype)!r}))."
        )
    if result.size == 0 or result.dtype == dtype or dtype.kind not in "iuf" or kind == "b":
        return
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = int(result.min()), int(result.max())
        if info.min <= low and high <= info.max:
            return
        limits, clip = (info.min, info.max), f"np.clip(out, {info.min}, {info.max})"
    else:
        low, high = np.fmin.reduce(result, axis=None), np.fmax.reduce(result, axis=None)
        if not np.isfinite([low, high]).all():  # NaN and inf from fn pass: check the others
            finite = result[np.isfinite(result)]
            if not finite.size:
                return
            low, high = finite.min(), finite.max()
        with np.errstate(over="ignore"):
            if np.isfinite(np.array([low, high], dtype=result.dtype).astype(dtype)).all():
                return
        info = np.finfo(dtype)
        limits, clip = (float(info.min), float(info.max)), f"np.clip(out, {info.min}, {info.max})"
    raise PredictionError(
        f"fn returned {result.dtype} values from {low} to {high}, which do not fit the declared "
        f"dtype={str(dtype)!r} ({limits[0]} to {limits[1]}): they would "
        f"{'wrap around' if dtype.kind in 'iu' else 'overflow to inf'}. Declare a dtype that "
        f"holds them (dtype={str(result.dtype)!r}), or clip or cast in fn "
        f"(e.g. {clip}.astype({str(dtype)!r}))."
    )


def result_dtypes(
    apply: InferenceSetup, plan: Plan, weights: np.ndarray | None
) -> dict[str | None, np.dtype]:
    """Return each output's result dtype on ``plan`` (:meth:`Reduction.result_dtype`)."""
    weighted = weights is not None or apply.weight_key is not None
    return {
        name: apply.reduce.result_dtype(dtype, apply.window, plan, weighted)
        for name, (_, dtype) in apply.outputs.items()
    }


def weighing(
    cell_weights: np.ndarray | None, patch_weights: np.ndarray | None, n_lead: int, k: int
) -> np.ndarray | None:
    """Return one output's weights: ``fn``'s per cell times the given per patch, lead axes 1."""
    if cell_weights is None and patch_weights is None:
        return None
    if cell_weights is None:
        return patch_weights.reshape(-1, *(1,) * (n_lead + k))
    weights = cell_weights
    if patch_weights is not None:
        weights = weights * patch_weights.reshape(-1, *(1,) * k)
    return weights.reshape(weights.shape[0], *(1,) * n_lead, *weights.shape[1:])


def group_weights(weights: np.ndarray | None, plan: Plan, group: int) -> np.ndarray | None:
    """Per-patch ``weights`` (the user's order) of one group of the plan."""
    return None if weights is None else weights[plan.group_members(group)]
