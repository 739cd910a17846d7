"""Groups read their neighbours' chunks through strips tasks: same values, chunks freed early."""

import dask
import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch
import xpatch.core.apply.lazy


@pytest.mark.parametrize("boundary", [{}, {"boundary": "pad", "pad_mode": "wrap"}])
def test_strips_keep_the_bytes_and_groups_read_only_their_home_chunk(boundary, monkeypatch):
    x = np.random.default_rng(0).random((2, 96, 80)).astype("float32")
    lazy = xr.DataArray(dsa.from_array(x, chunks=(2, 48, 40)), dims=("b", "y", "x"))
    eager = xr.DataArray(x, dims=("b", "y", "x"))
    kw = {"y": 16, "x": 16, "stride": 12, "window": "hann", **boundary}
    out = lazy.patch(**kw).apply(lambda b: b * 2 + 1, batch_size=8)
    graph = dict(out.data.__dask_graph__())
    input_keys = {k for k in graph if isinstance(k, tuple) and k[0] == lazy.data.name}
    partials = [k for k in graph if str(k[0]).endswith("-partial")]
    # Each partial depends on at most one whole input chunk (its home one).
    for key in partials:
        deps = dask.core.get_dependencies(graph, key)
        assert len(deps & input_keys) <= 1
    assert any(str(k[0]).endswith("-strips") for k in graph)
    # The same graph reading the neighbours' chunks whole gives the same bytes.
    monkeypatch.setattr(xpatch.core.apply.lazy, "strip_reads", lambda reads, *args: reads)
    whole = lazy.patch(**kw).apply(lambda b: b * 2 + 1, batch_size=8)
    assert not any(str(k[0]).endswith("-strips") for k in dict(whole.data.__dask_graph__()))
    assert out.values.tobytes() == whole.values.tobytes()
    np.testing.assert_allclose(out, eager.patch(**kw).apply(lambda b: b * 2 + 1).values, rtol=1e-6)
