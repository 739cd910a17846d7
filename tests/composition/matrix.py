"""The composition matrix: every layout of xpatch against every use, classified.

A *layout* is a boundary mode x a sampler x a halo x a window x an input: numpy,
dask (with unequal chunks) or a zarr opened without dask chunks (read by its own);
a *use* is something a user does with the patcher (``p[i]``, a reconstruction,
``apply``, a write, a Grain epoch, forecast samples, scenes, a DataTree). Each
cell runs the use on the layout and compares the result with
:mod:`tests.composition.reference` (plain numpy, no xpatch). A cell is:

- ``exact``: equal to the reference to float tolerance;
- ``refused``: xpatch raised an :class:`xpatch.XPatchError` (the reason is its message);
- ``wrong``: no error, but the values (or anchors, dtype, shape) differ;
- ``error``: any other exception.

Run ``python -m tests.composition.matrix --markdown`` for the table of the sampled
cells, ``--full`` for every cell (a few minutes).
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np
import xarray as xr

import xpatch

from .reference import Reference

NY, NX, BANDS = 22, 26, 2
SIZE, STRIDE = 8, 6
Y_CHUNKS, X_CHUNKS = (7, 10, 5), (9, 8, 9)
PAD_MODE = "reflect"  # a halo and pad cells that hold values, not a NaN fill that matches anything

BOUNDARIES = ("shift", "pad", "drop", "periodic")
SAMPLERS = ("grid", "jittered", "random", "labels", "weighted")
HALOS = (0, 2)
WINDOWS = ("boxcar", "hann")
BACKENDS = ("numpy", "dask", "zarr")
#: The zarr input's stored chunks (equal, the last cut), per dim.
ZARR_CHUNKS = {"time": 2, "y": 7, "x": 9}


@dataclass(frozen=True)
class Layout:
    """One patch layout of the product."""

    boundary: str
    sampler: str
    halo: int
    window: str
    backend: str

    @property
    def id(self) -> str:
        return f"{self.boundary}-{self.sampler}-h{self.halo}-{self.window}-{self.backend}"

    def reference(self, image: np.ndarray, size=(SIZE, SIZE), halo=None) -> Reference:
        """The numpy reference of this layout over ``image``."""
        halo = self.halo if halo is None else halo
        return Reference(image, size, halo, self.window, self.boundary, PAD_MODE)

    def options(self, obj, dims=("y", "x"), sizes=None) -> dict:
        """The keyword arguments of ``obj.patch(...)`` for this layout."""
        sizes = sizes or dict.fromkeys(dims, SIZE)
        boundary = {"x": "periodic"} if self.boundary == "periodic" else self.boundary
        kwargs = dict(sizes, stride=STRIDE, window=self.window, boundary=boundary)
        if self.halo:
            kwargs["halo"] = self.halo
        if self.halo or self.boundary == "pad":  # pad_mode is refused where nothing is padded
            kwargs["pad_mode"] = PAD_MODE
        sampler = self.make_sampler(obj)
        if sampler is not None:
            kwargs["sampler"] = sampler
        return kwargs

    def make_sampler(self, obj):
        """The sampler for ``obj`` (labels and weights are read off its grid)."""
        ny, nx = obj.sizes["y"], obj.sizes["x"]
        if self.sampler == "grid":
            return None
        if self.sampler == "jittered":
            return xpatch.JitteredGrid(jitter=2, seed=0)
        if self.sampler == "random":
            return xpatch.RandomAnchors(count=6, seed=0)
        if self.sampler == "labels":
            rows, cols = label_indices(ny, nx)
            return xpatch.AtLabels(
                {"y": obj.y.values[rows].tolist(), "x": obj.x.values[cols].tolist()}
            )
        if self.sampler == "weighted":
            return xpatch.WeightedAnchors(weight_map(obj), count=5, seed=0)
        raise ValueError(self.sampler)

    def lazy(self, obj, chunks=None):
        """``obj`` as the backend says: numpy, dask with unequal chunks, or a zarr."""
        if self.backend == "numpy":
            return obj
        if self.backend == "zarr":
            return stored_in_zarr(obj)
        ny, nx = obj.sizes["y"], obj.sizes["x"]
        return obj.chunk(chunks or {"y": fit_chunks(Y_CHUNKS, ny), "x": fit_chunks(X_CHUNKS, nx)})


def stored_in_zarr(obj):
    """``obj`` written to a zarr in memory (chunks :data:`ZARR_CHUNKS`), opened without dask."""
    from zarr.storage import MemoryStore

    data = obj.to_dataset(name=obj.name or "v") if isinstance(obj, xr.DataArray) else obj
    encoding = {
        name: {"chunks": tuple(ZARR_CHUNKS.get(d, n) for d, n in var.sizes.items())}
        for name, var in data.data_vars.items()
    }
    store = MemoryStore()
    data.to_zarr(store, encoding=encoding, consolidated=False)
    opened = xr.open_zarr(store, consolidated=False, chunks=None)
    if isinstance(obj, xr.DataArray):
        return opened[obj.name or "v"].rename(obj.name)
    return opened


def fit_chunks(chunks: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Unequal chunks summing to ``n`` (the pattern cut or stretched)."""
    out, left = [], n
    for c in itertools.cycle(chunks):
        if left <= 0:
            break
        out.append(min(c, left))
        left -= out[-1]
    return tuple(out)


