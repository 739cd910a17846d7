"""The source's fingerprint, and checkpoints that refuse a restore into another source.

A Grain pipeline's state is a position (``{"next_index": n}``): restored into a
pipeline over another stride, window or data it would carry on silently. The
fingerprint names the source; ``src.with_fingerprint`` and the iterators of
``src.chunk_shuffle`` put it in the state and refuse a state of another source.
"""

from __future__ import annotations

import json
import pickle

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch
import xpatch.grain.source
from tests.conftest import forbid_compute, run_script

grain = pytest.importorskip("grain")


def values() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(3, 64, 80)).astype("float32")


def dask_scene(data: np.ndarray | None = None) -> xr.DataArray:
    data = values() if data is None else data
    return xr.DataArray(dsa.from_array(data, chunks=(3, 16, 16)), dims=("band", "y", "x"))


def fingerprint(obj, to_grain: dict | None = None, **patch) -> str:
    options = {"y": 24, "x": 24, "stride": 12, **patch}
    return obj.patch(**options).to_grain(**(to_grain or {})).fingerprint


def indices(batches) -> list[list[int]]:
    return [batch["index"].tolist() for batch in batches]


# -- the fingerprint --------------------------------------------------------------------


def test_the_same_construction_gives_the_same_short_hex_fingerprint():
    for make in (lambda: xr.DataArray(values(), dims=("band", "y", "x")), dask_scene):
        first, second = fingerprint(make()), fingerprint(make())
        assert first == second
        assert len(first) == 16 and int(first, 16) >= 0
    src = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    assert repr(src).endswith(f"fingerprint={src.fingerprint})")


def test_in_memory_values_in_any_memory_layout_give_the_same_fingerprint():
    # dask hashes an array's bytes in memory order: a Fortran-order copy (e.g. from
    # pandas) or one with its axes permuted in memory named other data.
    data = values()
    padded = np.zeros((3, 128, 80), dtype="float32")
    padded[:, ::2] = data
    permuted = np.ascontiguousarray(data.transpose(1, 0, 2)).transpose(1, 0, 2)
    layouts = [data, np.asfortranarray(data), permuted, padded[:, ::2]]
    prints = {fingerprint(xr.DataArray(v, dims=("band", "y", "x"))) for v in layouts}
    assert len(prints) == 1
    changed = data.copy()
    changed[1, 2, 3] += 1
    other = xr.DataArray(np.asfortranarray(changed), dims=("band", "y", "x"))
    assert fingerprint(other) not in prints


def test_each_part_of_the_layout_changes_the_fingerprint():
    scene = dask_scene()
    raster = xr.DataArray(
        values(), dims=("band", "y", "x"), coords={"y": 100.0 - np.arange(64), "x": np.arange(80.0)}
    )
    holes = values()
    holes[:, :30, :40] = np.nan  # min_valid drops the patches in here
    holey = dask_scene(holes)
    layouts = {
        "base": fingerprint(scene),
        "stride": fingerprint(scene, stride=8),
        "size": fingerprint(scene, y=16),
        "window": fingerprint(scene, window="hann"),
        "boundary": fingerprint(scene, stride=20, boundary="pad"),
        "pad_value": fingerprint(scene, stride=20, boundary="pad", pad_value=0.0),
        "sampler": fingerprint(scene, stride=None, sampler=xpatch.RandomAnchors(20, seed=1)),
        "sampler anchors": fingerprint(
            scene, stride=None, sampler=xpatch.RandomAnchors(20, seed=2)
        ),
        "explicit anchors": fingerprint(
            scene, stride=None, sampler=xpatch.Anchors({"y": [0, 12], "x": [0, 0]})
        ),
        "other explicit anchors": fingerprint(
            scene, stride=None, sampler=xpatch.Anchors({"y": [12, 0], "x": [0, 0]})
        ),
        "holes": fingerprint(holey),
        "min_valid": fingerprint(holey, min_valid=0.5),
        "raster": fingerprint(raster),
        "transform": fingerprint(raster, to_grain={"transform": True}),
        "moved raster": fingerprint(raster.assign_coords(x=raster.x + 5), {"transform": True}),
    }
    assert len(set(layouts.values())) == len(layouts), layouts


def test_the_variables_served_change_the_fingerprint():
    image = dask_scene()
    ds = xr.Dataset({"image": image, "mask": image.isel(band=0) > 0})
    both = fingerprint(ds)
    assert fingerprint(ds, to_grain={"variables": ["image", "mask"]}) == both
    assert fingerprint(ds, to_grain={"variables": ["image"]}) != both
    # Not the order: items are dicts read by key, and xarray may open a zarr's variables
    # in another order each time, which must not refuse a resume.
    assert fingerprint(ds, to_grain={"variables": ["mask", "image"]}) == both
    assert fingerprint(ds.rename(mask="label")) != both
    assert fingerprint(ds.assign(mask=ds["mask"].astype("uint8"))) != both


