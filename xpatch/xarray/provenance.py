"""What a result was computed from, so that a resumed write can prove it continues it.

A lazy result's dask token already covers its input and its patch layout, but not
the code of a model function defined in a module: dask tokenizes such a function by
its name, so "I fixed the model and ran the same command" would keep the old name
and token. :func:`~xpatch.core.callables.code_token` hashes the function's code (and
its module's source), and ``Patcher.apply`` puts it into the result's token. Results of
``apply`` and ``reconstruct`` also leave their *facts* here (input, model, size,
stride, window...), keyed by the result's dask name, so that a refused resume says
which of them changed. :func:`fingerprint` is what :mod:`xpatch.io.writer` stores in the
progress record and :func:`differences` compares two of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import xarray as xr
from dask.base import tokenize

from xpatch.core.callables import code_token, describe_callable
from xpatch.version import VERSION
from xpatch.xarray.layout import Layout

#: How many results' facts are kept (the oldest are forgotten first).
FACTS_KEPT = 256

_FACTS: OrderedDict[str, dict] = OrderedDict()

__all__ = ["code_token", "describe_callable", "differences", "fingerprint", "record_facts"]


def record_facts(name: str, facts: Mapping[str, Any]) -> None:
    """Remember what the dask array called ``name`` was computed from.

    Parameters
    ----------
    name
        The result's dask name (``result.data.name``).
    facts
        Short, readable values (they are shown when a resume is refused), such
        as ``{"model": describe_callable(fn), "size": {"y": 256}}``.
    """
    _FACTS[name] = {str(key): _plain(value) for key, value in facts.items()}
    _FACTS.move_to_end(name)
    while len(_FACTS) > FACTS_KEPT:
        _FACTS.popitem(last=False)


def facts_of(name: str) -> dict | None:
    """Return the facts recorded for the dask array called ``name``, if any."""
    return _FACTS.get(name)


def _plain(value: Any) -> Any:
    """Make ``value`` JSON-friendly and comparable after a round trip."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    try:
        return value.item()  # numpy scalars
    except (AttributeError, ValueError):
        return repr(value)


def fingerprint(dataset: xr.Dataset, format: str, layout: Mapping[str, Any]) -> dict:
    """Describe what a progress record must match for a resumed run to continue it.

    Parameters
    ----------
    dataset
        The variables to be written (data variables and coordinates).
    format
        ``"zarr"`` or ``"geotiff"``.
    layout
        Other facts about the output that must not change (e.g. GeoTIFF nodata).

    Returns
    -------
    dict
        JSON-friendly: xpatch's version, the format, and per variable its dims,
        shape, dtype, chunks, dask token and (if known) facts.
    """
    variables: dict[str, dict] = {}
    for var_name, var in dataset.variables.items():
        data = var.data
        name = getattr(data, "name", None)
        variables[str(var_name)] = {
            "dims": [str(d) for d in var.dims],
            "shape": list(var.shape),
            "dtype": str(var.dtype),
            "chunks": [list(c) for c in var.chunks] if var.chunks else None,
            "token": tokenize(var),
            "facts": facts_of(name) if isinstance(name, str) else None,
        }
    return {
        "xpatch": VERSION,
        "format": format,
        "layout": _plain(dict(layout)),
        "variables": variables,
    }


LAYOUT_FIELDS = ("dims", "shape", "dtype", "chunks")


def differences(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """Compare two fingerprints.

    Returns
    -------
    layout, computation : list of str
        What differs in the output's layout (blocks would not line up: never
        resumable) and in the computation (resumable only when forced), in words.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = fingerprint(xr.Dataset({"v": ("x", np.zeros(3))}), "zarr", {})
    >>> b = fingerprint(xr.Dataset({"v": ("x", np.ones(3))}), "zarr", {})
    >>> differences(a, a), differences(a, b)[1]
    (([], []), ["the values of 'v' (another input, model or layout)"])
    """
    layout: list[str] = []
    computation: list[str] = []
    if saved.get("format") != now.get("format"):
        layout.append(f"the format (then {saved.get('format')}, now {now.get('format')})")
    if saved.get("layout") != now.get("layout"):
        layout.append(f"the output options (then {saved.get('layout')}, now {now.get('layout')})")
    old_vars, new_vars = saved.get("variables", {}), now.get("variables", {})
    if set(old_vars) != set(new_vars):
        layout.append(f"the variables (then {sorted(old_vars)}, now {sorted(new_vars)})")
    for name in sorted(set(old_vars) & set(new_vars)):
        old, new = old_vars[name], new_vars[name]
        for key in LAYOUT_FIELDS:
            if old.get(key) != new.get(key):
                layout.append(f"the {key} of {name!r} (then {old.get(key)}, now {new.get(key)})")
        if old.get("token") == new.get("token"):
            continue
        old_facts, new_facts = old.get("facts") or {}, new.get("facts") or {}
        changed = [
            f"{key} (then {old_facts.get(key)!r}, now {new_facts.get(key)!r})"
            for key in sorted(set(old_facts) | set(new_facts))
            if old_facts and new_facts and old_facts.get(key) != new_facts.get(key)
        ]
        if changed:
            computation.append(f"for {name!r}: " + "; ".join(changed))
        else:
            computation.append(f"the values of {name!r} (another input, model or layout)")
    if saved.get("xpatch") != now.get("xpatch"):
        computation.append(
            f"xpatch's version (then {saved.get('xpatch')}, now {now.get('xpatch')})"
        )
    return _dedupe(layout), _dedupe(computation)


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def layout_facts(layout: Layout) -> dict[str, Any]:
    """Return the facts of a patcher's layout that a result depends on."""
    return {
        "size": layout.size,
        "stride": layout.stride,
        "window": layout.window if isinstance(layout.window, str | Mapping | tuple) else "an array",
        "boundary": layout.boundary,
        "sampler": repr(layout.sampler),
        "pad_value": layout.pad_value,
        # Only with one: the facts of layouts without a halo stay those of older records.
        **({"halo": dict(zip(layout.dims, layout.halo))} if any(layout.halo) else {}),
    }


def note_result(result: xr.DataArray | xr.Dataset, facts: Callable[[], Mapping[str, Any]]) -> None:
    """Record ``facts()`` for every lazy variable of ``result`` (see :func:`record_facts`).

    ``facts`` is called only if ``result`` has a lazy variable: an eager result is
    written from its values, whose token is their hash, and hashing its inputs
    again would only cost time.
    """
    variables = result.variables if isinstance(result, xr.Dataset) else {None: result.variable}
    names = [getattr(var.data, "name", None) for var in variables.values()]
    names = [name for name in names if isinstance(name, str)]
    if names:
        described = facts()
        for name in names:
            record_facts(name, described)