def label_indices(ny: int, nx: int) -> tuple[list[int], list[int]]:
    """Row and column start indices of the AtLabels patches (given out of order)."""
    return [0, 5, ny - SIZE], [3, 0, nx - SIZE]


def weight_map(obj) -> xr.DataArray:
    """A weight map with three positive cells, on ``obj``'s grid."""
    ny, nx = obj.sizes["y"], obj.sizes["x"]
    w = np.zeros((ny, nx))
    w[3, 4], w[ny // 2, nx - 6], w[ny - 1, nx - 1] = 1.0, 2.0, 1.0
    return xr.DataArray(w, dims=("y", "x"), coords={"y": obj.y.values, "x": obj.x.values})


def all_layouts() -> list[Layout]:
    return [Layout(*v) for v in itertools.product(BOUNDARIES, SAMPLERS, HALOS, WINDOWS, BACKENDS)]


# -- the data ------------------------------------------------------------------------------


def coords(ny: int, nx: int, cell: float = 10.0) -> dict:
    return {"y": cell / 2 + cell * np.arange(ny), "x": cell / 2 + cell * np.arange(nx)}


def image() -> xr.DataArray:
    values = np.random.default_rng(0).random((BANDS, NY, NX))
    return xr.DataArray(values, dims=("band", "y", "x"), coords=coords(NY, NX))


class Mismatch(AssertionError):
    """The use ran without error and gave other values than the reference."""


def check(what: str, got, expected, exact: bool = False) -> None:
    """Raise :class:`Mismatch` naming ``what`` and how far ``got`` is from ``expected``."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        raise Mismatch(f"{what}: shape {got.shape}, expected {expected.shape}")
    if exact:
        bad = got != expected
    else:
        g, e = got.astype(float), expected.astype(float)
        nan_g, nan_e = np.isnan(g), np.isnan(e)
        close = np.isclose(g, e, rtol=1e-7, atol=1e-9)
        bad = (nan_g != nan_e) | (~nan_g & ~nan_e & ~close)
        if (nan_g & ~nan_e).any() or (~nan_g & nan_e).any():
            raise Mismatch(
                f"{what}: {int((nan_g & ~nan_e).sum())} cells NaN where a value is expected, "
                f"{int((~nan_g & nan_e).sum())} values where NaN is expected (of {e.size})"
            )
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise Mismatch(
            f"{what}: {int(bad.sum())} of {bad.size} cells differ, first at {first}: "
            f"{got[first]!r} != {expected[first]!r}"
        )


def anchors_of(p) -> np.ndarray:
    return np.asarray(p.anchors().values, dtype=np.int64)


def values(x) -> np.ndarray:
    return np.asarray(x.transpose("band", "y", "x").values if "band" in x.dims else x.values)


# -- the uses ------------------------------------------------------------------------------


def use_getitem(layout: Layout) -> None:
    img = image()
    p = layout.lazy(img).patch(**layout.options(img))
    ref = layout.reference(img.values)
    anchors = anchors_of(p)
    if len(p) != len(anchors):
        raise Mismatch(f"len(p) = {len(p)} but p.anchors() has {len(anchors)} rows")
    for i, a in enumerate(anchors):
        check(f"p[{i}] at anchor {a.tolist()}", values(p[i]), ref.patch(a))


def use_anchors(layout: Layout) -> None:
    img = image()
    p = layout.lazy(img).patch(**layout.options(img))
    ref = layout.reference(img.values)
    got = anchors_of(p)
    grid = ref.grid_anchors(STRIDE)
    limit = np.array([NY - SIZE, NX - 1 if layout.boundary == "periodic" else NX - SIZE])
    if layout.boundary == "pad":
        limit = np.array([NY - 1, NX - 1])
    if layout.sampler == "grid":
        check("anchors (sorted)", np.unique(got, axis=0), np.unique(grid, axis=0), exact=True)
        if len(got) != len(grid):
            raise Mismatch(f"{len(got)} anchors, expected {len(grid)}")
        return
    if len(got) and ((got < 0).any() or (got > limit).any()):
        raise Mismatch(f"anchors out of range [0, {limit.tolist()}]: {got.tolist()}")
    if layout.sampler == "jittered":
        if len(got) != len(grid):
            raise Mismatch(f"{len(got)} jittered anchors, expected {len(grid)}")
        far = [a.tolist() for a in got if np.abs(grid - a).max(axis=1).min() > 2]
        if far:
            raise Mismatch(f"jittered anchors more than 2 cells from every grid anchor: {far}")
    elif layout.sampler == "random":
        if len(got) != 6:
            raise Mismatch(f"{len(got)} random anchors, expected 6")
    elif layout.sampler == "labels":
        rows, cols = label_indices(NY, NX)
        check("AtLabels anchors (given order)", got, np.array(list(zip(rows, cols))), exact=True)
    elif layout.sampler == "weighted":
        w = weight_map(img).values
        if len(got) != 5:
            raise Mismatch(f"{len(got)} weighted anchors, expected 5")
        for a in got:
            rows, cols, inside = ref.cells(a)
            sub = w[np.ix_(rows.clip(max=NY - 1), cols.clip(max=NX - 1))] * inside
            if not (sub > 0).any():
                raise Mismatch(f"weighted anchor {a.tolist()}: its patch holds no weighted cell")


def _rec(layout: Layout):
    img = image()
    p = layout.lazy(img).patch(**layout.options(img))
    return img, p, layout.reference(img.values), anchors_of(p)


def _by_patch(n: int, factor: float) -> xr.DataArray:
    return xr.DataArray(np.arange(n) * factor, dims="patch")


def _use_reduce(layout: Layout, reduce: str) -> None:
    _img, p, ref, anchors = _rec(layout)
    n = len(anchors)
    if reduce in ("mean", "sum"):
        pred = p.patches() * 2 + _by_patch(n, 0.5)

        def model(i, a):
            return ref.inner(a) * 2 + 0.5 * i
    else:
        pred = p.patches() + _by_patch(n, 1.0)

        def model(i, a):
            return ref.inner(a) + i

    out = p.reconstruct(pred, reduce=reduce)
    expected = np.stack(
        [ref.blend(anchors, lambda i, a, b=b: model(i, a)[b], reduce) for b in range(BANDS)]
    )
    check(f"reconstruct(reduce={reduce!r})", values(out), expected)


def use_rec_mean(layout):
    _use_reduce(layout, "mean")


def use_rec_sum(layout):
    _use_reduce(layout, "sum")


def use_rec_max(layout):
    _use_reduce(layout, "max")


def use_rec_min(layout):
    _use_reduce(layout, "min")


def use_rec_vote(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    first = p.patches().isel(band=0)
    labels = ((np.floor(first * 3) + _by_patch(len(anchors), 1.0)) % 3).astype("int64")
    out = p.reconstruct(labels, reduce="vote")
    expected = ref.blend(
        anchors, lambda i, a: (np.floor(ref.inner(a)[0] * 3) + i) % 3, reduce="vote"
    )
    check("reconstruct(reduce='vote')", values(out), expected)


def _scores(x, i):
    """Three class scores of a patch's first band (and its index, so order matters)."""
    return [-((x - c / 2) ** 2) + 0.05 * ((i + c) % 3) for c in range(3)]


def use_rec_argmax(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    first = p.patches().isel(band=0)
    index = _by_patch(len(anchors), 1.0)
    pred = xr.concat(_scores(first, index), dim="class").transpose("patch", "class", "y", "x")
    out = p.reconstruct(pred, reduce="argmax")
    blended = ref.blend(
        anchors, lambda i, a: np.stack(_scores(ref.inner(a)[0], i)), "mean", lead=(3,)
    )
    covered = ~np.isnan(blended).any(axis=0)
    expected = np.where(covered, np.nan_to_num(blended).argmax(axis=0), 255)
    check("reconstruct(reduce='argmax')", values(out), expected, exact=True)


def _repeat2(a, ydim: int, xdim: int):
    return np.repeat(np.repeat(a, 2, axis=ydim), 2, axis=xdim)


def use_rec_mean_x2(layout: Layout, scale: int | None = 2) -> None:
    _img, p, ref, anchors = _rec(layout)
    pt = p.patches()
    data = _repeat2(pt.data, pt.dims.index("y"), pt.dims.index("x"))
    keep = {k: c for k, c in pt.coords.items() if c.dims == ("patch",)}
    pred = xr.DataArray(data, dims=pt.dims, coords=keep) * 2 + _by_patch(len(anchors), 0.5)
    out = p.reconstruct(pred, scale=scale)
    expected = np.stack(
        [
            ref.blend(
                anchors, lambda i, a, b=b: _repeat2(ref.inner(a)[b] * 2 + 0.5 * i, 0, 1), scale=2
            )
            for b in range(BANDS)
        ]
    )
    check("reconstruct of 2x predictions", values(out), expected)


def use_rec_mean_x2_inferred(layout: Layout) -> None:
    """The same 2x predictions without ``scale=``: reconstruct reads the factor off them."""
    use_rec_mean_x2(layout, scale=None)


def use_apply_weights(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)

    def fn(batch):  # a per-patch offset read off the patch, so the weights matter
        return batch * 2 + batch.mean(axis=(1, 2, 3), keepdims=True)

    weights = np.arange(1, len(anchors) + 1, dtype=float)
    out = p.apply(fn, weights=weights)
    expected = np.stack(
        [
            ref.blend(
                anchors,
                lambda i, a, b=b: ref.inner(a)[b] * 2 + ref.patch(a).mean(),
                weights=weights,
            )
            for b in range(BANDS)
        ]
    )
    check("apply(weights=per patch)", values(out), expected)


def use_apply_uint8(layout: Layout) -> None:
    img = image()
    raw = (img.values * 200).astype("uint8") + 1
    raw[:, 3, 4] = raw[:, NY // 2, 7] = 0  # the input's nodata
    u8 = img.copy(data=raw)
    u8.attrs["_FillValue"] = 0
    p = layout.lazy(u8).patch(**layout.options(u8))
    ref = layout.reference(raw.astype(float))
    anchors = anchors_of(p)

    def fn(batch):  # never a tie at .5: values end in .25 or .75
        return np.asarray(batch, dtype=float) * 0.5 + 1.25

    out = p.apply(fn, dtype="float64", out_dtype="uint8", nodata=255)
    if out.dtype != np.uint8:
        raise Mismatch(f"apply(out_dtype='uint8') gave dtype {out.dtype}")
    covered = ref.coverage(anchors)
    expected = np.where(covered & (raw != 0), np.rint(raw * 0.5 + 1.25), 255)
    check("apply(uint8, nodata=255, out_dtype='uint8')", values(out), expected, exact=True)


def use_apply_x2(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    out = p.apply(lambda batch: _repeat2(batch, -2, -1) * 2, scale=2)
    expected = np.stack(
        [
            ref.blend(anchors, lambda i, a, b=b: _repeat2(ref.inner(a)[b] * 2, 0, 1), scale=2)
            for b in range(BANDS)
        ]
    )
    check("apply(scale=2)", values(out), expected)


def _expected_x2(ref, anchors):
    return np.stack(
        [ref.blend(anchors, lambda i, a, b=b: ref.inner(a)[b] * 2) for b in range(BANDS)]
    )


def use_write_zarr(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    result = p.apply(lambda batch: batch * 2)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "out.zarr"
        xpatch.write(result.rename("out"), store, progress=False)
        back = xr.open_zarr(store)["out"].load()
    check("zarr written and read back", values(back), _expected_x2(ref, anchors))


def use_write_tiff(layout: Layout) -> None:
    try:
        import rioxarray
    except ImportError:  # pragma: no cover - the [test] extra installs it
        raise xpatch.MissingDependencyError("rioxarray is not installed") from None
    img = image().rio.write_crs("EPSG:32631")
    p = layout.lazy(img).patch(**layout.options(img))
    ref, anchors = layout.reference(img.values), anchors_of(p)
    result = p.apply(lambda batch: batch * 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.tif"
        xpatch.write(result.rename("out"), path, progress=False)
        back = rioxarray.open_rasterio(path, masked=True).load()
    check("GeoTIFF written and read back", values(back), _expected_x2(ref, anchors))


def use_patches(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    stack = p.patches().load()
    for j, d in enumerate(("y", "x")):
        check(f"p.patches()'s {d}_anchor", stack[f"{d}_anchor"].values, anchors[:, j], exact=True)
    for i, a in enumerate(anchors):
        check(f"p.patches()[{i}]", values(stack.isel(patch=i)), ref.patch(a))


def _mean_pred(p, anchors):
    return p.patches() * 2 + _by_patch(len(anchors), 0.5)


def _expected_mean(ref, anchors, **options):
    return np.stack(
        [
            ref.blend(anchors, lambda i, a, b=b: ref.inner(a)[b] * 2 + 0.5 * i, **options)
            for b in range(BANDS)
        ]
    )


def use_rec_shuffled(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    pred = _mean_pred(p, anchors)
    order = np.random.default_rng(0).permutation(len(anchors))
    out = p.reconstruct(pred.isel(patch=order))  # matched back by the anchor coordinates
    check("reconstruct of predictions in another order", values(out), _expected_mean(ref, anchors))


def use_rec_lazy_pred(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    pred = _mean_pred(p, anchors).chunk({"patch": 1})
    out = p.reconstruct(pred)
    check(
        "reconstruct of predictions one patch per chunk", values(out), _expected_mean(ref, anchors)
    )


def use_rec_cell_weights(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    weights = 1 + p.patches().isel(band=0) ** 2  # per cell, every band alike
    out = p.reconstruct(_mean_pred(p, anchors), weights=weights)
    expected = _expected_mean(ref, anchors, cell_weights=lambda i, a: 1 + ref.inner(a)[0] ** 2)
    check("reconstruct(weights=per cell)", values(out), expected)


def _item_means(batch):
    return batch.mean(axis=tuple(range(1, batch.ndim)), keepdims=True)


def use_apply_argmax(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)

    def fn(batch):  # (b, band, y, x) -> (b, class, y, x), a patch's mean shifts the scores
        m = _item_means(batch)[:, 0]
        return np.stack([-((batch[:, 0] - c / 2) ** 2) + 0.1 * c * m for c in range(3)], axis=1)

    out = p.apply(fn, output_dims={"class": 3}, reduce="argmax")

    def scores(i, a):
        m = ref.patch(a).mean()
        return np.stack([-((ref.inner(a)[0] - c / 2) ** 2) + 0.1 * c * m for c in range(3)])

    blended = ref.blend(anchors, scores, "mean", lead=(3,))
    covered = ~np.isnan(blended).any(axis=0)
    expected = np.where(covered, np.nan_to_num(blended).argmax(axis=0), 255)
    check("apply(reduce='argmax')", values(out), expected, exact=True)


def use_apply_vote(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)

    def fn(batch):  # labels 0..2 of the first band, turned by a patch's mean
        m = _item_means(batch)[:, 0]
        return ((np.floor(batch[:, 0] * 3) + np.floor(m * 10)) % 3).astype("uint8")

    out = p.apply(fn, output_dims={}, dtype="uint8", reduce="vote")
    expected = ref.blend(
        anchors,
        lambda i, a: (np.floor(ref.inner(a)[0] * 3) + np.floor(ref.patch(a).mean() * 10)) % 3,
        reduce="vote",
    )
    check("apply(reduce='vote')", values(out), expected)


def use_apply_max(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    out = p.apply(lambda batch: batch + _item_means(batch), reduce="max")
    expected = np.stack(
        [
            ref.blend(anchors, lambda i, a, b=b: ref.inner(a)[b] + ref.patch(a).mean(), "max")
            for b in range(BANDS)
        ]
    )
    check("apply(reduce='max')", values(out), expected)


def use_apply_dict(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)

    def fn(batch):
        return {"twice": batch * 2, "first": batch[:, 0] + _item_means(batch)[:, 0]}

    out = p.apply(fn, output_dims={"twice": {"band": BANDS}, "first": {}})
    check("apply -> dict, 'twice'", values(out["twice"]), _expected_x2(ref, anchors))
    expected = ref.blend(anchors, lambda i, a: ref.inner(a)[0] + ref.patch(a).mean())
    check("apply -> dict, 'first'", values(out["first"]), expected)


def use_apply_pad_batch(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    sizes = []

    def fn(batch):
        sizes.append(len(batch))
        return batch * 2

    out = p.apply(fn, batch_size=4, pad_batch=True).load()
    if set(sizes) != {4}:
        raise Mismatch(
            f"apply(batch_size=4, pad_batch=True) handed fn batches of {sorted(set(sizes))}"
        )
    check("apply(pad_batch=True)", values(out), _expected_x2(ref, anchors))


def use_write_zarr_x2(layout: Layout) -> None:
    _img, p, ref, anchors = _rec(layout)
    result = p.apply(lambda batch: _repeat2(batch, -2, -1) * 2, scale=2)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "out.zarr"
        xpatch.write(result.rename("out"), store, progress=False)
        back = xr.open_zarr(store)["out"].load()
    expected = np.stack(
        [
            ref.blend(anchors, lambda i, a, b=b: _repeat2(ref.inner(a)[b] * 2, 0, 1), scale=2)
            for b in range(BANDS)
        ]
    )
    check("zarr of apply(scale=2) read back", values(back), expected)


def _grain_epoch(layout: Layout, shuffle: bool) -> None:
    import grain

    _img, p, ref, anchors = _rec(layout)
    src = p.to_grain()
    ds = grain.MapDataset.source(src)
    if shuffle:
        ds = ds.pipe(src.chunk_shuffle, seed=0)
    seen = []
    for item in ds:
        i = int(item["index"])
        seen.append(i)
        check(f"item {i}'s anchor", item["anchor"], anchors[i], exact=True)
        check(f"item {i}'s data", item["data"], ref.patch(anchors[i]))
    if sorted(seen) != list(range(len(anchors))):
        served = Counter(seen)
        raise Mismatch(
            f"an epoch served {len(seen)} items for {len(anchors)} patches: missing "
            f"{sorted(set(range(len(anchors))) - set(served))[:5]}, repeated "
            f"{[k for k, v in served.items() if v > 1][:5]}"
        )


def use_grain_batches(layout):
    """Whole batches of the chunk-shuffled epoch (``BatchSource``), each row its patch."""
    from xpatch.grain import BatchSource

    _img, p, ref, anchors = _rec(layout)
    batches = BatchSource(p.to_grain(), 4, seed=0)
    seen = []
    for batch in batches.dataset():
        for row, i in enumerate(batch["index"].tolist()):
            seen.append(i)
            check(f"batch row of item {i}'s anchor", batch["anchor"][row], anchors[i], exact=True)
            check(f"batch row of item {i}'s data", batch["data"][row], ref.patch(anchors[i]))
    if sorted(seen) != list(range(len(anchors))):
        raise Mismatch(f"an epoch of batches served {len(seen)} items for {len(anchors)} patches")


def use_grain(layout):
    _grain_epoch(layout, shuffle=False)


def use_grain_shuffle(layout):
    _grain_epoch(layout, shuffle=True)


def _cube():
    values = np.random.default_rng(1).random((6, NY, NX))
    return xr.DataArray(
        values, dims=("time", "y", "x"), coords={"time": np.arange(6), **coords(NY, NX)}
    )


def _forecast(layout: Layout):
    cube = _cube()
    lazy = layout.lazy(cube, {"time": 2, "y": Y_CHUNKS, "x": X_CHUNKS})
    fc = lazy.patch(time=xpatch.Forecast(inputs=[-1, 0], targets=[1]), **layout.options(cube))
    ref = layout.reference(cube.values)
    return cube, fc, ref, anchors_of(fc.patcher)


def use_forecast_samples(layout: Layout) -> None:
    cube, fc, ref, anchors = _forecast(layout)
    if len(fc) != len(anchors) or len(fc) % 4:
        raise Mismatch(f"{len(fc)} samples for 4 valid origins and {len(anchors)} anchors")
    for i in range(len(fc)):
        sample, a = fc[i], anchors[i]
        origin = int(sample["origin"])
        if origin != a[0] + 1:
            raise Mismatch(f"sample {i}: origin {origin}, its window starts at time {a[0]}")
        got_in = sample["inputs"].transpose("time", "y", "x").values
        got_out = sample["targets"].transpose("time", "y", "x").values
        check(f"sample {i} inputs", got_in, ref.patch(a[1:], cube.values[origin - 1 : origin + 1]))
        check(
            f"sample {i} targets", got_out, ref.patch(a[1:], cube.values[origin + 1 : origin + 2])
        )


def use_forecast_apply(layout: Layout) -> None:
    cube, fc, ref, anchors = _forecast(layout)
    out = fc.apply(lambda inputs: inputs[:, -1:])  # persistence
    spatial = (
        np.unique(anchors[:, 1:], axis=0)
        if layout.sampler != "labels"
        else anchors[anchors[:, 0] == anchors[0, 0], 1:]
    )
    check("forecast valid times", out.time.values, np.arange(2, 6), exact=True)
    for t in range(2, 6):
        expected = ref.blend(spatial, lambda i, a, t=t: ref.inner(a, cube.values[t - 1]))
        check(f"persistence at time {t}", out.sel(time=t).transpose("y", "x").values, expected)


def use_scenes(layout: Layout) -> None:
    scenes, sp, refs, anchors = _scene_setup(layout)
    if len(sp) != sum(len(a) for a in anchors.values()):
        raise Mismatch(
            f"len(sp) = {len(sp)}, the scenes' patchers have {[len(a) for a in anchors.values()]}"
        )
    for i in range(len(sp)):
        name, j = sp.locate(i)
        check(
            f"sp[{i}] (scene {name}, patch {j})", values(sp[i]), refs[name].patch(anchors[name][j])
        )
    results = sp.apply(lambda batch: batch * 2)
    for name in scenes:
        check(
            f"scene {name}'s apply", values(results[name]), _expected_x2(refs[name], anchors[name])
        )


def _tree(layout: Layout):
    img = image()
    fine = img.isel(band=0).to_dataset(name="v")
    coarse_values = img.values[0].reshape(NY // 2, 2, NX // 2, 2).mean(axis=(1, 3))
    coarse = xr.Dataset({"c": (("y", "x"), coarse_values)}, coords=coords(NY // 2, NX // 2, 20.0))
    nodes = {"/fine": layout.lazy(fine), "/coarse": layout.lazy(coarse)}
    tp = xr.DataTree.from_dict(nodes).patch(**layout.options(img), reference="/fine")
    # Sizes, strides and the halo count the reference node's cells: half as many at /coarse.
    refs = {
        "/fine": layout.reference(fine["v"].values),
        "/coarse": layout.reference(
            coarse_values, size=(SIZE // 2, SIZE // 2), halo=layout.halo // 2
        ),
    }
    anchors = {k: anchors_of(tp.patchers[k]) for k in nodes}
    check("coarse anchors = fine anchors / 2", anchors["/coarse"] * 2, anchors["/fine"], exact=True)
    return tp, refs, anchors, {"/fine": "v", "/coarse": "c"}


def use_datatree(layout: Layout) -> None:
    tp, refs, anchors, variables = _tree(layout)
    for i in range(len(tp)):
        item = tp[i]
        for path, var in variables.items():
            got = item[path][var].transpose("y", "x").values
            check(f"tp[{i}][{path!r}]", got, refs[path].patch(anchors[path][i]))


def use_tree_apply(layout: Layout) -> None:
    tp, refs, anchors, variables = _tree(layout)
    out = tp.apply(lambda batch: batch * 2)
    for path, var in variables.items():
        expected = refs[path].blend(anchors[path], lambda i, a, r=refs[path]: r.inner(a) * 2)
        check(f"apply at {path}", out[path][var].transpose("y", "x").values, expected)


def use_forecast_grain(layout: Layout) -> None:
    import grain

    cube, fc, ref, anchors = _forecast(layout)
    src = fc.to_grain()
    seen = []
    for item in grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=0):
        i = int(item["index"])
        seen.append(i)
        a = anchors[i]
        origin = a[0] + 1
        check(
            f"item {i} inputs",
            item["inputs"],
            ref.patch(a[1:], cube.values[origin - 1 : origin + 1]),
        )
        check(
            f"item {i} targets",
            item["targets"],
            ref.patch(a[1:], cube.values[origin + 1 : origin + 2]),
        )
    if sorted(seen) != list(range(len(fc))):
        raise Mismatch(f"a forecast epoch served {len(seen)} items for {len(fc)} samples")


def _scene_setup(layout: Layout):
    img = image()
    small = img.isel(y=slice(0, 18), x=slice(0, 20))
    scenes = {"a": img, "b": small}
    options = layout.options(img)
    if layout.sampler in ("labels", "weighted"):
        options["sampler"] = {k: layout.make_sampler(v) for k, v in scenes.items()}
    sp = xpatch.patch_scenes({k: layout.lazy(v) for k, v in scenes.items()}, **options)
    refs = {k: layout.reference(v.values) for k, v in scenes.items()}
    anchors = {k: anchors_of(sp.patchers[k]) for k in scenes}
    return scenes, sp, refs, anchors


def use_scenes_grain(layout: Layout) -> None:
    import grain

    _scenes, sp, refs, anchors = _scene_setup(layout)
    src = sp.to_grain()
    names = list(sp.names)
    seen = []
    for item in grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=0):
        i = int(item["index"])
        seen.append(i)
        name, j = sp.locate(i)
        if names[int(item["scene"])] != name:
            raise Mismatch(f"item {i}: scene {int(item['scene'])}, sp.locate says {name!r}")
        check(f"item {i}'s anchor", item["anchor"], anchors[name][j], exact=True)
        check(f"item {i}'s data", item["data"], refs[name].patch(anchors[name][j]))
    if sorted(seen) != list(range(len(sp))):
        raise Mismatch(f"a scenes epoch served {len(seen)} items for {len(sp)} patches")


def use_tree_reconstruct(layout: Layout) -> None:
    tp, refs, anchors, variables = _tree(layout)
    out = tp.reconstruct(tp.patches() * 2)
    for path, var in variables.items():
        expected = refs[path].blend(anchors[path], lambda i, a, r=refs[path]: r.inner(a) * 2)
        check(f"reconstruct at {path}", out[path][var].transpose("y", "x").values, expected)


USES = {
    "p[i]": use_getitem,
    "anchors": use_anchors,
    "mean": use_rec_mean,
    "sum": use_rec_sum,
    "max": use_rec_max,
    "min": use_rec_min,
    "vote": use_rec_vote,
    "argmax": use_rec_argmax,
    "mean 2x": use_rec_mean_x2,
    "mean 2x inferred": use_rec_mean_x2_inferred,
    "apply weights": use_apply_weights,
    "apply uint8": use_apply_uint8,
    "apply 2x": use_apply_x2,
    "zarr": use_write_zarr,
    "GeoTIFF": use_write_tiff,
    "patches": use_patches,
    "shuffled pred": use_rec_shuffled,
    "lazy pred": use_rec_lazy_pred,
    "cell weights": use_rec_cell_weights,
    "apply argmax": use_apply_argmax,
    "apply vote": use_apply_vote,
    "apply max": use_apply_max,
    "apply dict": use_apply_dict,
    "pad_batch": use_apply_pad_batch,
    "zarr 2x": use_write_zarr_x2,
    "grain": use_grain,
    "grain shuffle": use_grain_shuffle,
    "grain batches": use_grain_batches,
    "forecast": use_forecast_samples,
    "forecast apply": use_forecast_apply,
    "scenes": use_scenes,
    "forecast grain": use_forecast_grain,
    "scenes grain": use_scenes_grain,
    "DataTree": use_datatree,
    "DataTree apply": use_tree_apply,
    "DataTree reconstruct": use_tree_reconstruct,
}


# -- the runner ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    layout: Layout
    use: str

    @property
    def id(self) -> str:
        return f"{self.layout.id}::{self.use.replace(' ', '_')}"


@dataclass(frozen=True)
class Outcome:
    cell: Cell
    status: str  # exact, refused, wrong, error
    reason: str
    seconds: float


def one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_cell(cell: Cell) -> Outcome:
    """Run one cell and classify it."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), dask.config.set(scheduler="synchronous"):
            warnings.simplefilter("ignore")
            USES[cell.use](cell.layout)
    except Mismatch as e:
        status, reason = "wrong", one_line(e)
    except xpatch.XPatchError as e:
        status, reason = "refused", f"{type(e).__name__}: {one_line(e)}"
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        site = f" [{Path(where.filename).name}:{where.lineno}]"
        status, reason = "error", f"{type(e).__name__}: {one_line(e)}{site}"
    else:
        status, reason = "exact", ""
    return Outcome(cell, status, reason, time.perf_counter() - start)


def all_cells() -> list[Cell]:
    return [Cell(layout, use) for layout in all_layouts() for use in USES]


def sampled_cells(seed: int = 0, per_use: int = 8) -> list[Cell]:
    """A deterministic, stratified sample: each use on ``per_use`` layouts.

    For every use, each layout dimension's values are dealt in a seeded random
    order, repeated to ``per_use`` layouts: with ``per_use >= 5`` every use meets
    every value of every dimension (each boundary twice, each sampler at least
    once, each halo and window four times, each input two or three times at the
    default 8), and the dimensions are paired differently from one use to the next.
    """
    rng = random.Random(seed)
    cells = []
    for use in USES:
        columns = []
        for values in (BOUNDARIES, SAMPLERS, HALOS, WINDOWS, BACKENDS):
            dealt: list = []
            while len(dealt) < per_use:
                dealt += rng.sample(values, len(values))
            columns.append(dealt[:per_use])
        cells += [Cell(Layout(*row), use) for row in zip(*columns)]
    return sorted(set(cells), key=lambda c: c.id)


# -- the table -----------------------------------------------------------------------------

MARKS = {"exact": "✓", "refused": "R", "wrong": "✗", "error": "E"}


def dimension_rows(outcomes: list[Outcome]) -> list[tuple[str, dict[str, Counter]]]:
    """Counts per (layout dimension value, use)."""
    rows = []
    for name, attr, options in (
        ("boundary", "boundary", BOUNDARIES),
        ("sampler", "sampler", SAMPLERS),
        ("halo", "halo", HALOS),
        ("window", "window", WINDOWS),
        ("input", "backend", BACKENDS),
    ):
        for value in options:
            counts = {use: Counter() for use in USES}
            for o in outcomes:
                if getattr(o.cell.layout, attr) == value:
                    counts[o.cell.use][o.status] += 1
            rows.append((f"{name}={value}", counts))
    return rows


def markdown(outcomes: list[Outcome], title: str = "") -> str:
    """The table: rows the layout dimensions' values, columns the uses."""
    total = Counter(o.status for o in outcomes)
    lines = []
    if title:
        lines += [title, ""]
    lines.append(
        f"{len(outcomes)} cells: {total['exact']} exact, {total['refused']} refused, "
        f"{total['wrong']} wrong, {total['error']} error. A cell of the table counts the "
        f"cells of that use whose layout has that value: ✓ exact, R refused (reasons "
        f"below), ✗ wrong, E error."
    )
    lines.append("")
    uses = list(USES)
    lines.append("| layout | " + " | ".join(uses) + " |")
    lines.append("|---|" + "---|" * len(uses))
    for label, counts in dimension_rows(outcomes):
        cells = []
        for use in uses:
            c = counts[use]
            cells.append(" ".join(f"{c[s]}{MARKS[s]}" for s in MARKS if c[s]) or "·")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    reasons: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.status == "refused":
            # Messages differ by the numbers of each case; the same words are one reason.
            reasons.setdefault(re.sub(r"\d+", "#", o.reason)[:100], []).append(o)
    if reasons:
        lines += ["", "Refusals, by message:", ""]
        for k, group in enumerate(sorted(reasons.values(), key=len, reverse=True), 1):
            uses = ", ".join(sorted({o.cell.use for o in group}))
            lines.append(
                f"{k}. {len(group)} cell(s) of {uses}, e.g. `{group[0].cell.id}`: {group[0].reason}"
            )
    bad = [o for o in outcomes if o.status in ("wrong", "error")]
    if bad:
        lines += ["", "Wrong and error cells:", ""]
        for o in sorted(bad, key=lambda o: (o.status, o.cell.use, o.cell.id)):
            lines.append(f"- {o.status} `{o.cell.id}`: {o.reason}")
    return "\n".join(lines) + "\n"


def run(cells: list[Cell], progress: bool = False, listing: bool = False) -> list[Outcome]:
    """Run ``cells`` one after the other (``listing``: print each outcome as it comes)."""
    outcomes = []
    for k, cell in enumerate(cells):
        outcome = run_cell(cell)
        outcomes.append(outcome)
        if listing:
            print(
                f"{outcome.status:8s} {outcome.seconds:6.2f}s {cell.id} {outcome.reason}",
                flush=True,
            )
        if progress and (k + 1) % 50 == 0:
            print(f"{k + 1}/{len(cells)} cells", file=sys.stderr, flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every cell, not the sample")
    parser.add_argument("--markdown", action="store_true", help="print the Markdown table")
    parser.add_argument("--use", action="append", help="only these uses")
    parser.add_argument("--layout", help="only layouts whose id contains this")
    parser.add_argument("--reverse", action="store_true", help="run the cells last to first")
    parser.add_argument("--part", help="K/N: run every N-th cell from the K-th (1-based)")
    parser.add_argument("--list", action="store_true", help="one line per cell, as it runs")
    parser.add_argument("--save", help="write the Markdown table to this file as well")
    parser.add_argument(
        "--known-failing",
        action="store_true",
        help="print the wrong and error cells as entries of test_composition.KNOWN_FAILING",
    )
    args = parser.parse_args(argv)
    cells = all_cells() if args.full else sampled_cells()
    if args.use:
        cells = [c for c in cells if c.use in args.use]
    if args.layout:
        cells = [c for c in cells if args.layout in c.layout.id]
    if args.reverse:  # a second process can meet the first half-way
        cells = cells[::-1]
    if args.part:  # K/N: every N-th cell from the K-th, for N processes side by side
        k, n = (int(x) for x in args.part.split("/"))
        cells = cells[k - 1 :: n]
    start = time.perf_counter()
    outcomes = run(cells, progress=True, listing=args.list)
    elapsed = time.perf_counter() - start
    table = markdown(outcomes, title=f"{len(outcomes)} cells in {elapsed:.0f} s")
    if args.markdown:
        print(table)
    if args.save:
        Path(args.save).write_text(table)
    if args.known_failing:
        for o in outcomes:
            if o.status in ("wrong", "error"):
                print(f"    {o.cell.id!r}: {one_line(o.status + ': ' + o.reason, 160)!r},")
    total = Counter(o.status for o in outcomes)
    print(f"{len(outcomes)} cells in {elapsed:.1f} s: {dict(total)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