def test_numpy_data_is_fingerprinted_by_its_values():
    data = values()
    base = fingerprint(xr.DataArray(data, dims=("band", "y", "x")))
    assert fingerprint(xr.DataArray(data.copy(), dims=("band", "y", "x"))) == base
    changed = data.copy()
    changed[2, 63, 79] += 1  # one value, in the last patch only
    assert fingerprint(xr.DataArray(changed, dims=("band", "y", "x"))) != base
    mask = xr.Dataset({"a": (("y", "x"), data[0]), "b": (("y", "x"), data[1])})
    assert fingerprint(mask) != fingerprint(mask.assign(b=mask.b.where(mask.b > -3, 0)))


def test_dask_data_is_fingerprinted_by_its_graph_and_file(tmp_path):
    data = values()
    base = fingerprint(dask_scene(data))
    assert fingerprint(dask_scene(data + 1)) != base
    assert fingerprint(dask_scene(data) * 1) != base  # another graph, equal values
    stores = []
    for name, content in (("a.zarr", data), ("b.zarr", data), ("c.zarr", data + 1)):
        path = tmp_path / name
        scene = xr.DataArray(content, dims=("band", "y", "x"), name="scene")
        scene.chunk({"y": 16, "x": 16}).to_dataset().to_zarr(path)
        stores.append(path)
    opened = [fingerprint(xr.open_zarr(path)["scene"]) for path in stores]
    assert len(set(opened)) == 3  # another file: another token, even with equal values
    assert fingerprint(xr.open_zarr(stores[0])["scene"]) == opened[0]  # reopened: the same


def test_the_fingerprint_is_computed_once_lazily_and_travels_in_pickles(monkeypatch):
    calls = []
    token = xpatch.grain.source.data_token
    monkeypatch.setattr(
        xpatch.grain.source, "data_token", lambda var: calls.append(1) or token(var)
    )
    ds = xr.Dataset({"a": (("y", "x"), values()[0]), "b": (("y", "x"), values()[1])})
    src = ds.patch(y=24, x=24).to_grain()
    assert calls == []  # building the source hashes nothing
    first = src.fingerprint
    assert len(calls) == 2  # one hash per variable
    assert src.fingerprint == first and repr(src).endswith(f"{first})")
    clone = pickle.loads(pickle.dumps(src))
    assert clone.fingerprint == first and len(calls) == 2  # carried, not recomputed
    with forbid_compute():  # dask data: the graph's name, nothing computed
        assert len(dask_scene().patch(y=24, x=24).to_grain().fingerprint) == 16


SOURCES = """
import numpy as np, xarray as xr, dask.array as dsa, xpatch
values = np.random.default_rng(0).normal(size=(3, 64, 80)).astype("float32")
scene = xr.DataArray(dsa.from_array(values, chunks=(3, 16, 16)), dims=("band", "y", "x"))
ds = xr.Dataset({"image": scene, "mask": xr.DataArray(values[0] > 0, dims=("y", "x"))})
sources = [
    scene.patch(y=24, x=24, stride=12).to_grain(),
    ds.patch(y=24, x=24, window="hann", sampler=xpatch.JitteredGrid(3, seed=7)).to_grain(),
]
"""


def test_the_fingerprint_is_the_same_in_another_process():
    here: dict = {}
    exec(SOURCES, here)
    expected = [src.fingerprint for src in here["sources"]]
    printed = run_script(SOURCES + "print(*[src.fingerprint for src in sources])").split()
    assert printed == expected and len(set(expected)) == 2


class FingerprintInWorker(grain.transforms.Map):
    """Replace every element by its source's fingerprint, computed where it runs."""

    def __init__(self, source) -> None:
        self.source = source

    def map(self, element):
        return self.source.fingerprint


