"""``apply`` blending each batch as ``fn`` returns it (xpatch/core/batch_blend.py).

Large 2-D patches on a regular grid take this path: eagerly with numba's kernel
(where numba is installed), and in dask tasks with its numpy twin, which must give
the same bits and never load numba. The path must give the brute-force reference
(NaN skipped, borders included), the same values eagerly and lazily, the same bits
with and without its second thread, and it must stop cleanly when ``fn`` or a cut
fails.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import weakref
from unittest import mock

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch  # noqa: F401 (registers .patch)
from tests.core.blend.test_kernels import reference
from xpatch.core import extract
from xpatch.core.apply import eager as apply_module
from xpatch.core.apply import lazy as lazy_module
from xpatch.core.blend import batch_blend, compiled, lattice
from xpatch.core.windows import BlendWindow

pytestmark = pytest.mark.filterwarnings("ignore::xpatch.UncoveredCellsWarning")  # gaps on purpose
#: The eager path blends batch by batch with numba's kernel (whole groups without it).
needs_numba = pytest.mark.skipif(not compiled.AVAILABLE, reason="the eager path needs numba")


def anchors_of(p) -> np.ndarray:
    return p.anchors().values  # (patch, dim), dims in the order of p.dims


def recording_add(note, seen: list):
    """A BatchBlend.add that first appends ``note(blend, anchors)`` to ``seen``."""
    original = batch_blend.BatchBlend.add

    def add(self, anchors, values):
        seen.append(note(self, anchors))
        return original(self, anchors, values)

    return add


def counting_adds(monkeypatch) -> list[int]:
    """Record the patch count of every BatchBlend.add (so a test knows the path ran)."""
    sizes: list[int] = []
    monkeypatch.setattr(batch_blend.BatchBlend, "add", recording_add(lambda b, a: len(a), sizes))
    return sizes


@st.composite
def layouts(draw):
    size = [draw(st.integers(64, 80)), draw(st.integers(64, 80))]
    stride = [draw(st.integers(s // 2, s + 8)) for s in size]
    grid = [s + draw(st.integers(0, 120)) for s in size]
    boundary = draw(st.sampled_from(["shift", "pad"]))
    bands = draw(st.integers(1, 2))
    batch = draw(st.integers(1, 7))
    window = draw(st.sampled_from(["boxcar", "hann", ("gaussian", 12.0)]))
    reduce = draw(st.sampled_from(["mean", "sum"]))
    nan_patches = draw(st.lists(st.integers(0, 40), max_size=3))
    seed = draw(st.integers(0, 2**16))
    return size, stride, grid, boundary, bands, batch, window, reduce, nan_patches, seed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_batch_blending_equals_the_reference_eagerly_and_lazily(case):
    size, stride, grid, boundary, bands, batch, window, reduce, nan_patches, seed = case
    rng = np.random.default_rng(seed)
    values = rng.random((bands, *grid)).astype("float32")
    da = xr.DataArray(values, dims=("band", "y", "x"))
    p = da.patch(y=size[0], x=size[1], stride=dict(zip(("y", "x"), stride)),
                 boundary=boundary, window=window)  # fmt: skip
    anchors = anchors_of(p)
    poisoned = {i % len(anchors) for i in nan_patches}

    def fn(b: np.ndarray) -> np.ndarray:
        # NaN where the patch's top-left value marks it as poisoned: fn sees patches
        # only, so the mark is in the data (each patch's corner is its anchor's cell).
        out = np.sqrt(np.abs(b)) + 1
        corners = b[:, 0, 0, 0]
        for i in poisoned:
            y, x = anchors[i]
            if 0 <= y < grid[0] and 0 <= x < grid[1]:
                out[corners == values[0, y, x], :, : size[0] // 2] = np.nan
        return out

    kernels: list[str] = []
    add = recording_add(lambda blend, anchors: blend.kernel, kernels)
    with mock.patch.object(batch_blend.BatchBlend, "add", add):
        lazy = da.chunk({"y": 50, "x": 70}).patch(
            y=size[0], x=size[1], stride=dict(zip(("y", "x"), stride)), boundary=boundary,
            window=window,
        ).apply(fn, batch_size=batch, reduce=reduce).values  # fmt: skip
        # Dask tasks blend batch by batch with numpy, with or without numba.
        assert kernels and set(kernels) == {"numpy"}
        kernels.clear()
        eager = p.apply(fn, batch_size=batch, reduce=reduce).values
    if compiled.AVAILABLE:  # the eager path, numba's kernel, batch by batch
        assert kernels == ["compiled"] * -(-len(p) // batch)
    np.testing.assert_allclose(eager, lazy, rtol=2e-5, atol=1e-6, equal_nan=True)
    if boundary == "shift":  # every patch inside: the reference slices them directly
        predictions = fn(p.patches().transpose("patch", "band", "y", "x").values)
        expected = reference(predictions, anchors, grid, p.blend_window.values, reduce)
        np.testing.assert_allclose(lazy, expected, rtol=2e-5, atol=1e-6, equal_nan=True)
        np.testing.assert_allclose(eager, expected, rtol=2e-5, atol=1e-6, equal_nan=True)


@needs_numba
def test_the_path_is_taken_batch_by_batch_and_nan_is_skipped_not_spread(monkeypatch):
    sizes = counting_adds(monkeypatch)
    values = np.random.default_rng(1).random((1, 200, 200)).astype("float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, stride=48, window="hann")
    calls = []

    def fn(b):
        calls.append(len(b))
        out = b * 2
        if len(calls) == 3:  # the third batch: one patch all NaN, one half NaN
            out[0] = np.nan
            out[1, :, :32] = np.nan
        return out

    declared = {"output_dims": {"band": 1}, "dtype": "float32"}  # fn is not called to find them
    got = p.apply(fn, batch_size=4, **declared).values
    assert sizes == calls and sum(sizes) == len(p)  # one add per batch, each patch once
    predictions = (p.patches().transpose("patch", "band", "y", "x").values * 2).astype("f4")
    predictions[8] = np.nan
    predictions[9, :, :32] = np.nan
    expected = reference(predictions, anchors_of(p), [200, 200], p.blend_window.values, "mean")
    np.testing.assert_allclose(got, expected, rtol=1e-5, equal_nan=True)
    # Not spread: only cells that no valid positive weight reaches (hann's edges) are
    # NaN, fewer than the all-NaN patch's 64 x 64.
    assert 0 < np.isnan(got).sum() == np.isnan(expected).sum() < 64 * 64


@needs_numba
def test_cells_only_nan_reaches_are_nan(monkeypatch):
    sizes = counting_adds(monkeypatch)
    values = np.ones((1, 128, 192), dtype="float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, window="boxcar")
    got = p.apply(lambda b: np.where(np.arange(len(b))[:, None, None, None] == 1, np.nan, b),
                  batch_size=2).values  # fmt: skip
    expected = np.ones_like(values)
    # The second patch of each batch of 2: patches 1, 3 and 5 of the 2 x 3 grid.
    expected[:, :64, 64:128] = np.nan
    expected[:, 64:, :64] = np.nan
    expected[:, 64:, 128:] = np.nan
    np.testing.assert_array_equal(got, expected)
    assert sizes == [2, 2, 2]


@needs_numba
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_the_second_thread_changes_no_bit(monkeypatch, reduce):
    values = np.random.default_rng(2).random((2, 333, 301)).astype("float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(
        y=96, x=80, stride={"y": 70, "x": 50}, boundary="pad", window=("gaussian", 20.0)
    )
    fn = lambda b: np.sin(b) * 3  # noqa: E731
    monkeypatch.setattr(apply_module, "worker_count", lambda: 2)
    threaded = p.apply(fn, batch_size=5, reduce=reduce).values
    monkeypatch.setattr(apply_module, "worker_count", lambda: 1)
    alone = p.apply(fn, batch_size=5, reduce=reduce).values
    np.testing.assert_array_equal(threaded, alone)
    lazy = xr.DataArray(dsa.from_array(values, chunks=(2, 333, 301)), dims=("band", "y", "x"))
    lazy = lazy.patch(y=96, x=80, stride={"y": 70, "x": 50}, boundary="pad",
                      window=("gaussian", 20.0))  # fmt: skip
    np.testing.assert_allclose(threaded, lazy.apply(fn, batch_size=5, reduce=reduce).values,
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@needs_numba
def test_fn_is_called_on_the_callers_thread_in_order(monkeypatch):
    monkeypatch.setattr(apply_module, "worker_count", lambda: 2)
    values = np.arange(256 * 256, dtype="float32").reshape(1, 256, 256)
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, stride=32)
    seen = []

    def fn(b):
        seen.append((threading.current_thread(), b[:, 0, 0, 0].tolist()))
        return b

    declared = {"output_dims": {"band": 1}, "dtype": "float32"}  # fn is not called to find them
    np.testing.assert_allclose(p.apply(fn, batch_size=6, **declared).values, values)
    assert {thread for thread, _ in seen} == {threading.current_thread()}
    corners = [c for _, batch in seen for c in batch]
    assert corners == [values[0, y, x] for y, x in anchors_of(p)]


@needs_numba
def test_a_failing_fn_stops_the_run_and_leaves_no_thread(monkeypatch):
    monkeypatch.setattr(apply_module, "worker_count", lambda: 2)
    values = np.random.default_rng(3).random((1, 256, 256)).astype("float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, stride=32)
    calls = []

    def fn(b):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("model failed")
        return b

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="model failed"):
        p.apply(fn, batch_size=5)
    assert len(calls) == 4
    assert threading.active_count() == before


@needs_numba
def test_a_failing_blend_is_raised_on_the_callers_thread(monkeypatch):
    monkeypatch.setattr(apply_module, "worker_count", lambda: 2)

    def fail(self, anchors, values):
        raise MemoryError("blend failed")

    monkeypatch.setattr(batch_blend.BatchBlend, "add", fail)
    values = np.random.default_rng(3).random((1, 256, 256)).astype("float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, stride=32)
    with pytest.raises(MemoryError, match="blend failed"):
        p.apply(lambda b: b, batch_size=5)


def test_a_shared_cut_raises_the_helpers_error_and_cuts_each_patch_once():
    cut = []
    lock = threading.Lock()

    def copy(i):
        with lock:
            cut.append(i)

    shared = batch_blend.SharedCut(50, copy)
    helper = threading.Thread(target=shared.help)
    helper.start()
    shared.run()
    helper.join()
    assert sorted(cut) == list(range(50))

    def fail_late(i):
        if i == 49:
            raise OSError("copy failed")

    shared = batch_blend.SharedCut(50, fail_late)
    shared.help()  # the helper takes patch 49 first and fails
    with pytest.raises(OSError, match="copy failed"):
        shared.run()


@st.composite
def piece_layouts(draw):
    """Nested pieces as a group task gets them: blocks cut by crops, some as Strips."""
    bands = draw(st.integers(1, 2))
    heights = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    widths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    crops = [[slice(None)], [], []]
    rows = []
    for h in heights:
        row = []
        for w in widths:
            pad = draw(st.integers(0, 2)), draw(st.integers(0, 2))  # cells crops drop
            block = rng.random((bands, h + pad[0], w + pad[1]))
            row.append(extract.Strip(block[:, :h, :w].copy()) if draw(st.booleans()) else block)
        rows.append(row)
    # A block's crop keeps its first h x w cells (Strips are cut already).
    crops[1] = [slice(0, h) for h in heights]
    crops[2] = [slice(0, w) for w in widths]
    size = [draw(st.integers(1, sum(heights))), draw(st.integers(1, sum(widths)))]
    count = draw(st.integers(1, 6))
    anchors = np.stack([rng.integers(0, sum(heights) - size[0] + 2, count),
                        rng.integers(0, sum(widths) - size[1] + 2, count)], 1)  # fmt: skip
    return [rows], crops, anchors, size


@settings(max_examples=200, deadline=None)
@given(piece_layouts())
def test_cutting_from_the_pieces_equals_cutting_from_their_join(layout):
    nested, crops, anchors, size = layout
    got = extract.cut_from_pieces(nested, crops, [1, 2], anchors, size)
    joined = extract.join_blocks(nested, crops)
    if (anchors + size > joined.shape[1:]).any():  # past the pieces: the join pads
        assert got is None
        return
    np.testing.assert_array_equal(got, extract.extract_numpy(joined, [1, 2], anchors, size))


@st.composite
def kernel_cases(draw):
    """Batches of a 2-D lattice's patches, in any order, of any dtype the kernel reads."""
    size = [draw(st.integers(1, 12)), draw(st.integers(1, 12))]
    stride = [draw(st.integers(1, s + 3)) for s in size]
    counts = [draw(st.integers(1, 5)), draw(st.integers(1, 5))]
    origin = [draw(st.integers(-4, 4)), draw(st.integers(-4, 4))]
    box_shape = [draw(st.integers(1, 40)), draw(st.integers(1, 40))]
    lead = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    integers = [f"{kind}{size}" for kind in "iu" for size in (1, 2, 4, 8)]
    values = draw(st.sampled_from(["f4", "f8", "?", *integers]))
    sums = draw(st.sampled_from(["f4", "f8"]))
    normalise = draw(st.booleans())
    batches = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    return size, stride, counts, origin, box_shape, lead, values, sums, normalise, batches, seed


