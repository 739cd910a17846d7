"""weights=: per-patch and per-cell weights multiplied into the window, in reconstruct and apply.

Inverse-variance weighting against a brute force, numpy and dask alike (and lazy while
building), weights chunked otherwise than the predictions, zero weights, the refusals
(max/min, negative or non-finite values, shapes that do not fit) and a weighted vote.
"""

from __future__ import annotations

import inspect

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
import xpatch.xarray.reconstruct
from tests.conftest import forbid_compute

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reconstruct(p, pred, reduce="mean", **kwargs):
    """``p.reconstruct(pred, reduce, weights=...)``, through the module if the method lacks it."""
    if "weights" in inspect.signature(p.reconstruct).parameters:
        return p.reconstruct(pred, reduce, **kwargs)
    return xpatch.xarray.reconstruct.reconstruct(p.layout, pred, reduce, **kwargs)


def brute_weighted(pred, weights, anchors, window, grid, reduce="mean"):
    """Σ w·v·x / Σ w·v per cell with a loop over the patches (NaN where Σ w·v is 0)."""
    k = window.ndim
    weights = np.broadcast_to(weights, pred.shape)
    lead = pred.shape[1 : pred.ndim - k]
    num, den = np.zeros((*lead, *grid)), np.zeros((*lead, *grid))
    for i, a in enumerate(anchors):
        cells = (Ellipsis, *(slice(s, s + n) for s, n in zip(a, window.shape)))
        num[cells] += pred[i] * weights[i] * window
        den[cells] += weights[i] * window
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / den if reduce == "mean" else num
    return np.where(den > 0, out, np.nan)


@pytest.fixture
def layout():
    rng = np.random.default_rng(7)
    scene = xr.DataArray(rng.normal(size=(2, 21, 18)), dims=("band", "y", "x"))
    return scene, rng


def test_inverse_variance_mean_equals_the_brute_force(layout):
    scene, rng = layout
    p = scene.chunk({"y": 8, "x": 7}).patch(y=6, x=5, stride=3, window="hann")
    pred = p.patches().compute()
    pred = pred + rng.normal(size=pred.shape)  # patches disagree
    var = xr.DataArray(rng.uniform(0.1, 4.0, (len(p), 6, 5)), dims=("patch", "y", "x"))
    expected = brute_weighted(
        pred.values,
        (1 / var.values)[:, None],
        p.anchors().values,
        p.weights().values,
        (21, 18),
    )
    eager = reconstruct(p, pred, weights=1 / var)
    np.testing.assert_allclose(eager.values, expected, rtol=1e-12)
    assert eager.dims == ("band", "y", "x") and eager.dtype == np.float64
    with forbid_compute():
        lazy = reconstruct(p, pred.chunk(patch=5), weights=(1 / var).chunk(patch=7))
    assert isinstance(lazy.data, dsa.Array)
    np.testing.assert_allclose(lazy.values, eager.values, rtol=1e-12)


def test_per_patch_weights_numpy_and_dataarray(layout):
    scene, rng = layout
    p = scene.patch(y=6, x=5, stride=3, window="triangular")
    pred = p.patches() + rng.normal(size=p.patches().shape)
    w = rng.uniform(0.5, 2.0, len(p))
    a = reconstruct(p, pred, weights=w)
    b = reconstruct(p, pred, weights=xr.DataArray(w, dims="patch"))
    expected = brute_weighted(
        pred.values, w[:, None, None, None], p.anchors().values, p.weights().values, (21, 18)
    )
    np.testing.assert_allclose(a.values, expected, rtol=1e-12)
    np.testing.assert_array_equal(a.values, b.values)
    ones = reconstruct(p, pred, weights=np.ones(len(p)))
    np.testing.assert_allclose(ones.values, p.reconstruct(pred).values, rtol=1e-12)


def test_weighted_sum_and_integer_predictions(layout):
    scene, rng = layout
    p = scene.patch(y=6, x=5, stride=3)
    pred = (p.patches() * 10).astype("int16")
    w = xr.DataArray(rng.uniform(0, 2, (len(p), 2, 1, 1)), dims=("patch", "band", "y", "x"))
    out = reconstruct(p, pred, "sum", weights=w)
    assert out.dtype == np.float64  # float weights: a float sum
    expected = brute_weighted(
        pred.values.astype(float), w.values, p.anchors().values, p.weights().values, (21, 18), "sum"
    )
    np.testing.assert_allclose(out.values, expected, rtol=1e-12)