def test_a_spawned_grain_worker_computes_the_same_fingerprint():
    src = xr.DataArray(values(), dims=("band", "y", "x")).patch(y=24, x=24).to_grain()
    dataset = grain.MapDataset.range(4).map(FingerprintInWorker(src)).to_iter_dataset()
    iterator = iter(dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    in_workers = set(iterator)  # pickled before the fingerprint was computed here
    iterator.close()
    assert in_workers == {src.fingerprint}


# -- checkpoints ------------------------------------------------------------------------


def readme_pipeline(source, **options):
    """The README's pipeline, ended with the fingerprint."""
    return (
        grain.MapDataset.source(source)
        .pipe(source.chunk_shuffle, seed=42)
        .batch(8)
        .to_iter_dataset(**options)
        .pipe(source.with_fingerprint)
    )


def chunk_shuffle_pipeline(source, **options):
    """The chunk shuffle's own iterator: no explicit with_fingerprint."""
    return source.chunk_shuffle(seed=42).to_iter_dataset(**options).batch(8)


OTHERS = {
    "stride": lambda scene: scene.patch(y=24, x=24, stride=8),
    "window": lambda scene: scene.patch(y=24, x=24, stride=12, window="hann"),
    "data": lambda scene: (scene + 1).patch(y=24, x=24, stride=12),
}


@pytest.mark.parametrize("build", [readme_pipeline, chunk_shuffle_pipeline])
def test_a_checkpoint_resumes_exactly_in_an_equal_source_and_is_refused_in_another(build):
    scene = dask_scene()
    src = scene.patch(y=24, x=24, stride=12).to_grain()
    iterator = iter(build(src))
    for _ in range(3):
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))  # as a checkpoint stores it
    assert state["xpatch_fingerprint"] == src.fingerprint
    rest = indices(iterator)
    # A source rebuilt over the same data, as after a restart: the exact next batch.
    again = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    restored = iter(build(again))
    restored.set_state(state)
    assert indices(restored) == rest
    for kind, other_layout in OTHERS.items():
        other = other_layout(scene).to_grain()
        target = iter(build(other))
        with pytest.raises(xpatch.OptionError) as refused:
            target.set_state(state)
        message = str(refused.value)
        assert src.fingerprint in message and other.fingerprint in message, kind
        assert "rebuild the source as it was saved" in message
        if kind != "data":  # the layouts are shown side by side
            assert "stride=(y: 12, x: 12)" in message
        # Refused before the position moved: the target still starts at the beginning.
        assert indices(target)[0] == indices(build(other))[0]


def test_a_plain_grain_state_is_refused_unless_wrapped_with_this_fingerprint():
    src = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    plain = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=42).batch(8)
    iterator = iter(plain.to_iter_dataset())
    next(iterator)
    state = iterator.get_state()
    assert state == {"next_index": 1}  # grain's own state names no source
    rest = indices(iterator)
    restored = iter(readme_pipeline(src))
    with pytest.raises(xpatch.OptionError, match="without 'xpatch_fingerprint'"):
        restored.set_state(state)
    restored.set_state({"xpatch_fingerprint": src.fingerprint, "pipeline": state})
    assert indices(restored) == rest


def test_with_fingerprint_wraps_iter_datasets_once_and_refuses_the_rest():
    src = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    mapped = grain.MapDataset.source(src)
    with pytest.raises(xpatch.OptionError, match=r"call \.to_iter_dataset\(\) first"):
        src.with_fingerprint(mapped)
    with pytest.raises(xpatch.OptionError, match=r"pass a grain\.IterDataset"):
        src.with_fingerprint([src[0]])
    wrapped = mapped.to_iter_dataset().pipe(src.with_fingerprint)
    assert wrapped.pipe(src.with_fingerprint) is wrapped
    iterator = iter(wrapped)
    next(iterator)
    assert iterator.get_state()["pipeline"] == {"next_index": 1}  # not nested twice


def test_a_dataloader_checkpoint_is_refused_by_a_source_with_another_fingerprint():
    def loader(source):
        sampler = grain.samplers.IndexSampler(
            len(source),
            shuffle=True,
            seed=1,
            num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        )
        return grain.DataLoader(data_source=source, sampler=sampler, worker_count=0)

    scene = dask_scene()
    src = scene.patch(y=24, x=24, stride=12).to_grain()
    iterator = iter(loader(src))
    next(iterator)
    state = iterator.get_state()
    other = scene.patch(y=24, x=24, stride=12, window="hann").to_grain()
    with pytest.raises(ValueError, match=other.fingerprint):
        iter(loader(other)).set_state(state)


TWO_WORKERS = grain.MultiprocessingOptions(num_workers=2)