@needs_numba
@settings(max_examples=150, deadline=None)
@given(kernel_cases())
def test_the_numpy_kernel_gives_the_compiled_kernels_bits(case):
    size, stride, counts, origin, box_shape, lead, values, sums, normalise, batches, seed = case
    rng = np.random.default_rng(seed)
    starts = [np.arange(c) * s for c, s in zip(counts, stride)]
    anchors = np.array([[y, x] for y in starts[0] for x in starts[1]])
    factors = [rng.random(n) + 0.1 for n in size]
    box = lattice.LatticeBox.around(starts, origin, box_shape, factors, normalise)
    predictions = rng.random((len(anchors), *lead, *size)) * 200 - 50
    if np.dtype(values).kind in "u?":
        predictions = np.abs(predictions)
    predictions = predictions.astype(values)
    order = rng.permutation(len(anchors))
    out = {}
    for kernel in ("compiled", "numpy"):
        target = np.zeros((*lead, *box.extent), dtype=sums)
        for batch in np.array_split(order, batches):
            box.blend(target, anchors[batch], predictions[batch], kernel=kernel)
        out[kernel] = target
    np.testing.assert_array_equal(out["numpy"], out["compiled"])
    assert np.any(out["numpy"] != 0)  # the patches landed


@needs_numba
@settings(max_examples=150, deadline=None)
@given(kernel_cases(), st.data())
def test_the_clean_kernel_adds_up_to_the_first_nan_patch_and_zeroes_rows_it_reaches(case, data):
    """blend_clean_patches = zeroed rows + the patch kernel's adds of the patches before a NaN.

    Rows from ``zeroed`` on start as garbage (NaN among it): the ones the added
    patches reach must hold the sums; the others must keep their garbage.
    """
    size, stride, counts, origin, box_shape, lead, _, sums, normalise, _, seed = case
    values = data.draw(st.sampled_from(["f4", "f8"]))
    rng = np.random.default_rng(seed)
    starts = [np.arange(c) * s for c, s in zip(counts, stride)]
    anchors = np.array([[y, x] for y in starts[0] for x in starts[1]])
    factors = [rng.random(n) + 0.1 for n in size]
    box = lattice.LatticeBox.around(starts, origin, box_shape, factors, normalise)
    order = rng.permutation(len(anchors))
    predictions = (rng.random((len(anchors), *lead, *size)) * 200 - 50).astype(values)
    poisoned = data.draw(st.none() | st.integers(0, len(anchors) - 1))
    if poisoned is not None:  # one value of one patch (in the order given)
        flat = predictions[order[poisoned]].reshape(-1)
        nan = data.draw(st.sampled_from([np.nan, -np.nan]))  # either sign bit
        flat[data.draw(st.integers(0, flat.size - 1))] = nan
    clean = order[:poisoned]  # infinity is no NaN: these patches are added
    predictions[clean] = np.where(rng.random(predictions[clean].shape) < 0.1, np.inf,
                                  predictions[clean])  # fmt: skip
    height = box.extent[0]
    zeroed = data.draw(st.integers(0, height))
    garbage = np.where(rng.random((*lead, *box.extent)) < 0.5, np.nan, 7.0).astype(sums)
    target = garbage.copy()
    target[..., :zeroed, :] = 0
    added, new_zeroed = compiled.blend_clean_patches(
        target, tuple(box.lo), anchors[order], predictions[order], box.rows_of(anchors[order]),
        box.weights, zeroed,
    )  # fmt: skip
    expected_added = len(anchors) if poisoned is None else poisoned
    assert added == expected_added
    reached = [int(anchors[p, 0]) - box.lo[0] + size[0] for p in order[:added]]
    assert new_zeroed == max([zeroed, *reached])
    expected = np.zeros((*lead, *box.extent), dtype=sums)
    box.blend(expected, anchors[order[:added]], predictions[order[:added]], kernel="compiled")
    np.testing.assert_array_equal(target[..., :new_zeroed, :], expected[..., :new_zeroed, :])
    np.testing.assert_array_equal(target[..., new_zeroed:, :], garbage[..., new_zeroed:, :])


