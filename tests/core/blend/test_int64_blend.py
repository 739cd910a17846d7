"""Integer blends are exact or refused: never an int64 that looks exact and is rounded."""

import numpy as np
import pytest
import xarray as xr

import xpatch
from xpatch.core.blend.dtypes import check_rounds_exactly, most_covering

STAMP = 1_700_000_000_000_000  # microseconds since 1970: ~1.7e15, between 2**50 and 2**53


def hann_mean_reference(values: np.ndarray, size: int, stride: int) -> np.ndarray:
    """Σ w·x / Σ w with a hann window, in exact rational arithmetic (Python ints and floats)."""
    from fractions import Fraction

    w = np.hanning(size + 2)[1:-1]  # any positive window: the mean of equal values is them
    w2 = np.multiply.outer(w, w)
    num = np.zeros(values.shape, dtype=object)
    den = np.zeros(values.shape, dtype=object)
    n = values.shape[0]
    for a in range(0, n - size + 1, stride):
        for b in range(0, n - size + 1, stride):
            for i in range(size):
                for j in range(size):
                    f = Fraction(float(w2[i, j]))
                    num[a + i, b + j] += f * int(values[a + i, b + j])
                    den[a + i, b + j] += f
    return num / den


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_a_hann_mean_of_large_int64_is_float64_not_a_rounded_int64(lazy):
    # Microsecond timestamps through a hann mean came back as int64 off by 1-2 in 36 of
    # 4,096 cells: a weighted mean of such values in float64 is not exact.
    rng = np.random.default_rng(0)
    values = STAMP + rng.integers(0, 10**6, size=(16, 16))
    obj = xr.DataArray(values, dims=("y", "x"))
    p = (obj.chunk(8) if lazy else obj).patch(y=8, x=8, stride=4, window="hann")
    out = p.apply(lambda b: b).compute()
    assert out.dtype == np.float64  # a float says it is not exact
    reference = hann_mean_reference(values, 8, 4)  # every patch returns the input: exactly it
    assert (reference == values).all()
    np.testing.assert_allclose(out.values, values.astype(float), rtol=0, atol=4)
    with pytest.raises(xpatch.PredictionError, match=r"out_dtype='int64'.*past 2\*\*53"):
        p.apply(lambda b: b, out_dtype="int64").compute()


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_a_boxcar_mean_past_2_53_stored_as_int64_is_refused(lazy):
    # 2**53 + 1 came back as 2**53 in an int64 through out_dtype="int64".
    values = np.full((8, 8), 2**53 + 1, dtype=np.int64)
    obj = xr.DataArray(values, dims=("y", "x"))
    p = (obj.chunk(4) if lazy else obj).patch(y=4, x=4, stride=2)
    for out_dtype in ("int64", None):
        with pytest.raises(xpatch.PredictionError, match=r"past 2\*\*53.*offset"):
            p.apply(lambda b: b, out_dtype=out_dtype).compute()
    # The reductions that pick one value stay exact.
    assert (p.apply(lambda b: b, reduce="max").values == values).all()


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_integer_means_within_floats_reach_stay_integers_and_exact(lazy):
    values = (np.arange(256, dtype=np.int64) * 1_000_003).reshape(16, 16)  # ~2.6e8
    obj = xr.DataArray(values, dims=("y", "x"))
    p = (obj.chunk(8) if lazy else obj).patch(y=8, x=8, stride=4)
    out = p.apply(lambda b: b).compute()
    assert out.dtype == np.int64 and (out.values == values).all()
    small = xr.DataArray(values.astype(np.uint32), dims=("y", "x"))
    hann = (small.chunk(8) if lazy else small).patch(y=8, x=8, stride=4, window="hann")
    kept = hann.apply(lambda b: b).compute()
    assert kept.dtype == np.uint32 and (kept.values == values).all()


def test_the_rounding_check_counts_the_overlaps():
    assert most_covering(np.array([[0, 0], [0, 2], [2, 0], [2, 2]]), [4, 4], [6, 6]) == 4
    assert most_covering(np.array([[0], [1], [2]]), [3], [5]) == 3
    fine = np.array([2.0**40, -(2.0**40), np.nan])
    assert check_rounds_exactly(fine, 4, np.dtype("int64"), "x") is fine
    with pytest.raises(xpatch.PredictionError, match=r"out_dtype='uint64'.*reaches"):
        check_rounds_exactly(np.array([2.0**50]), 4, np.dtype("uint64"), "out_dtype='uint64'")
