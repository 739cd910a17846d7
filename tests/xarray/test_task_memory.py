"""apply's memory budget per task (``task_memory=``): smaller working blocks, same values."""

from __future__ import annotations

import tracemalloc

import dask
import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.apply import InferenceSetup, Output
from xpatch.core.apply.memory import CONFIG_KEY, task_bytes, working_plans
from xpatch.core.blend.reductions import as_reduction


def bands(n: int = 256, chunk: int = 128, seed: int = 0) -> xr.DataArray:
    """A lazy ``(4, n, n)`` float32 image in ``chunk``² chunks."""
    data = dsa.random.default_rng(seed).random((4, n, n), dtype="float32", chunks=(4, chunk, chunk))
    return xr.DataArray(data, dims=("band", "y", "x"))


def double(batch: np.ndarray) -> np.ndarray:
    return batch * 2


def traced_peak_of_write(result: xr.DataArray, path) -> int:
    """Peak of the bytes Python and numpy hold while ``result`` is written, one thread."""
    tracemalloc.start()
    try:
        with dask.config.set(scheduler="synchronous"):
            xpatch.write(result, path, progress=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_budget_lowers_the_peak_of_a_write_and_keeps_its_values(tmp_path):
    """The issue's case in small: large chunks, one task per chunk held it all at once."""
    p = bands(1024, 512).patch(y=64, x=64, stride=48, window="hann")
    whole = p.apply(double, task_memory="1GiB")
    budgeted = p.apply(double, task_memory="4MiB")
    assert whole.chunks[1:] == ((512, 512), (512, 512))
    assert max(budgeted.chunks[1]) * max(budgeted.chunks[2]) <= 256 * 256
    peak_whole = traced_peak_of_write(whole, tmp_path / "whole.zarr")
    peak_budgeted = traced_peak_of_write(budgeted, tmp_path / "budgeted.zarr")
    assert peak_budgeted < 0.5 * peak_whole, (peak_budgeted, peak_whole)
    written = [xr.open_zarr(tmp_path / f"{n}.zarr") for n in ("whole", "budgeted")]
    written = [ds[next(iter(ds.data_vars))].values for ds in written]
    np.testing.assert_allclose(written[1], written[0], rtol=1e-6)


def test_building_with_a_budget_computes_nothing():
    p = bands().patch(y=32, x=32, stride=24)
    with forbid_compute():
        out = p.apply(double, task_memory="256KiB")
    assert len(out.chunks[1]) > 2  # the budget did split the 128² chunks


def test_the_dask_config_sets_the_default_budget_and_the_argument_wins():
    p = bands().patch(y=32, x=32, stride=24)
    assert p.apply(double).chunks[1:] == ((128, 128), (128, 128))
    with dask.config.set({CONFIG_KEY: "256KiB"}):
        configured = p.apply(double)
        given_budget = p.apply(double, task_memory="1GiB")
    assert len(configured.chunks[1]) > 2
    assert given_budget.chunks[1:] == ((128, 128), (128, 128))


@pytest.mark.parametrize("bad", ["lots", -1, 0, 1.5, True, [1], float("inf"), float("nan")])
def test_a_budget_that_is_not_a_size_is_refused_naming_it(bad):
    p = bands().patch(y=32, x=32)
    with pytest.raises(xpatch.OptionError, match=r"task_memory=.*'256MiB'"):
        p.apply(double, task_memory=bad)


def test_a_bad_budget_in_the_dask_config_is_named_as_such():
    p = bands().patch(y=32, x=32)
    with dask.config.set({CONFIG_KEY: "plenty"}):
        with pytest.raises(xpatch.OptionError, match=r"dask config 'xpatch\.task-memory'"):
            p.apply(double)


def plans_for(da: xr.DataArray, patch: int, stride: int, budget: int, batch: int = 64):
    p = da.patch(y=patch, x=patch, stride=stride, window="hann")
    plan = p.plan
    inference = InferenceSetup(
        double, batch, {None: Output((4,), np.dtype("f4"))}, None, as_reduction("sum").blend
    )
    accs = {None: np.dtype("f4")}
    fine, _ = working_plans(da.shape, 4, plan, inference, plan, accs, budget)
    return plan, fine, task_bytes(da.shape, 4, fine, inference, fine, accs)


@pytest.mark.parametrize("budget", [2**16, 2**18, 2**20, 2**22])
def test_working_blocks_fit_the_budget_or_are_a_patch_long(budget):
    plan, fine, estimate = plans_for(bands(256, 128), 16, 12, budget)
    assert sorted(fine.anchors.tolist()) == sorted(plan.anchors.tolist())
    blocks = [max(c) for c in fine.grid.chunks]
    # Halving a block shorter than two patches would only add overhang.
    assert estimate.total <= budget or all(b < 2 * 16 for b in blocks)
    assert min(min(c) for c in fine.grid.chunks) >= 16


@settings(max_examples=25, deadline=None)
@given(
    ny=st.integers(20, 70),
    nx=st.integers(20, 70),
    chunk=st.integers(12, 40),
    patch=st.integers(3, 12),
    step=st.integers(1, 12),
    budget=st.integers(2**10, 2**14),
    boundary=st.sampled_from(["shift", "pad"]),
    window=st.sampled_from(["boxcar", "hann"]),
    reduce=st.sampled_from(["mean", "max", "sum"]),
)
def test_any_budget_gives_the_values_of_numpy_input(
    ny, nx, chunk, patch, step, budget, boundary, window, reduce
):
    stride = min(step, patch)
    values = np.random.default_rng(ny * nx).random((2, ny, nx))
    eager_input = xr.DataArray(values, dims=("band", "y", "x"))
    options = dict(y=patch, x=patch, stride=stride, boundary=boundary, window=window)

    def fn(batch):
        return batch * 3 - 1

    eager = eager_input.patch(**options).apply(fn, batch_size=5, reduce=reduce)
    lazy = eager_input.chunk(y=chunk, x=chunk).patch(**options)
    budgeted = lazy.apply(fn, batch_size=5, reduce=reduce, task_memory=budget)
    with dask.config.set(scheduler="synchronous"):
        got = budgeted.values
    np.testing.assert_allclose(got, eager.values, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_weights_scale_and_dict_outputs_follow_their_patches_into_working_blocks():
    values = np.random.default_rng(1).random((1, 96, 80))
    da = xr.DataArray(values, dims=("band", "y", "x"))
    options = dict(y=16, x=16, stride=8, window="hann")
    lazy = da.chunk(y=48, x=40).patch(**options)

    def weights_of(patcher):  # per patch, in the patcher's order (chunk order when lazy)
        y, x = patcher.anchors().values.T
        return 0.5 + (y * 7 + x * 3) % 11

    def up(batch):  # a model returning patches at twice the resolution
        return np.repeat(np.repeat(batch, 2, axis=-1), 2, axis=-2) * np.arange(1, 33)

    eager_patcher = da.patch(**options)
    keywords = dict(scale={"y": 2, "x": 2}, dtype="float64")
    eager = eager_patcher.apply(up, weights=weights_of(eager_patcher), **keywords)
    budgeted = lazy.apply(up, task_memory="64KiB", weights=weights_of(lazy), **keywords)
    assert len(budgeted.chunks[1]) > 2
    np.testing.assert_allclose(budgeted.values, eager.values, rtol=1e-12)

    def two(batch):
        return {"neg": -batch, "rows": batch * np.arange(16)[:, None]}

    declared = dict(output_dims={"neg": None, "rows": None}, dtype="float64")
    several = lazy.apply(two, task_memory="64KiB", weights=weights_of(lazy), **declared)
    assert len(several["neg"].chunks[1]) > 2
    reference = eager_patcher.apply(two, weights=weights_of(eager_patcher), **declared)
    for name in ("neg", "rows"):
        np.testing.assert_allclose(several[name].values, reference[name].values, rtol=1e-12)


def test_scenes_and_trees_pass_the_budget_on():
    image = bands(256, 128).rename("v")
    scenes = xpatch.patch_scenes([image, image], y=32, x=32, stride=24)
    out = scenes.apply(double, task_memory="256KiB")
    assert all(len(r.chunks[1]) > 2 for r in out.values())
    tree = xr.DataTree.from_dict({"/a": image.to_dataset()})
    applied = tree.patch(y=32, x=32, stride=24).apply(double, task_memory="256KiB")
    assert len(applied["/a"]["v"].chunks[1]) > 2


def test_working_blocks_at_a_scale_below_one_stay_regular_chunks_for_zarr(tmp_path):
    """Blocks are multiples of the scale's denominator: scaled, they are whole and regular."""
    p = bands(200, 200).patch(y=20, x=20, stride=20)

    def quarter(batch):
        return batch[..., ::4, ::4]

    out = p.apply(quarter, scale=0.25, task_memory=60_000, dtype="float32")
    assert len(out.chunks[1]) > 2
    assert len(set(out.chunks[1][:-1])) == 1 and out.chunks[1][-1] <= out.chunks[1][0]
    assert xpatch.write(out, tmp_path / "q.zarr", progress=False) > 0
    values = bands(200, 200).values[..., ::4, ::4]
    stored = xr.open_zarr(tmp_path / "q.zarr")
    np.testing.assert_allclose(stored[next(iter(stored.data_vars))].values, values)