def test_a_dask_write_of_large_patches_never_loads_numba(tmp_path):
    """Dask tasks blend with numpy: numba's LLVM would cost each process ~105 MiB."""
    out = tmp_path / "out.zarr"
    script = textwrap.dedent(f"""
        import sys
        import dask.array as da
        import numpy as np
        import xarray as xr
        import xpatch

        values = np.random.default_rng(0).random((2, 300, 300)).astype("float32")
        lazy = xr.DataArray(da.from_array(values, chunks=(2, 100, 100)),
                            dims=("band", "y", "x"), name="data")
        p = lazy.patch(y=64, x=64, stride=48, window="hann")
        from xpatch.core.blend import batch_blend

        kernels = []
        add = batch_blend.BatchBlend.add
        batch_blend.BatchBlend.add = lambda self, *a: kernels.append(self.kernel) or add(self, *a)
        xpatch.write(p.apply(lambda b: b * 2, batch_size=4), {str(out)!r}, progress=False)
        plan = p.plan
        batches = sum(-(-len(plan.group_anchors(g)) // 4) for g in range(len(plan.groups)))
        print(sorted(set(kernels)), len(kernels) == batches, "numba" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)  # fmt: skip
    # Blended with numpy, one add per batch of each group, and numba never imported.
    assert done.stdout.strip() == "['numpy'] True False", done.stderr
    values = np.random.default_rng(0).random((2, 300, 300)).astype("float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, stride=48, window="hann")
    expected = p.apply(lambda b: b * 2, batch_size=4)
    np.testing.assert_allclose(
        xr.open_zarr(out)["data"].values, expected.values, rtol=1e-6, equal_nan=True
    )


@needs_numba
def test_a_slow_blend_holds_at_most_two_batches_of_results(monkeypatch):
    """fn may run ahead of the blending thread by one batch, not more."""
    monkeypatch.setattr(apply_module, "worker_count", lambda: 2)
    original = batch_blend.BatchBlend.add

    def slow_add(self, anchors, values):
        time.sleep(0.01)
        return original(self, anchors, values)

    monkeypatch.setattr(batch_blend.BatchBlend, "add", slow_add)
    alive, most = [0], [0]
    lock = threading.Lock()

    def fn(b):
        out = b * 2
        with lock:
            alive[0] += 1
            most[0] = max(most[0], alive[0])
        weakref.finalize(out, lambda: alive.__setitem__(0, alive[0] - 1))
        return out

    values = np.random.default_rng(7).random((1, 320, 320)).astype("float32")
    p = xr.DataArray(values, dims=("band", "y", "x")).patch(y=64, x=64, stride=32)
    got = p.apply(fn, batch_size=3).values
    np.testing.assert_allclose(got, values * 2, rtol=1e-6)
    # Two, and a third for the moment the blending thread takes to drop the batch it
    # has just blended; before the bound, all 33 batches could pile up.
    assert len(p) // 3 > 10 and most[0] <= 3


@needs_numba
@pytest.mark.parametrize(
    ("layout", "options"),
    [
        (dict(y=16, x=16, stride=8, window="hann"), dict(batch_size=7)),
        (
            dict(y=16, x=16, stride=5, window="hann", boundary="pad"),
            dict(batch_size=5, pad_batch=True),
        ),
        (dict(y=12, x=10, stride=4, window="triang"), dict(batch_size=9, reduce="sum")),
        (dict(y=16, x=16, stride=8, window="hann"), dict(batch_size=8, scale=2)),
        (
            dict(y=16, x=16, stride=8, window="hann", boundary="pad", pad_mode="reflect"),
            dict(batch_size=6),
        ),
    ],
)
def test_large_groups_of_small_patches_go_slab_by_slab_as_whole_groups_would(
    monkeypatch, layout, options
):
    """Past GROUP_PATCH_BYTES a task holds one slab of whole batches, not its group's
    patches; fn sees the same batches, and the blend gives the whole group's values
    (to rounding: NaN in the input takes the exact path there, valid weights here)."""
    values = np.random.default_rng(3).random((2, 300, 260)).astype("float32")
    values[0, 5:9, 7:30] = np.nan
    p = xr.DataArray(values, dims=("band", "y", "x")).chunk({"y": 100, "x": 130}).patch(**layout)
    scale = options.get("scale", 1)

    def fn(batch):
        seen.append(len(batch))
        doubled = np.sqrt(batch) * 2
        return np.repeat(np.repeat(doubled, scale, -1), scale, -2)

    held: list[int] = []
    run_batches = lazy_module.run_batches

    def counting(patches, *args, **kwargs):
        held.append(len(patches))
        return run_batches(patches, *args, **kwargs)

    monkeypatch.setattr(lazy_module, "run_batches", counting)
    results, calls, largest = {}, {}, {}
    for mode, group_bytes in (("whole", 2**40), ("slabs", 0)):
        monkeypatch.setattr(batch_blend, "GROUP_PATCH_BYTES", group_bytes)
        monkeypatch.setattr(batch_blend, "SLAB_BYTES", 30_000)
        seen, held[:] = [], []
        results[mode] = p.apply(fn, **options).compute(scheduler="sync").values
        calls[mode], largest[mode] = list(seen), max(held)
    assert calls["slabs"] == calls["whole"]  # the same batches, in the same order
    batch = options["batch_size"]
    patch_bytes = 2 * 4 * layout["y"] * layout["x"] * scale**2  # 2 bands of float32
    assert largest["slabs"] <= batch * max(30_000 // (batch * patch_bytes), 1) < largest["whole"]
    np.testing.assert_allclose(results["slabs"], results["whole"], rtol=1e-5, atol=1e-6,
                               equal_nan=True)  # fmt: skip
    np.testing.assert_array_equal(np.isnan(results["slabs"]), np.isnan(results["whole"]))


@st.composite
def small_layouts(draw):
    size = [draw(st.integers(2, 14)), draw(st.integers(2, 14))]
    stride = [draw(st.integers(max(s // 2, 1), s + 3)) for s in size]
    grid = [s + draw(st.integers(0, 70)) for s in size]
    chunks = [draw(st.integers(max(g // 4, 1), g)) for g in grid]
    window = draw(st.sampled_from(["boxcar", "hann", ("gaussian", 3.0)]))
    reduce = draw(st.sampled_from(["mean", "sum"]))
    batch = draw(st.integers(1, 9))
    slab_bytes = draw(st.integers(1, 20_000))
    nan_patches = draw(st.lists(st.integers(0, 400), max_size=3))
    seed = draw(st.integers(0, 2**16))
    return size, stride, grid, chunks, window, reduce, batch, slab_bytes, nan_patches, seed


@needs_numba
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_layouts())
def test_slabs_of_small_patches_equal_the_reference(case):
    """Every group of small patches in slabs (from one batch each up): the brute-force sums."""
    size, stride, grid, chunks, window, reduce, batch, slab_bytes, nan_patches, seed = case
    rng = np.random.default_rng(seed)
    values = rng.random((2, *grid)).astype("float32") + 0.5
    da = xr.DataArray(values, dims=("band", "y", "x"))
    layout = dict(y=size[0], x=size[1], stride=dict(zip(("y", "x"), stride)), window=window)
    p = da.patch(**layout)
    anchors = anchors_of(p)
    marks = {values[0, anchors[i % len(anchors), 0], anchors[i % len(anchors), 1]]
             for i in nan_patches}  # fmt: skip

    def fn(b: np.ndarray) -> np.ndarray:
        out = np.sqrt(b) + 1
        out[np.isin(b[:, 0, 0, 0], list(marks)), :, : size[0] // 2] = np.nan  # poisoned
        return out

    slabs: list[str] = []
    add = recording_add(lambda blend, anchors: blend.kernel, slabs)

    with (
        mock.patch.object(batch_blend, "GROUP_PATCH_BYTES", 0),
        mock.patch.object(batch_blend, "SLAB_BYTES", slab_bytes),
        mock.patch.object(batch_blend.BatchBlend, "add", add),
    ):
        lazy = da.chunk(dict(zip(("y", "x"), chunks))).patch(**layout)
        got = lazy.apply(fn, batch_size=batch, reduce=reduce).compute(scheduler="sync").values
    assert slabs and set(slabs) == {"compiled"}  # every group went slab by slab
    predictions = fn(p.patches().transpose("patch", "band", "y", "x").values)
    expected = reference(predictions, anchors, grid, p.blend_window.values, reduce)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here")
def test_long_double_predictions_take_the_numpy_path():
    """numba has no float128: such an apply keeps the whole-group path (it crashed)."""
    values = np.random.default_rng(1).random((1, 200, 200))
    p = xr.DataArray(values.astype(np.longdouble), dims=("band", "y", "x")).patch(
        y=64, x=64, stride=48, window="hann"
    )
    got = p.apply(lambda b: b * 2, batch_size=4)
    assert got.dtype == np.longdouble
    np.testing.assert_allclose(got.values.astype(np.float64), values * 2, rtol=1e-12)


def test_slabs_are_for_large_groups_of_float_means_and_sums_with_numba(monkeypatch):
    line = np.hanning(8)[1:-1]
    window = BlendWindow.of(np.outer(line, line))
    unseparable = BlendWindow.of(np.outer(line, line) + np.eye(6))
    f4 = np.dtype("float32")
    big = batch_blend.GROUP_PATCH_BYTES + 1
    assert batch_blend.slab_kernel("mean", f4, window, f4, batch_blend.GROUP_PATCH_BYTES) is None
    assert batch_blend.slab_kernel("max", f4, window, f4, big) is None
    assert batch_blend.slab_kernel("sum", np.dtype("int64"), window, f4, big) is None
    assert batch_blend.slab_kernel("mean", f4, unseparable, f4, big) is None
    # Integer predictions keep whole groups, whose path checks float sums for rounding.
    assert (
        batch_blend.slab_kernel("sum", np.dtype("float64"), window, np.dtype("int64"), big) is None
    )
    monkeypatch.setattr(compiled, "AVAILABLE", False)  # without numba: whole groups
    assert batch_blend.slab_kernel("mean", f4, window, f4, big) is None
    monkeypatch.setattr(compiled, "AVAILABLE", True)
    assert batch_blend.slab_kernel("mean", f4, window, f4, big) == "compiled"
    assert batch_blend.slab_kernel("sum", f4, window, f4, big) == "compiled"
