"""Crash suite: writer processes killed at random moments and at narrow windows.

Each case starts :mod:`tests.io.crash_writer` in a subprocess, kills it (SIGKILL after
a random delay within an uninterrupted run's duration, or SIGKILL from inside at
a chosen point of the write), checks what the kill left (a final path holds a
complete output or nothing that looks complete), reruns the same write in this
process as the user would, with no extra flag (the killed writer's lock is taken
over, with a warning naming it), and checks that the rerun completes to the
uninterrupted output bit for bit, or refuses with an XPatchError saying what to do.

Writers are started ahead (they import while the previous case runs) and wait
for a ``go`` line before they write, so that delays count from the write's start.
"""

from __future__ import annotations

import collections
import json
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.io import crash_writer
from tests.io.crash_writer import Writer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

BLOCKS = 16
SUFFIX = {"zarr": ".zarr", "geotiff": ".tif"}
RECORD = {"zarr": "/.xpatch", "geotiff": ".xpatch-progress"}


@pytest.fixture(autouse=True)
def fast_model(monkeypatch):
    """Reruns in this process need no sleep (the model's values do not depend on it)."""
    monkeypatch.setattr(crash_writer, "SLEEP", 0.0)


# -- writer processes ----------------------------------------------------------------------


def run_writer(out: Path, fmt: str, *options: str) -> tuple[int, str, str]:
    writer = Writer(out, fmt, *options)
    try:
        writer.go()
        return writer.wait()
    finally:
        writer.stop()


# -- reference outputs -----------------------------------------------------------------------


def read_output(path: Path, fmt: str) -> dict:
    """Everything a reader sees of an output: values, coordinates, georeferencing."""
    if fmt == "zarr":
        ds = xr.open_zarr(path).load()
        return {
            "dataset": ds,
            "variables": {name: ds[name].values for name in ds.variables},
        }
    import rasterio

    with rasterio.open(path) as src:
        return {
            "variables": {"values": src.read()},
            "profile": {
                "crs": src.crs.to_wkt(),
                "transform": tuple(src.transform),
                "nodata": repr(src.nodata),
                "dtype": src.dtypes,
                "shape": (src.count, src.height, src.width),
                "tiled": src.profile.get("tiled"),
            },
        }


def assert_same_output(path: Path, fmt: str, reference: dict) -> None:
    """``path`` holds the reference output bit for bit (values, coordinates, metadata)."""
    got = read_output(path, fmt)
    assert sorted(got["variables"]) == sorted(reference["variables"])
    for name, want in reference["variables"].items():
        have = got["variables"][name]
        assert have.dtype == want.dtype and have.shape == want.shape, name
        np.testing.assert_array_equal(have, want, err_msg=str(name))
        if want.dtype.kind in "fiuc":
            assert have.tobytes() == want.tobytes(), f"{name} differs in its bits"
    if fmt == "zarr":
        xr.testing.assert_identical(got["dataset"], reference["dataset"])
    else:
        assert got["profile"] == reference["profile"]


_BASELINES: dict = {}


def reference(fmt: str, model: str, folder: Path) -> dict:
    """The output of an uninterrupted write of ``model`` in this process."""
    key = (fmt, model)
    if key not in _BASELINES:
        path = folder / f"reference-{model}{SUFFIX[fmt]}"
        lazy = crash_writer.result(model, geo=fmt == "geotiff")
        assert xpatch.write(lazy, path, progress=False) == BLOCKS
        _BASELINES[key] = read_output(path, fmt)
    return _BASELINES[key]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    folder = tmp_path_factory.mktemp("references")
    return lambda fmt, model="a": reference(fmt, model, folder)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory, references):
    """When an uninterrupted writer process's record changes state, and when it is done.

    Seconds from the start of the write: ``{"creating": ..., "writing": ...,
    "finishing": ..., "done": ...}``.
    """
    folder = tmp_path_factory.mktemp("uninterrupted")
    timelines: dict = {}

    def measure(fmt: str) -> dict:
        if fmt not in timelines:
            needs(fmt)
            path = folder / f"o{SUFFIX[fmt]}"
            code, out, err = run_writer(path, fmt, "--timeline")
            assert code == 0, err
            times = {}
            for line in out.splitlines():
                if line.startswith("state "):
                    _, state, seconds = line.split()
                    times[state] = float(seconds)
                elif line.startswith("written "):
                    _, written, seconds = line.split()
                    assert int(written) == BLOCKS
                    times["done"] = float(seconds)
            assert list(times) == ["creating", "writing", "finishing", "done"], out
            # Another process computed the same bits: the result's identity does not
            # depend on the process, which is what lets a rerun resume a killed run.
            assert_same_output(path, fmt, references(fmt))
            timelines[fmt] = times
        return timelines[fmt]

    return measure


