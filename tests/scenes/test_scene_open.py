"""``xpatch.patch_scenes("folder/*.tif", ...)`` opens a thousand files without reading a pixel."""

from __future__ import annotations

import numpy as np
import pytest

import xpatch

SCENES = 1000


def write_scenes(folder, count: int) -> None:
    """``count`` 16 x 16 one-band GeoTIFFs, side by side (about 0.7 s for 1,000 here)."""
    import rasterio
    from rasterio.transform import from_origin

    values = np.arange(256, dtype="uint8").reshape(1, 16, 16)
    for i in range(count):
        with rasterio.open(
            folder / f"scene{i:04d}.tif",
            "w",
            driver="GTiff",
            height=16,
            width=16,
            count=1,
            dtype="uint8",
            crs="EPSG:32631",
            transform=from_origin(300_000 + 160 * i, 4_000_000, 10, 10),
        ) as dst:
            dst.write(values + i % 7)


def test_a_thousand_scenes_are_laid_out_without_reading_pixels(tmp_path, monkeypatch):
    # Building the patcher of 1,000 files opens each header (about 5 ms a file here), so
    # this test takes some 6 s; it reads no pixel until a patch is asked for.
    rasterio = pytest.importorskip("rasterio")
    pytest.importorskip("rioxarray")
    from rasterio.vrt import WarpedVRT

    write_scenes(tmp_path, SCENES)
    reads = []
    # rioxarray's lazy loader (RasterioArrayWrapper) reads windows with DatasetReader.read,
    # through a WarpedVRT when asked to reproject.
    for cls in (rasterio.io.DatasetReader, WarpedVRT):
        for method in ("read", "read_masks"):
            real = getattr(cls, method)

            def counted(self, *args, _real=real, _method=method, **kwargs):
                reads.append((_method, self.name))
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(cls, method, counted)

    sp = xpatch.patch_scenes(str(tmp_path / "*.tif"), y=8, x=8)

    assert reads == []
    assert len(sp) == 4 * SCENES and len(sp.names) == SCENES
    assert sp.names[:2] == ("scene0000", "scene0001")
    patch = sp[4 * 999 + 3]  # the last scene's last patch
    assert reads == []  # a patch is a lazy view until its values are asked for
    expected = (np.arange(256, dtype="uint8").reshape(16, 16) + np.uint8(999 % 7))[8:, 8:]
    np.testing.assert_array_equal(patch.values[0], expected)
    assert reads and all(name.endswith("scene0999.tif") for _, name in reads)
