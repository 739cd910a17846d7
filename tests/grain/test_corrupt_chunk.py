"""A damaged chunk of a zarr store: the error names the variable, the chunk and the store."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401  (the .patch accessor)
from xpatch.grain.zarr_chunks import ChunkReadError

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped":
        for i in range(10, len(data), 7):
            data[i] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


def _source(tmp_path, zarr_format: int, how: str):
    store = tmp_path / "scene.zarr"
    values = np.random.default_rng(0).random((2, 64, 64), dtype="float32")
    image = xr.DataArray(values, dims=("band", "y", "x"), name="image")
    # zstd checks what it decodes; blosc may read past a truncated chunk and pass.
    if zarr_format == 3:
        codec = {"compressors": [zarr.codecs.ZstdCodec()]}
    else:
        codec = {"compressors": [numcodecs.Zstd()]}
    image.to_dataset().chunk({"y": 32, "x": 32}).to_zarr(
        store, zarr_format=zarr_format, consolidated=False, encoding={"image": codec}
    )
    key = "c/0/0/1" if zarr_format == 3 else "0.0.1"
    _damage(store / "image" / key, how)
    opened = xr.open_zarr(store, consolidated=False)
    return opened.patch(y=16, x=16).to_grain(), key, store


@pytest.mark.parametrize("how", ["flipped", "truncated"])
@pytest.mark.parametrize("zarr_format", [3, 2])
def test_a_damaged_chunk_names_variable_chunk_and_store(tmp_path, how, zarr_format) -> None:
    src, key, store = _source(tmp_path, zarr_format, how)
    assert src[0]["image"].shape == (2, 16, 16)  # the chunks left whole read as before
    with pytest.raises(ChunkReadError) as caught:
        for i in range(len(src)):  # the damaged chunk holds x 32 to 64 of the first rows
            src[i]
    message = str(caught.value)
    assert "'image'" in message
    assert f"'{key}'" in message
    assert str(store) in message
    assert "x=32:64" in message
    cause = caught.value.__cause__
    while isinstance(cause, ChunkReadError):
        cause = cause.__cause__
    assert cause is not None  # the codec's own error, chained
    assert not isinstance(cause, ChunkReadError)