# -- one case: kill, look, rerun, check -----------------------------------------------------


@dataclass
class Case:
    """Kill a writer at ``point`` (inside), or with ``signum`` after ``delay`` seconds."""

    point: str | None = None
    at: int = 1
    delay: float | None = None
    signum: int = signal.SIGKILL

    def options(self) -> list[str]:
        return ["--kill", self.point, "--at", str(self.at)] if self.point else []

    def __str__(self) -> str:
        if self.point:
            return f"{self.point}@{self.at}"
        return f"{signal.Signals(self.signum).name} after {self.delay:.3f} s"


@dataclass
class Outcome:
    case: Case
    state: str  # what the kill left: "none", "creating", "writing", "finishing", "complete"
    markers: int
    rerun: str  # "written", "exists" (the output was complete), "refused"
    written: int | None = None
    message: str = ""
    signalled: bool = False  # the writer still ran when the signal was sent


def record_folder(path: Path, fmt: str) -> Path:
    return Path(str(path) + RECORD[fmt])


def markers(path: Path, fmt: str) -> int:
    done = record_folder(path, fmt) / "done"
    return sum(1 for m in done.rglob("*") if m.is_file()) if done.exists() else 0


def looks_complete(path: Path, fmt: str) -> bool:
    """What a reader (or the next writer) takes for a finished output.

    Any file at a GeoTIFF's final path (a reader knows nothing of records); a zarr
    store with data and no record.
    """
    if fmt == "geotiff":
        return path.exists()
    if (record_folder(path, fmt) / "record.json").exists():
        return False
    return path.exists() and any(e.name != ".xpatch" for e in path.iterdir())


def inspect_kill(path: Path, fmt: str, reference: dict) -> tuple[str, int]:
    """Return the state a kill left; an output that looks complete must be exact."""
    record = record_folder(path, fmt) / "record.json"
    if looks_complete(path, fmt):
        assert_same_output(path, fmt, reference)  # never a half-written final output
        if record.exists():  # a GeoTIFF renamed into place, its record not yet removed
            return json.loads(record.read_text())["state"], markers(path, fmt)
        return "complete", markers(path, fmt)
    if not record.exists():
        return "none", 0
    return json.loads(record.read_text())["state"], markers(path, fmt)


def wait_for_state(path: Path, fmt: str, state: str, writer: Writer, timeout: float = 60.0):
    """Poll the output's record until it says ``state``; return when it did."""
    record = record_folder(path, fmt) / "record.json"
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline and writer.process.poll() is None:
        try:
            if json.loads(record.read_text())["state"] == state:
                return time.perf_counter()
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass  # not written yet, or caught mid-write
        time.sleep(0.002)
    raise AssertionError(f"the writer's record never said {state!r}")


def rerun(path: Path, fmt: str, state: str, found: int) -> Outcome:
    lazy = crash_writer.result("a", geo=fmt == "geotiff")
    locked = (record_folder(path, fmt) / "lock.json").exists()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = xpatch.write(lazy, path, progress=False)
    except xpatch.OutputExistsError as error:
        return Outcome(Case(), state, found, "exists", message=str(error))
    except xpatch.XPatchError as error:
        return Outcome(Case(), state, found, "refused", message=f"{type(error).__name__}: {error}")
    # The killed writer's lock was taken over by the plain rerun, which said so.
    takeovers = [str(w.message) for w in caught if "took over the lock" in str(w.message)]
    assert len(takeovers) == locked and all("no longer runs" in m for m in takeovers), takeovers
    # A resumed run writes exactly the blocks without a marker.
    want = {"none": BLOCKS, "creating": BLOCKS, "writing": BLOCKS - found, "finishing": 0}
    assert written == want[state], (state, found, written)
    return Outcome(Case(), state, found, "written", written=written)


