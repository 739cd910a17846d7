"""Forecast samples along a time dim: which origins have every label a sample needs.

A :class:`Forecast` says, relative to a sample's origin, which labels its inputs take
(the history, e.g. ``-12h, -6h, 0h``) and which its targets take (the leads, e.g.
``+6h``). :func:`plan_origins` finds the origins where every one of those labels is
in the coordinate, and where each sample's labels sit (index positions), and counts
the origins it skips and why: an archive with a gap, or the first and last origins
whose history or leads run past its ends.
"""

from __future__ import annotations

import datetime
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from xpatch.core.errors import DimensionError, OptionError


@dataclass(frozen=True)
class Forecast:
    """Samples of a time dim by label: inputs before an origin, targets after it.

    Give it as the time dim's value in ``.patch(...)``:
    ``ds.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]), lat=32, lon=32)``.

    Parameters
    ----------
    inputs, targets
        Offsets from the origin. Timedeltas (``"6h"``, ``numpy.timedelta64`` or an
        array of them, ``pandas.Timedelta``, ``datetime.timedelta``,
        ``pandas.timedelta_range(...)``) for a time coordinate: datetime64, tz-aware
        (measured in UTC; the labels stay as given) or cftime (any calendar). Or
        integer steps (index positions) for a dim without times, and for cftime too;
        a step counts positions, not time: across a gap in the archive, one step
        spans the gap and nothing is skipped. Give timedeltas where times may be
        missing: an origin whose label at some offset is absent is skipped and
        counted in ``skipped``. Targets may be many (a rollout). A time coordinate
        holding NaT is refused: drop those times first.
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


#: What a user may give as one offset from the origin: a timedelta or an integer step.
_TIMEDELTAS = (str, np.timedelta64, datetime.timedelta)  # pd.Timedelta is a datetime.timedelta
_FORMS = (
    "timedeltas ('6h', numpy.timedelta64(6, 'h'), pandas.Timedelta('6h'), "
    "datetime.timedelta(hours=6), pandas.timedelta_range(...))"
)


def _is_step(value: Any) -> bool:
    # numpy.timedelta64 subclasses numpy.signedinteger: it is a timedelta, not a step.
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.timedelta64)


def _is_missing(value: Any) -> bool:
    return value is None or (np.ndim(value) == 0 and not isinstance(value, str) and pd.isna(value))


def _offsets(values: Any, argument: str) -> tuple[np.ndarray, list[str], bool]:
    # The offsets as timedelta64[ns] or int64 steps, how to name them, and whether steps.
    given = values
    if isinstance(values, np.ndarray) and values.ndim == 0:
        values = values[()]
    if values is None:
        raise OptionError(
            f"Forecast({argument}=None) gives no offset: give {_FORMS}, or integer steps "
            "(e.g. inputs=['-6h', '0h'], targets=['6h'])."
        )
    if _is_missing(values) or isinstance(values, (*_TIMEDELTAS, int, np.integer)):
        values = [values]
    try:
        values = list(values)
    except TypeError:
        raise OptionError(
            f"Forecast({argument}={given!r}) is not an offset nor a sequence of offsets: "
            f"give {_FORMS}, or integer steps."
        ) from None
    if not values:
        raise OptionError(f"Forecast({argument}=[]) needs at least one offset.")
    for i, value in enumerate(values):
        if _is_missing(value):
            raise OptionError(
                f"Forecast({argument}={given!r}) holds {value!r} at position {i}: every "
                f"offset must be a time from the origin; give {_FORMS}, or integer steps."
            )
    steps = [_is_step(v) for v in values]
    if all(steps):
        return np.asarray(values, dtype=np.int64), [f"{int(v):+d} steps" for v in values], True
    if any(steps):
        raise OptionError(
            f"Forecast({argument}={given!r}) mixes integer steps and timedeltas: give "
            "one kind (timedeltas such as '6h' for a time coordinate)."
        )
    others = [v for v in values if not isinstance(v, _TIMEDELTAS)]
    try:
        if others:  # a float would be read as nanoseconds
            raise TypeError(f"{others[0]!r} is neither a timedelta nor an integer step")
        deltas = pd.to_timedelta(values)
    except (ValueError, TypeError, OverflowError) as error:
        raise OptionError(f"Forecast({argument}={given!r}) are not {_FORMS}: {error}") from None
    names = [v if isinstance(v, str) else _timedelta_name(d) for v, d in zip(values, deltas)]
    return deltas.to_numpy().astype("timedelta64[ns]"), names, False


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

    ``coordinate`` is a time index (datetime64, tz-aware or cftime: offsets are
    timedeltas, or for cftime integer steps too) or anything else (its length counts;
    offsets are steps). Raises :class:`~xpatch.DimensionError` when the times hold NaT
    or repeat, and :class:`~xpatch.OptionError` when no origin is valid, saying why.

    Examples
    --------
    >>> times = pd.date_range("2020-01-01", periods=5, freq="6h")
    >>> plan = plan_origins(times, "time", Forecast(inputs=["-6h", "0h"], targets=["6h"]))
    >>> plan.origins.tolist(), plan.inputs.tolist(), plan.targets.tolist()
    ([1, 2, 3], [[0, 1], [1, 2], [2, 3]], [[2], [3], [4]])
    >>> str(plan.skipped)
    '2 of 5 origins skipped: 1 lack -6h, 1 lack 6h'
    """
    index = _as_index(coordinate)
    axis = _time_axis(index, dim)
    inputs, input_names, input_steps = _offsets(forecast.inputs, "inputs")
    targets, target_names, target_steps = _offsets(forecast.targets, "targets")
    if input_steps != target_steps:
        raise OptionError(
            f"Forecast(inputs={forecast.inputs!r}, targets={forecast.targets!r}) gives "
            "integer steps for one and timedeltas for the other: give one kind."
        )
    steps = input_steps
    if steps and isinstance(index, pd.DatetimeIndex):
        raise OptionError(
            f"Forecast(inputs={forecast.inputs!r}, targets={forecast.targets!r}) gives "
            f"steps for the datetime dim {dim!r}: give timedeltas such as '6h' or '-12h'."
        )
    if not steps and axis is None:
        raise OptionError(
            f"Forecast(inputs={forecast.inputs!r}, targets={forecast.targets!r}) gives "
            f"timedeltas, but {dim!r} has no time coordinate (datetime64 or cftime) to "
            "measure them on: give integer steps, e.g. inputs=[-1, 0], targets=[1]."
        )
    offsets = np.concatenate([inputs, targets])
    names = input_names + target_names
    candidates = _candidate_origins(index, dim, forecast.origins)
    if steps:  # index positions, whatever the labels: a gap is not seen
        positions = candidates[:, None] + offsets[None, :]
        positions = np.where((positions >= 0) & (positions < len(index)), positions, -1)
    else:
        # In the axis' own unit: nanoseconds would overflow far from 1970 (or over a
        # cftime run of centuries). An offset finer than the unit lands on no label.
        unit, _ = np.datetime_data(axis.dtype)
        shifted = offsets.astype(f"timedelta64[{unit}]")
        exact = shifted.astype(offsets.dtype) == offsets
        wanted = axis[candidates][:, None] + shifted[None, :]
        positions = pd.Index(axis).get_indexer(wanted.ravel()).reshape(wanted.shape)
        positions[:, ~exact] = -1
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


