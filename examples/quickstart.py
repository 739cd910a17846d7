"""The README example as a script: patch, predict per patch, reconstruct, check.

Run it with ``python examples/quickstart.py``.
"""

import numpy as np
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)


def main() -> None:
    da = xr.DataArray(
        np.random.default_rng(0).random((3, 100, 120), dtype=np.float32),
        dims=("band", "y", "x"),
        coords={"y": np.arange(100), "x": np.arange(120)},
    )
    p = da.patch(y=32, x=32, stride=24, window="hann")  # last patch shifted flush with the edge
    assert len(p) == 20  # 4 patch rows x 5 patch columns
    assert p.anchors().values[:3].tolist() == [[0, 0], [0, 24], [0, 48]]
    assert dict(p[0].sizes) == {"band": 3, "y": 32, "x": 32}  # with its own y/x labels
    out = p.reconstruct(p.patches() * 2)  # a per-patch "model", then weighted overlap-add
    np.testing.assert_allclose(out, da * 2, rtol=1e-6)  # exact everywhere, borders included
    print(f"{len(p)} patches of {p.size}, stride {p.stride}; reconstruction matches: OK")


if __name__ == "__main__":
    main()
