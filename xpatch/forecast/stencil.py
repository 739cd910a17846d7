"""Forecast samples along a time dim: which origins have every label a sample needs.

A :class:`Forecast` says, relative to a sample's origin, which labels its inputs take
(the history, e.g. ``-12h, -6h, 0h``) and which its targets take (the leads, e.g.
``+6h``). :func:`plan_origins` finds the origins where every one of those labels is
in the coordinate, and where each sample's labels sit (index positions), and counts
the origins it skips and why: an archive with a gap, or the first and last origins
whose history or leads run past its ends.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from xpatch.core.errors import DimensionError, OptionError


@dataclass(frozen=True)
class Forecast:
    """Samples of a time dim by label: inputs before an origin, targets after it.

    Give it as the time dim's value in ``.patch(...)``:
    ``ds.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]), lat=32, lon=32)``.

    Parameters
    ----------
    inputs, targets
        Offsets from the origin: timedeltas (``"6h"``, ``numpy.timedelta64``,
        ``pandas.timedelta_range(...)``) for a datetime coordinate, or integer steps
        (index positions) for any other dim. Targets may be many (a rollout).
    origins
        Which labels may be origins: a slice of labels (``slice("2020", "2021")``) or
        a sequence of labels; default every label.
    input_variables, target_variables
        For a Dataset: the variables of each role. Default: every variable as input
        (those without the time dim once, as static fields), and every variable with
        the time dim as target.
    forcing_variables
        For a Dataset: variables known ahead (top-of-atmosphere radiation, say), served
        at the targets' times as ``"forcings"`` beside the inputs. Default: none.

    Examples
    --------
    >>> import numpy as np, pandas as pd, xarray as xr, xpatch
    >>> times = pd.date_range("2020-01-01", periods=8, freq="6h").delete(4)  # a gap
    >>> t2m = xr.DataArray(np.arange(7.0), dims="time", coords={"time": times})
    >>> fc = t2m.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]))
    >>> len(fc), fc.skipped.count
    (3, 4)
    >>> sample = fc[0]
    >>> sample["inputs"].values.tolist(), sample["targets"].values.tolist()
    ([0.0, 1.0], [2.0])
    """

    inputs: Any
    targets: Any
    origins: Any = None
    input_variables: Sequence[Hashable] | None = field(default=None)
    target_variables: Sequence[Hashable] | None = field(default=None)
    forcing_variables: Sequence[Hashable] | None = field(default=None)


@dataclass(frozen=True)
class SkippedOrigins:
    """Origins left out of a forecast layout, and why.

    Attributes
    ----------
    count
        Origins skipped: some label a sample needs is not in the coordinate.
    candidates
        Origins considered (every label, or those ``origins=`` chose).
    missing
        For each offset, how many candidate origins lack the label at that offset
        (an origin may lack several).
    """

    count: int
    candidates: int
    missing: dict[str, int]

    def __str__(self) -> str:
        if not self.count:
            return f"no origin skipped of {self.candidates}"
        reasons = ", ".join(f"{n} lack {offset}" for offset, n in self.missing.items() if n)
        return f"{self.count} of {self.candidates} origins skipped: {reasons}"


@dataclass(frozen=True)
class OriginPlan:
    """Where each valid origin's samples sit along the time dim (index positions)."""

    #: Index position of every valid origin.
    origins: np.ndarray
    #: ``(origins, inputs)`` and ``(origins, targets)`` index positions.
    inputs: np.ndarray
    targets: np.ndarray
    skipped: SkippedOrigins
    #: The targets' offsets from the origin (timedelta64[ns], or int64 steps).
    target_offsets: np.ndarray

    @property
    def window(self) -> int:
        """Cells along time that hold every sample's labels (the longest span)."""
        every = np.concatenate([self.inputs, self.targets], axis=1)
        return int((every.max(axis=1) - every.min(axis=1)).max()) + 1

    def starts(self, extent: int) -> np.ndarray:
        """Start of the window of each origin, within ``[0, extent - window]``."""
        every = np.concatenate([self.inputs, self.targets], axis=1)
        return np.minimum(every.min(axis=1), extent - self.window)