def _as_index(coordinate: Any) -> pd.Index:
    # pandas.Index() of a CFTimeIndex (or of cftime objects) gives a plain object Index.
    index = coordinate if isinstance(coordinate, pd.Index) else pd.Index(coordinate)
    if index.dtype == object and len(index) and not isinstance(index, xr.CFTimeIndex):
        try:
            index = xr.CFTimeIndex(index)
        except (TypeError, ValueError):
            pass  # not cftime datetimes: labels without times
    return index


def _time_axis(index: pd.Index, dim: Hashable) -> np.ndarray | None:
    """Return the times as datetime64 (UTC if tz-aware), or cftime's as timedelta64 from the first.

    Both are exact for ``time + offset`` arithmetic and label lookup. None: not times.
    Raises :class:`~xpatch.DimensionError` for NaT or repeated times.
    """
    if not isinstance(index, pd.DatetimeIndex | xr.CFTimeIndex):
        return None
    absent = np.flatnonzero(np.asarray(index.isna()))
    if len(absent):
        shown = ", ".join(str(i) for i in absent[:10]) + (", ..." if len(absent) > 10 else "")
        raise DimensionError(
            f"the {dim!r} coordinate holds NaT (a missing time) at {len(absent)} "
            f"position(s): {shown}. A missing time can be no sample's origin, input or "
            f"target: drop those first, e.g. ds.sel({dim}=ds[{dim!r}].notnull()) or "
            f"ds.dropna({dim!r}, subset=[{dim!r}])."
        )
    if not index.is_unique:
        raise DimensionError(
            f"the {dim!r} coordinate repeats labels: a forecast's labels must be unique."
        )
    if isinstance(index, xr.CFTimeIndex):
        # The calendar's own elapsed time: a noleap year has 365 days, a 360_day month 30.
        return np.asarray((index - index[0]).to_numpy())
    if index.tz is not None:
        index = index.tz_convert(None)  # UTC wall time: no offset lands in a DST fold
    return index.to_numpy()


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