def test_zero_total_weight_is_nan():
    x = xr.DataArray(np.arange(8.0), dims="x")
    p = x.patch(x=4, stride=2)  # anchors 0, 2, 4
    for data in (x, x.chunk(3)):
        q = data.patch(x=4, stride=2)
        w = np.array([0.0, 1.0, 0.0])  # cells 0, 1 and 6, 7 get no weight
        mean = reconstruct(q, q.patches(), weights=w).values
        np.testing.assert_array_equal(mean, [np.nan, np.nan, 2, 3, 4, 5, np.nan, np.nan])
        total = reconstruct(q, q.patches(), "sum", weights=w).values
        np.testing.assert_array_equal(total, [np.nan, np.nan, 2, 3, 4, 5, np.nan, np.nan])
    assert len(p) == 3


def test_nan_predictions_are_skipped_with_weights():
    x = xr.DataArray(np.arange(6.0), dims="x")
    p = x.patch(x=4, stride=2)
    pred = p.patches().copy()
    pred[0, 3] = np.nan
    out = reconstruct(p, pred, weights=np.array([1.0, 3.0])).values
    np.testing.assert_array_equal(out, x.values)


def test_weights_are_refused_for_max_and_min():
    x = xr.DataArray(np.arange(8.0), dims="x")
    p = x.patch(x=4, stride=2)
    for reduce in ("max", "min"):
        with pytest.raises(xpatch.OptionError, match=f"reduce='{reduce}'.*cannot change"):
            reconstruct(p, p.patches(), reduce, weights=np.ones(len(p)))


@pytest.mark.parametrize("bad", [-1.0, np.inf, np.nan])
def test_bad_weights_are_refused_eagerly_and_by_the_tasks(bad):
    x = xr.DataArray(np.arange(8.0), dims="x")
    w = np.array([1.0, bad, 1.0])
    p = x.patch(x=4, stride=2)
    with pytest.raises(xpatch.PredictionError, match=f"weights hold {bad}.*finite and >= 0"):
        reconstruct(p, p.patches(), weights=w)
    q = x.chunk(4).patch(x=4, stride=2)
    with forbid_compute():
        lazy = reconstruct(q, q.patches(), weights=dsa.from_array(w, chunks=1))
    with pytest.raises(xpatch.PredictionError, match="finite and >= 0"):
        lazy.compute()


def test_weights_that_do_not_fit_are_refused(layout):
    scene, _ = layout
    p = scene.patch(y=6, x=5, stride=3)
    with pytest.raises(xpatch.PredictionError, match="shape \\(3,\\)"):
        reconstruct(p, p.patches(), weights=np.ones(3))
    with pytest.raises(xpatch.PredictionError, match="time"):
        reconstruct(
            p, p.patches(), weights=xr.DataArray(np.ones((len(p), 2)), dims=("patch", "time"))
        )
    with pytest.raises(xpatch.PredictionError, match="real numbers"):
        reconstruct(p, p.patches(), weights=np.full(len(p), "a"))


def test_lazy_weights_make_numpy_predictions_lazy(layout):
    scene, rng = layout
    p = scene.patch(y=6, x=5, stride=3, window="hann")
    pred = p.patches()
    w = rng.uniform(0.5, 2.0, len(p))
    with forbid_compute():
        lazy = reconstruct(p, pred, weights=dsa.from_array(w, chunks=4))
    assert isinstance(lazy.data, dsa.Array)
    np.testing.assert_allclose(lazy.values, reconstruct(p, pred, weights=w).values, rtol=1e-12)


def test_the_weighted_graph_stays_bounded():
    rng = np.random.default_rng(0)
    x = xr.DataArray(rng.normal(size=(64, 64)), dims=("y", "x")).chunk(16)
    p = x.patch(y=8, x=8, stride=4, window="hann")
    pred = p.patches()
    w = xr.DataArray(rng.uniform(0.5, 2, (len(p), 8, 8)), dims=("patch", "y", "x")).chunk(patch=1)
    with forbid_compute():
        weighted = reconstruct(p, pred, weights=w)
        plain = p.reconstruct(pred)
    extra = len(weighted.data.dask) - len(plain.data.dask)
    assert extra <= 2 * w.data.npartitions + 2 * len(p.plan.groups)


