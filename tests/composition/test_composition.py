"""Every layout of xpatch composed with every use, against a numpy reference.

Each feature of xpatch is tested alone elsewhere; this module checks that they
compose. A cell (layout x use, see :mod:`tests.composition.matrix`) passes if its
result equals the reference computed in plain numpy
(:mod:`tests.composition.reference`), or if xpatch refuses it with an
:class:`xpatch.XPatchError` that says why. The run takes a deterministic stratified
sample of the cells (each use on eight layouts that together take every value of
every layout dimension); set ``XPATCH_COMPOSITION=full`` to run every cell (about a
quarter of an hour on two cores).

``KNOWN_FAILING`` lists the sampled cells that fail today, with what they do; they
are strict xfails, so a fix makes the test fail until its entry is removed.
"""

from __future__ import annotations

import os

import pytest

from .matrix import (
    BACKENDS,
    BOUNDARIES,
    HALOS,
    SAMPLERS,
    WINDOWS,
    all_cells,
    run_cell,
    sampled_cells,
)

#: Cells that give wrong values or crash today: cell id -> the observed failure.
KNOWN_FAILING: dict[str, str] = {}

CELLS = all_cells() if os.environ.get("XPATCH_COMPOSITION") == "full" else sampled_cells()


def _param(cell):
    reason = KNOWN_FAILING.get(cell.id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(cell, id=cell.id, marks=marks)


@pytest.mark.parametrize("cell", [_param(c) for c in CELLS])
def test_cell_is_exact_or_refused_with_reason(cell):
    outcome = run_cell(cell)
    assert outcome.status in ("exact", "refused"), f"{outcome.status}: {outcome.reason}"
    if outcome.status == "refused":
        assert len(outcome.reason.split(": ", 1)[-1]) > 20, outcome.reason


def test_sample_meets_every_value_of_every_dimension_in_every_use():
    cells = sampled_cells()
    for use in {c.use for c in all_cells()}:
        mine = [c.layout for c in cells if c.use == use]
        for attr, values in (
            ("boundary", BOUNDARIES),
            ("sampler", SAMPLERS),
            ("halo", HALOS),
            ("window", WINDOWS),
            ("backend", BACKENDS),
        ):
            assert {getattr(layout, attr) for layout in mine} == set(values), (use, attr)


def test_known_failing_names_sampled_cells():
    """An entry of KNOWN_FAILING that names no cell would silently never run."""
    ids = {c.id for c in all_cells()}
    assert not set(KNOWN_FAILING) - ids