def check_rerun(path: Path, fmt: str, outcome: Outcome, reference: dict) -> None:
    if outcome.rerun == "refused":
        # A refusal says what to do, and doing it works.
        message = outcome.message
        assert "overwrite=True" in message or "break_lock=True" in message, message
        lazy = crash_writer.result("a", geo=fmt == "geotiff")
        xpatch.write(lazy, path, progress=False, overwrite=True, break_lock=True)
    else:
        assert outcome.state == "complete" or outcome.rerun == "written", outcome
    assert_same_output(path, fmt, reference)
    # Nothing of the run is left: no record, markers, lock, claim or temporary copy.
    folder = record_folder(path, fmt)
    assert not folder.exists(), sorted(p.name for p in folder.rglob("*"))


def run_case(case: Case, writer: Writer, fmt: str, reference: dict) -> Outcome:
    start = writer.go()
    signalled = False
    if case.point is None:
        time.sleep(max(0.0, start + case.delay - time.perf_counter()))
        signalled = writer.signal(case.signum)
    code, _, err = writer.wait()
    if case.point is not None:
        assert code == -signal.SIGKILL, f"{case}: the writer exited {code}: {err[-2000:]}"
    state, found = inspect_kill(writer.out, fmt, reference)
    outcome = rerun(writer.out, fmt, state, found)
    outcome.case = case
    outcome.signalled = signalled
    check_rerun(writer.out, fmt, outcome, reference)
    return outcome


def run_cases(cases: list[Case], fmt: str, folder: Path, reference: dict, ahead: int = 2):
    """Run the cases in order, starting each writer ``ahead`` cases early."""
    waiting: collections.deque = collections.deque()
    pending = iter(enumerate(cases))
    outcomes = []

    def start_next() -> None:
        following = next(pending, None)
        if following is not None:
            i, case = following
            waiting.append((case, Writer(folder / f"case{i}{SUFFIX[fmt]}", fmt, *case.options())))

    try:
        for _ in range(ahead):
            start_next()
        while waiting:
            case, writer = waiting.popleft()
            start_next()
            try:
                outcomes.append(run_case(case, writer, fmt, reference))
            except Exception as error:
                raise AssertionError(f"{fmt}, {case}: {error}") from error
    finally:
        for _, writer in waiting:
            writer.stop()
    return outcomes


#: What each kill point leaves, and what the rerun does: (state, rerun).
EXPECTED = {
    "lock-link": ("none", "written"),
    "creating": ("creating", "written"),
    "zarr-key": ("creating", "written"),
    "geotiff-create": ("creating", "written"),
    "created": ("creating", "written"),
    "writing": ("writing", "written"),
    "block": ("writing", "written"),
    "marker": ("writing", "written"),
    "finishing": ("finishing", "written"),
    "finished": ("finishing", "written"),
    "remove": ("complete", "exists"),
    "release": ("complete", "exists"),
}


def check_outcomes(outcomes: list[Outcome], min_random_completed: float = 0.5) -> None:
    report = "\n".join(
        f"{o.case}{'' if o.signalled or o.case.point else ' (had exited)'}: left {o.state} "
        f"({o.markers} markers), rerun {o.rerun} {o.written or ''} "
        f"{o.message[:200]}"
        for o in outcomes
    )
    print(report)  # shown by pytest -s, or with a failure
    for o in outcomes:
        if o.case.point is not None:
            assert (o.state, o.rerun) == EXPECTED[o.case.point], report
            # The writer runs 2 threads: when one dies at its marker, the other's may be
            # counted but still in flight, and die unwritten.
            if o.case.point == "block":
                assert o.markers >= o.case.at - 2, report
            if o.case.point == "marker":
                assert o.markers >= o.case.at - 1, report
    random = [o for o in outcomes if o.case.point is None]
    assert sum(o.signalled for o in random) >= len(random) / 2, report  # mostly mid-run
    completed = [o for o in random if o.rerun in ("written", "exists")]
    assert len(completed) >= min_random_completed * len(random), report
    # The random kills hit runs in the middle, not only before or after.
    if len(random) >= 4:
        assert any(o.state == "writing" and o.markers > 0 for o in random), report