def test_weighted_vote_lets_a_confident_patch_win():
    x = xr.DataArray(np.zeros(6), dims="x")
    p = x.patch(x=4, stride=2)  # boxcar: without weights the overlap [2, 4) ties
    pred = p.patches().astype("uint8").copy(data=np.array([[3] * 4, [1] * 4], dtype="uint8"))
    assert p.reconstruct(pred, reduce="vote").values.tolist() == [3, 3, 1, 1, 1, 1]
    out = reconstruct(p, pred, "vote", weights=np.array([2.0, 1.0]))
    assert out.dtype == np.uint8 and out.values.tolist() == [3, 3, 3, 3, 1, 1]
    lazy = reconstruct(p, pred.chunk(patch=1), "vote", weights=np.array([2.0, 1.0]))
    assert lazy.values.tolist() == out.values.tolist()
    # Zero weights still vote for the labels they cover (a tie at 0: the smallest).
    zero = reconstruct(p, pred, "vote", weights=np.array([0.0, 0.0]))
    assert zero.values.tolist() == [3, 3, 1, 1, 1, 1]


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_numpy_and_dask_agree_on_random_layouts(data):
    n_y, n_x = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))
    size = {"y": data.draw(st.integers(1, n_y)), "x": data.draw(st.integers(1, n_x))}
    stride = {d: data.draw(st.integers(1, s)) for d, s in size.items()}
    seed = data.draw(st.integers(0, 2**16))
    per_patch = data.draw(st.booleans())
    rng = np.random.default_rng(seed)
    x = xr.DataArray(rng.normal(size=(n_y, n_x)), dims=("y", "x"))
    chunks = {"y": data.draw(st.integers(1, n_y)), "x": data.draw(st.integers(1, n_x))}
    p = x.chunk(chunks).patch(size, stride=stride, window="hann")
    pred = p.patches().compute()
    pred = pred + rng.normal(size=pred.shape)
    shape = (len(p),) if per_patch else pred.shape
    w = rng.uniform(0, 2, shape) * (rng.random(shape) > 0.2)
    eager = reconstruct(p, pred, weights=w)
    expected = brute_weighted(
        pred.values,
        w.reshape(len(p), *([1, 1] if per_patch else [size["y"], size["x"]])),
        p.anchors().values,
        p.weights().values,
        (n_y, n_x),
    )
    np.testing.assert_allclose(eager.values, expected, rtol=1e-10, atol=1e-12)
    c = data.draw(st.integers(1, len(p)))
    with forbid_compute():
        lazy = reconstruct(p, pred.chunk(patch=c), weights=dsa.from_array(w, chunks=max(1, c - 1)))
    np.testing.assert_allclose(lazy.values, eager.values, rtol=1e-10, atol=1e-12)


# -- apply(weights=...) ---------------------------------------------------------------

OPTIONS = dict(y=6, x=5, stride=3, window="hann")


def noisy_model(batch: np.ndarray) -> dict[str, np.ndarray]:
    """A mean and an inverse variance that differ per patch and per cell."""
    variance = 1.0 + np.abs(np.sin(batch.sum(axis=1)))  # (b, y, x)
    return {"mean": batch + variance[:, None], "w": 1.0 / variance}


def shifted(batch: np.ndarray) -> np.ndarray:
    """Patches that disagree where they overlap: each is shifted by its own mean."""
    return batch * 2 + batch.mean(axis=(1, 2, 3))[:, None, None, None]


@pytest.mark.parametrize("lazy", [False, True])
def test_apply_weights_from_fn_equal_the_brute_force(layout, lazy):
    """weights='w': the weights fn returns per cell weigh the mean as reconstruct's do."""
    scene, _ = layout
    p = (scene.chunk(y=8, x=7) if lazy else scene).patch(**OPTIONS)
    with forbid_compute():
        out = p.apply(noisy_model, output_dims={"mean": None}, weights="w")
    assert list(out.data_vars) == ["mean"]
    result = noisy_model(p.patches().values)
    expected = brute_weighted(
        result["mean"], result["w"][:, None], p.anchors().values, p.weights().values, (21, 18)
    )
    np.testing.assert_allclose(out["mean"].values, expected, rtol=1e-10)
    pred = xr.DataArray(result["mean"], dims=p.patches().dims)
    w = xr.DataArray(result["w"], dims=("patch", "y", "x"))
    np.testing.assert_allclose(out["mean"], reconstruct(p, pred, weights=w), rtol=1e-10)


