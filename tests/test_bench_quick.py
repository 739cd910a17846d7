"""The quick speed benchmark runs, and no figure misses its target by 10x (a gross regression).

The targets themselves are checked by ``python benchmarks/bench_speed.py`` on a quiet
machine (figures in the issue notes); timing noise on a shared CI machine is far
below 10x, so this fails on a broken kernel, not on a busy neighbour.
"""

from __future__ import annotations

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