def random_cases(fmt: str, times: dict, count: int, seed: int) -> list[Case]:
    """Kills after random delays within an uninterrupted run: a third of them during
    its creation (a short window), the others anywhere."""
    rng = np.random.default_rng([seed, len(fmt)])
    during_creation = rng.uniform(times["creating"], times["writing"], count // 3)
    anywhere = rng.uniform(0.0, times["done"], count - count // 3)
    return [Case(delay=float(d)) for d in [*anywhere, *during_creation]]


NARROW = {
    "zarr": [
        Case("lock-link"),
        Case("creating"),
        Case("zarr-key", 1),  # the root group's metadata
        Case("zarr-key", 3),  # y's metadata, not its values
        Case("zarr-key", 5),  # y's values, not x's metadata
        Case("zarr-key", 12),  # the data variable's metadata, first of two writes
        Case("created"),
        Case("writing"),
        Case("block", 1),
        Case("block", 9),
        Case("marker", 6),
        Case("finishing"),
        Case("finished"),
        Case("remove"),
        Case("release"),
    ],
    "geotiff": [
        Case("lock-link"),
        Case("creating"),
        Case("geotiff-create"),
        Case("created"),
        Case("writing"),
        Case("block", 1),
        Case("block", 9),
        Case("marker", 6),
        Case("finishing"),
        Case("finished"),
        Case("remove"),
        Case("release"),
    ],
}

#: The narrow windows of the default run (with one random kill): issue 11's creation and
#: record removal, and a block stored without its marker.
DEFAULT = {
    "zarr": [Case("lock-link"), Case("zarr-key", 5), Case("marker", 5), Case("remove")],
    "geotiff": [Case("geotiff-create"), Case("marker", 5)],
}

FORMATS = ["zarr", "geotiff"]


def needs(fmt: str) -> None:
    if fmt == "geotiff":
        pytest.importorskip("rioxarray")


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_uninterrupted_writer_process_writes_the_reference(fmt, timeline):
    needs(fmt)
    # The fixture compares the process's output with this process's, bit for bit.
    times = timeline(fmt)
    # Long enough for random kills to land among the blocks.
    assert times["finishing"] - times["writing"] > 0.2, times


@pytest.mark.parametrize("fmt", FORMATS)
def test_sigkill_then_rerun_completes_exactly(fmt, tmp_path, references, timeline):
    needs(fmt)
    cases = [*random_cases(fmt, timeline(fmt), 1, seed=1), *DEFAULT[fmt]]
    outcomes = run_cases(cases, fmt, tmp_path, references(fmt))
    check_outcomes(outcomes, min_random_completed=1.0)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_sigkill_at_every_window_and_at_random_moments(fmt, tmp_path, references, timeline):
    needs(fmt)
    cases = [*NARROW[fmt], *random_cases(fmt, timeline(fmt), 6, seed=2)]
    assert len(cases) >= 10
    outcomes = run_cases(cases, fmt, tmp_path, references(fmt))
    check_outcomes(outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_reruns_killed_in_turn_still_converge_to_the_output(fmt, tmp_path, references, timeline):
    # Each rerun (a process taking the lock over) is killed too, earlier and earlier.
    needs(fmt)
    path = tmp_path / f"o{SUFFIX[fmt]}"
    reference = references(fmt)
    rng = np.random.default_rng([4, len(fmt)])
    times = timeline(fmt)
    delays = rng.uniform(0.3, 0.6, 3) * times["done"] * np.array([1.0, 0.6, 0.3])
    writers = [Writer(path, fmt) for _ in delays]  # each takes the last one's lock over
    states = []
    try:
        for number, (writer, delay) in enumerate(zip(writers, delays)):
            start = writer.go()
            if number == 0:
                # The first kill lands in the write itself, timed from when the record
                # says so: a delay from the start alone missed it when the writer ran
                # faster than the timeline measured (a noisy machine).
                start = wait_for_state(path, fmt, "writing", writer)
                delay = rng.uniform(0.3, 0.6) * (times["finishing"] - times["writing"])
            time.sleep(max(0.0, start + delay - time.perf_counter()))
            writer.signal(signal.SIGKILL)
            code, _, err = writer.wait()
            assert code in (0, -signal.SIGKILL), err
            states.append(inspect_kill(path, fmt, reference))
    finally:
        for writer in writers:
            writer.stop()
    assert any(state == "writing" for state, _ in states), states
    state, found = states[-1]
    outcome = rerun(path, fmt, state, found)
    check_rerun(path, fmt, outcome, reference)
    assert outcome.rerun in ("written", "exists"), (states, outcome)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_writer_killed_while_taking_a_lock_over_leaves_nothing_in_the_way(
    fmt, tmp_path, references
):
    # One writer killed among its blocks; the next killed just after it claimed and
    # removed that lock, before creating its own; a plain third run finishes, and
    # nothing of the three (lock, claim, temporary copies) stays in the output.
    needs(fmt)
    path = tmp_path / f"o{SUFFIX[fmt]}"
    for options in (["--kill", "marker", "--at", "5"], ["--kill", "takeover"]):
        code, _, err = run_writer(path, fmt, *options)
        assert code == -signal.SIGKILL, f"{options}: the writer exited {code}: {err[-2000:]}"
    claims = list(record_folder(path, fmt).glob("lock.json.takeover-*"))
    assert len(claims) == 1 and not (record_folder(path, fmt) / "lock.json").exists(), claims
    state, found = inspect_kill(path, fmt, references(fmt))
    # The writer's other thread may have its marker in flight: one more or one less.
    assert state == "writing" and 4 <= found <= 6, (state, found)
    outcome = rerun(path, fmt, state, found)
    check_rerun(path, fmt, outcome, references(fmt))
    assert outcome.rerun == "written", outcome


@pytest.mark.parametrize(
    ("fmt", "signum"),
    [
        ("zarr", signal.SIGINT),
        ("geotiff", signal.SIGTERM),
        pytest.param("zarr", signal.SIGTERM, marks=pytest.mark.slow),
        pytest.param("geotiff", signal.SIGINT, marks=pytest.mark.slow),
    ],
)
def test_sigint_and_sigterm_then_rerun_completes_exactly(
    fmt, signum, tmp_path, references, timeline
):
    needs(fmt)
    rng = np.random.default_rng([3, signum, len(fmt)])
    delay = float(rng.uniform(0.0, timeline(fmt)["done"]))
    (outcome,) = run_cases([Case(delay=delay, signum=signum)], fmt, tmp_path, references(fmt))
    assert outcome.signalled, "the writer had finished before the signal"
    assert outcome.rerun in ("written", "exists"), outcome


def concurrent_writers(fmt: str, path: Path, offset: float) -> tuple[dict, dict]:
    """Start writers of models a and b on ``path``, ``offset`` s apart (b first if < 0).

    Returns each model's exit (code, stdout, stderr) and process id.
    """
    writers = {model: Writer(path, fmt, "--model", model) for model in ("a", "b")}
    try:
        first, second = ("a", "b") if offset >= 0 else ("b", "a")
        writers[second].ready()  # both have imported everything before either writes
        writers[first].go()
        time.sleep(abs(offset))
        writers[second].process.stdin.write("go\n")
        writers[second].process.stdin.flush()
        exits = {model: writer.wait() for model, writer in writers.items()}
    finally:
        for writer in writers.values():
            writer.stop()
    return exits, {model: writer.pid for model, writer in writers.items()}


@pytest.mark.parametrize(
    ("fmt", "offset"),
    [
        ("zarr", 0.2),
        pytest.param("geotiff", 0.2, marks=pytest.mark.slow),
        pytest.param("zarr", 0.0, marks=pytest.mark.slow),
        pytest.param("geotiff", 0.005, marks=pytest.mark.slow),
    ],
)
def test_two_concurrent_writers_one_wins_the_other_refuses(fmt, offset, tmp_path, references):
    needs(fmt)
    path = tmp_path / f"o{SUFFIX[fmt]}"

    exits, pids = concurrent_writers(fmt, path, offset)

    winners = [model for model, (code, _, _) in exits.items() if code == 0]
    assert len(winners) == 1, exits
    (winner,) = winners
    (loser,) = set(exits) - {winner}
    code, _, err = exits[loser]
    assert code == crash_writer.REFUSED, err
    message = err.strip().splitlines()[-1]
    assert message.startswith("OutputLockedError: another writer"), message
    assert f"process {pids[winner]}" in message, message
    # The output is the winner's, whole: not one cell of the loser's model.
    assert_same_output(path, fmt, references(fmt, winner))
    assert not record_folder(path, fmt).exists()
