from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr

import xpatch
from xpatch.core.windows import make_window, window_1d

WINDOWS = [
    "boxcar",
    "hann",
    "triangular",
    "tukey",
    ("tukey", 0.2),
    ("gaussian", 3.0),
    "hamming",
    "blackman",
    "bartlett",
    "bohman",
    ("kaiser", 8.0),
]


@pytest.mark.parametrize("spec", WINDOWS, ids=str)
@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_every_window_is_strictly_positive_and_finite(spec, n):
    w = window_1d(spec, n)
    assert w.shape == (n,)
    assert np.isfinite(w).all()
    assert (w > 0).all()


@pytest.mark.parametrize("spec", ["hann", "triangular"])
def test_half_sample_windows_sum_to_a_constant_at_50_percent_overlap(spec):
    w = window_1d(spec, 16)
    np.testing.assert_allclose(w[:8] + w[8:], 1.0)


def test_hann_is_symmetric_and_peaks_in_the_middle():
    w = window_1d("hann", 9)
    np.testing.assert_allclose(w, w[::-1])
    assert w.argmax() == 4


def test_separable_nd_window_is_the_outer_product():
    w = make_window({"y": "hann", "x": "triangular"}, ["y", "x"], [4, 6])
    np.testing.assert_allclose(w, np.outer(window_1d("hann", 4), window_1d("triangular", 6)))
    assert make_window("hann", ["t", "y", "x"], [2, 3, 4]).shape == (2, 3, 4)


def test_user_array_window_is_used_as_given():
    da = xr.DataArray(np.random.default_rng(0).random((10, 10)), dims=("y", "x"))
    user = np.linspace(1, 2, 16).reshape(4, 4)
    p = da.patch(y=4, x=4, stride=2, window=user)
    np.testing.assert_array_equal(p.weights().values, user)
    np.testing.assert_allclose(p.reconstruct(p.patches()), da)


def test_a_window_array_the_caller_changes_afterwards_changes_nothing():
    da = xr.DataArray(np.random.default_rng(0).random((40, 40)), dims=("y", "x")).chunk(20)
    user = 1 + np.add.outer(np.arange(8.0), 2 * np.arange(8.0)) / 10  # not symmetric
    p = da.patch(y=8, x=8, stride=4, window=user)
    lazy = p.apply(lambda b: b * 2 + b.mean(axis=(1, 2), keepdims=True))
    expected = lazy.compute().values
    user[:] = user.T  # the caller reuses their array
    np.testing.assert_array_equal(lazy.compute().values, expected)  # the built graph
    np.testing.assert_array_equal(p.weights().values, user.T)
    # The same values in Fortran order name the same graphs: their hash reads memory.
    again = da.patch(y=8, x=8, stride=4, window=np.asfortranarray(user.T))
    assert again.reconstruct(again.patches()).data.name == p.reconstruct(p.patches()).data.name


@pytest.mark.parametrize(
    ("window", "match"),
    [
        ("no-such-window", r"window='no-such-window' is not a window xpatch knows.*'hann'"),
        ("gaussian", r"Gaussian window needs its width"),
        (("tukey", 2.0), r"alpha must lie in \[0, 1\]"),
        ("flattop", r"negative.*np.maximum"),
        (np.zeros((4, 4)), r"zero, negative or non-finite.*np.maximum"),
        (np.ones((3, 4)), r"shape \(3, 4\).*patch shape \(4, 4\)"),
        ({"t": "hann"}, r"names dimension\(s\) \['t'\] that are not patched"),
    ],
)
def test_bad_windows_raise_option_errors_that_name_the_fix(window, match):
    da = xr.DataArray(np.zeros((8, 8)), dims=("y", "x"))
    with pytest.raises(xpatch.OptionError, match=match):
        da.patch(y=4, x=4, window=window)


@pytest.mark.parametrize("size", [(1, 45), (45, 1), (9, 45)])
def test_factors_of_a_window_with_tiny_corners_fit_float32(size):
    """A gaussian's corner is 1e-47 at 45 cells: factors taken through the corner reach
    5e46 (inf in float32), and the sum of an apply came out NaN at its edges."""
    from xpatch.core.windows import separable_factors

    window = make_window(("gaussian", 1.5), ("y", "x"), size)
    factors = separable_factors(window)
    assert factors is not None
    assert all(np.isfinite(f.astype(np.float32)).all() for f in factors)
    np.testing.assert_allclose(np.multiply.outer(*factors), window, rtol=1e-12)
    da = xr.DataArray(np.arange(90, dtype="float32").reshape(2, 45), dims=("y", "x"))
    p = da.patch(y=1, x=45, stride=1, window=("gaussian", 1.5))
    summed = p.apply(lambda b: b + 1, reduce="sum")
    assert not np.isnan(summed.values).any()
    assert summed.values[0, 22] == 23.0  # the peak's weight is 1


def test_factors_turn_to_the_largest_cell_where_the_first_makes_them_inexact():
    """A first cell of 1e-320 (subnormal) divides to factors that rebuild the window
    only roughly: the lines through the largest cell rebuild it exactly."""
    from xpatch.core.windows import separable_factors

    window = np.multiply.outer(np.array([1e-310, 1.0]), np.array([1e-10, 1.0]))
    factors = separable_factors(window)
    assert factors is not None
    np.testing.assert_allclose(np.multiply.outer(*factors), window, rtol=1e-12)
    whole = np.multiply.outer([1.0, 2.0], [1.0, 3.0])  # a whole first cell keeps whole factors
    assert [f.tolist() for f in separable_factors(whole)] == [[1.0, 2.0], [1.0, 3.0]]


def test_a_patch_too_large_for_memory_is_refused_before_anything_is_allocated():
    # y=x=10**9 asked numpy for 7 GiB windows, then exabytes: the kernel killed the
    # process at 23 GB. In a child limited to 3 GiB of address space, the refusal
    # must come before any of it.
    import subprocess
    import sys

    # The limit is set inside the child (not by preexec_fn, which forks a process whose
    # threads, JAX's among them, may hold locks).
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))\n"
        "import numpy as np, xarray as xr, xpatch\n"
        "da = xr.DataArray(np.zeros((10, 10)), dims=('y', 'x'))\n"
        "try:\n"
        "    da.patch(y=10**9, x=10**9, boundary='pad')\n"
        "except xpatch.GeometryError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    message = result.stdout
    assert "size (y: 1000000000, x: 1000000000) is 1e+18 cells a patch" in message, message
    assert "GiB (float64), over half of this machine's" in message, message