@pytest.mark.parametrize("lazy", [False, True])
def test_apply_per_patch_weights_given_beforehand(layout, lazy):
    scene, _ = layout
    p = (scene.chunk(y=8, x=7) if lazy else scene).patch(**OPTIONS)
    weights = np.linspace(0.5, 3.0, len(p))
    with forbid_compute():
        out = p.apply(shifted, weights=weights, batch_size=4)
    values = shifted(p.patches().values)
    expected = brute_weighted(
        values, weights[:, None, None, None], p.anchors().values, p.weights().values, (21, 18)
    )
    np.testing.assert_allclose(out.values, expected, rtol=1e-10)
    two = p.apply(lambda b: {"a": shifted(b), "w": np.ones(len(b))}, output_dims={"a": None},
                  weights="w")  # fmt: skip
    np.testing.assert_allclose(two["a"], p.apply(shifted), rtol=1e-10)


def test_apply_weights_are_checked(layout):
    scene, _ = layout
    p = scene.patch(**OPTIONS)
    with pytest.raises(xpatch.OptionError, match=r"weights='w' names an entry .*one output"):
        p.apply(lambda b: b, weights="w")
    with pytest.raises(xpatch.OptionError, match=r"weights='mean' is also declared"):
        p.apply(noisy_model, output_dims={"mean": None}, weights="mean")
    with pytest.raises(xpatch.OptionError, match=rf"shape \(3,\); .*shape \({len(p)},\)"):
        p.apply(lambda b: b, weights=[1.0, 2.0, 3.0])
    with pytest.raises(xpatch.OptionError, match=r"weights= with reduce='max'"):
        p.apply(lambda b: b, weights=np.ones(len(p)), reduce="max")
    with pytest.raises(xpatch.PredictionError, match=r"weights hold -1.0"):
        p.apply(lambda b: b, weights=-np.ones(len(p)))
    with pytest.raises(xpatch.OptionError, match=r"dask array"):
        p.apply(lambda b: b, weights=dsa.ones(len(p)))

    def bad_shape(b):
        return {"mean": b, "w": np.ones((len(b), 2))}

    with pytest.raises(xpatch.PredictionError, match=r"weights 'w' of shape \(\d+, 2\)"):
        p.apply(bad_shape, output_dims={"mean": None}, weights="w")

    def negative(b):
        return {"mean": b, "w": -np.ones(len(b))}

    lazy = scene.chunk(y=8, x=7).patch(**OPTIONS)
    out = lazy.apply(negative, output_dims={"mean": None}, weights="w")  # checked by the tasks
    with pytest.raises(xpatch.PredictionError, match=r"weights hold -1.0"):
        out.compute()


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("weight", [1e-40, 1e-46, 3.5e38])
def test_weights_outside_float32s_range_weigh_float32_predictions_exactly(lazy, weight):
    # Finite and >= 0, they passed the check, then float32 sums rounded them: 1e-40 everywhere
    # gave errors of 0.07, 1e-46 all NaN, 3.5e38 inf.
    values = np.random.default_rng(5).random((24, 30), dtype=np.float32)
    da = xr.DataArray(values, dims=("y", "x"))
    p = (da.chunk(10) if lazy else da).patch(y=8, x=10, stride={"y": 4, "x": 5}, window="hann")
    pred = p.patches()
    weights = np.full(len(p), weight)
    got = p.reconstruct(pred, weights=weights).compute()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.values, values, rtol=2e-6)
    applied = p.apply(lambda b: b, weights=weights).compute()
    np.testing.assert_allclose(applied.values, values, rtol=2e-6)
    if weight > 1:  # Σ w·x past float32's range: refused, not inf
        with pytest.raises(xpatch.PredictionError, match="past the range of float32"):
            p.reconstruct(pred, reduce="sum", weights=weights).compute()
