"""The quick speed benchmark runs, and no figure misses its target by 10x (a gross regression).

The targets themselves are checked by ``python benchmarks/bench_speed.py`` on a quiet
machine (figures in the issue notes); timing noise on a shared CI machine is far
below 10x, so this fails on a broken kernel, not on a busy neighbour.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_speed.py"


@pytest.mark.slow
def test_quick_speed_benchmark_has_no_gross_regression():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--check"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gross regressions (10x): none" in done.stdout
    assert "targets met" in done.stdout


PEERS = BENCH.parent / "bench_peers.py"


@pytest.mark.slow
def test_quick_peers_benchmark_runs_floor_and_xpatch_reading_each_chunk_once(tmp_path):
    # Only this interpreter's variants (no Python 3.12 venv) and the local folder: the
    # table, the floor's ratio and xpatch's own load counter must come out of the children.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(BENCH.parents[1]), *filter(None, [env.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, str(PEERS), "--quick", "--storage", "local", "--data", str(tmp_path),
         "--variants", "floor-obstore,floor-default,xpatch-16"],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("## "):
            table = line[3:].split(":")[0]
        cells = line.split()
        if cells and cells[0] in ("floor-obstore", "floor-default", "xpatch-16"):
            rows[table, cells[0]] = cells
    cases = ("era5, local", "straddle, local")
    assert sorted({table for table, _ in rows}) == sorted(cases), done.stdout
    for case in cases:
        # variant, open ("0.01 s"), epoch ("0.65 s"), range, ratio, peak RSS, loads per chunk.
        assert rows[case, "floor-obstore"][6] == "1.00x"
        assert float(rows[case, "xpatch-16"][3]) > 0
        # A sweep reads each chunk once.
        assert float(rows[case, "xpatch-16"][-1]) <= 1.05, done.stdout
        assert float(rows[case, "xpatch-16"][-2]) > 0