def _offsets(values: Any, argument: str, is_time: bool) -> tuple[np.ndarray, list[str]]:
    # The offsets as timedelta64[ns] (a datetime dim) or int64 steps, and how to name them.
    if isinstance(values, str | int | np.integer | np.timedelta64 | pd.Timedelta):
        values = [values]
    values = list(values)
    if not values:
        raise OptionError(f"Forecast({argument}=[]) needs at least one offset.")
    if is_time:
        if any(isinstance(v, bool | int | np.integer) for v in values):
            raise OptionError(
                f"Forecast({argument}={values!r}) gives steps for a datetime dim: give "
                "timedeltas such as '6h' or '-12h'."
            )
        try:
            deltas = pd.to_timedelta(values)
        except (ValueError, TypeError) as error:
            raise OptionError(
                f"Forecast({argument}={values!r}) are not timedeltas ('6h', '-12h', "
                f"numpy.timedelta64): {error}"
            ) from None
        names = [v if isinstance(v, str) else _timedelta_name(d) for v, d in zip(values, deltas)]
        return deltas.to_numpy().astype("timedelta64[ns]"), names
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in values):
        raise OptionError(
            f"Forecast({argument}={values!r}) must be integer steps: the dim has no "
            "datetime64 coordinate to measure timedeltas on (a cftime calendar's labels "
            "are not read as times: give steps, e.g. inputs=[-1, 0], targets=[1])."
        )
    return np.asarray(values, dtype=np.int64), [f"{int(v):+d} steps" for v in values]


def _timedelta_name(delta: pd.Timedelta) -> str:
    # "-12h", "6h", "1d 6h": how a user writes them.
    sign = "-" if delta < pd.Timedelta(0) else ""
    seconds = int(abs(delta).total_seconds())
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    parts = [f"{n}{unit}" for n, unit in zip((days, hours, minutes, seconds), "dhms") if n]
    return sign + (" ".join(parts) or "0h")


def plan_origins(coordinate: Any, dim: Hashable, forecast: Forecast) -> OriginPlan:
    """Find the valid origins of ``forecast`` along ``coordinate`` (the time dim's labels).

    ``coordinate`` is a datetime index (offsets are timedeltas) or anything else (its
    length counts; offsets are steps). Raises :class:`~xpatch.OptionError` when no
    origin is valid, saying why.

    Examples
    --------
    >>> times = pd.date_range("2020-01-01", periods=5, freq="6h")
    >>> plan = plan_origins(times, "time", Forecast(inputs=["-6h", "0h"], targets=["6h"]))
    >>> plan.origins.tolist(), plan.inputs.tolist(), plan.targets.tolist()
    ([1, 2, 3], [[0, 1], [1, 2], [2, 3]], [[2], [3], [4]])
    >>> str(plan.skipped)
    '2 of 5 origins skipped: 1 lack -6h, 1 lack 6h'
    """
    index = pd.Index(coordinate)
    is_time = isinstance(index, pd.DatetimeIndex)
    inputs, input_names = _offsets(forecast.inputs, "inputs", is_time)
    targets, target_names = _offsets(forecast.targets, "targets", is_time)
    offsets = np.concatenate([inputs, targets])
    names = input_names + target_names
    candidates = _candidate_origins(index, dim, forecast.origins)
    if is_time:
        if not index.is_unique:
            raise DimensionError(
                f"the {dim!r} coordinate repeats labels: a forecast's labels must be unique."
            )
        wanted = index.to_numpy()[candidates][:, None] + offsets[None, :]
        positions = index.get_indexer(wanted.ravel()).reshape(wanted.shape)
    else:
        positions = candidates[:, None] + offsets[None, :]
        positions = np.where((positions >= 0) & (positions < len(index)), positions, -1)
    found = positions >= 0
    valid = found.all(axis=1)
    missing = {name: int((~found[:, j]).sum()) for j, name in enumerate(names)}
    skipped = SkippedOrigins(int((~valid).sum()), len(candidates), missing)
    if not valid.any():
        raise OptionError(
            f"Forecast along {dim!r}: no origin has every label its samples need "
            f"({skipped}). Check the offsets against the coordinate's spacing, or "
            "widen origins=."
        )
    positions = positions[valid]
    return OriginPlan(
        origins=candidates[valid],
        inputs=positions[:, : len(inputs)],
        targets=positions[:, len(inputs) :],
        skipped=skipped,
        target_offsets=targets,
    )


def _candidate_origins(index: pd.Index, dim: Hashable, origins: Any) -> np.ndarray:
    everything = np.arange(len(index), dtype=np.int64)
    if origins is None:
        return everything
    try:
        if isinstance(origins, slice):
            chosen = index.slice_indexer(origins.start, origins.stop, origins.step)
            return everything[chosen]
        positions = index.get_indexer(pd.Index(origins))
    except (KeyError, TypeError, ValueError) as error:
        raise OptionError(
            f"Forecast(origins={origins!r}) cannot select labels of {dim!r}: {error}"
        ) from None
    if (positions < 0).any():
        absent = list(np.asarray(origins)[positions < 0][:5])
        raise OptionError(
            f"Forecast(origins=...) names labels that {dim!r} does not have: {absent}."
        )
    return positions.astype(np.int64)