def test_checkpoints_through_worker_processes_resume_or_are_refused():
    scene = dask_scene()
    src = scene.patch(y=24, x=24, stride=12).to_grain()
    other = scene.patch(y=24, x=24, stride=8).to_grain()

    def last(source):  # the fingerprint after mp_prefetch: set_state refuses
        ds = grain.MapDataset.source(source).pipe(source.chunk_shuffle, seed=42).batch(8)
        return ds.to_iter_dataset().mp_prefetch(TWO_WORKERS).pipe(source.with_fingerprint)

    iterator = iter(last(src))
    head = [next(iterator)["index"].tolist() for _ in range(3)]
    state = iterator.get_state()
    rest = indices(iterator)
    iterator.close()
    assert head + rest == indices(readme_pipeline(src))
    restored = iter(last(dask_scene().patch(y=24, x=24, stride=12).to_grain()))
    restored.set_state(state)
    assert indices(restored) == rest
    restored.close()
    refusing = iter(last(other))
    with pytest.raises(xpatch.OptionError, match=other.fingerprint):
        refusing.set_state(state)
    refusing.close()

    # The chunk shuffle's own iterator runs in the workers: the first next refuses.
    def inside(source):
        return source.chunk_shuffle(seed=42).to_iter_dataset().batch(8).mp_prefetch(TWO_WORKERS)

    iterator = iter(inside(src))
    next(iterator)
    state = iterator.get_state()
    iterator.close()
    refusing = iter(inside(other))
    refusing.set_state(state)
    with pytest.raises(xpatch.OptionError, match=src.fingerprint):
        next(refusing)
    refusing.close()


@pytest.mark.parametrize(
    "change",
    [{"seed": 8}, {"shard": 1}, {"batch": 3}, {"workers": 3}],
    ids=["seed", "shard", "batch", "dealing"],
)
def test_a_checkpoint_refuses_a_pipeline_that_orders_the_elements_otherwise(change):
    # chunk_shuffle's seed and shard_options were never checked: a restore served other
    # elements at the same position.
    da_ = xr.DataArray(np.arange(64.0 * 64).reshape(64, 64), dims=("y", "x")).chunk(16)
    src = da_.patch(y=8, x=8).to_grain()

    def pipeline(seed=7, shard=0, batch=4, workers=2):
        options = grain.sharding.ShardOptions(shard_index=shard, shard_count=2)
        shuffled = grain.MapDataset.source(src).pipe(
            src.chunk_shuffle, seed=seed, shard_options=options, worker_count=workers,
            batch_size=batch,
        )  # fmt: skip
        return shuffled.batch(batch).to_iter_dataset().pipe(src.with_fingerprint)

    iterator = iter(pipeline())
    next(iterator)
    state = iterator.get_state()
    again = iter(pipeline())
    again.set_state(state)  # the same pipeline resumes
    with pytest.raises(xpatch.OptionError, match=r"another\s+pipeline"):
        iter(pipeline(**change)).set_state(state)


def test_a_checkpoint_from_before_the_sweep_resumes_with_order_chunk_and_says_so():
    da_ = xr.DataArray(np.arange(64.0 * 64).reshape(64, 64), dims=("y", "x")).chunk(16)
    src = da_.patch(y=8, x=8).to_grain()

    def pipeline(**options):
        shuffled = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=7, **options)
        return shuffled.batch(4).to_iter_dataset().pipe(src.with_fingerprint)

    iterator = iter(pipeline(order="chunk"))
    next(iterator)
    state = iterator.get_state()
    # What a checkpoint of the previous default recorded: no order in the signature.
    assert state["xpatch_order"] == "batch=4;chunk_shuffle(seed=7)"
    with pytest.raises(xpatch.OptionError, match="pass order='chunk' to chunk_shuffle"):
        iter(pipeline()).set_state(state)
    restored = iter(pipeline(order="chunk"))
    restored.set_state(state)
    assert next(restored)["index"].tolist() == next(iterator)["index"].tolist()
    # Another mix is another order: refused, without the hint.
    swept = iter(pipeline(mix=2))
    next(swept)
    with pytest.raises(xpatch.OptionError) as refused:
        iter(pipeline(mix=3)).set_state(swept.get_state())
    assert "order='chunk'" not in str(refused.value)


def test_variables_chunked_differently_plan_the_same_chunks_in_any_order():
    # xarray can open a zarr's variables in another order from one open to the next.
    values = np.random.default_rng(0).random((32, 64))
    mixed = xr.Dataset(
        {
            "a": xr.DataArray(values, dims=("y", "x")).chunk({"y": 8}),
            "b": xr.DataArray(values + 1, dims=("y", "x")).chunk({"y": 16}),
        }
    )
    one = mixed.patch(y=8, x=16).to_grain()
    other = mixed[["b", "a"]].patch(y=8, x=16).to_grain()
    assert one.chunk_grids() == other.chunk_grids()
    assert one.fingerprint == other.fingerprint
