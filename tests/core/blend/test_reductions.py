"""Reductions are objects: a new one is a subclass in one module, eager and lazy alike."""

from __future__ import annotations

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)
from xpatch.core.blend import reductions
from xpatch.core.blend.placement import Landing, Partial, Piece
from xpatch.core.blend.reductions import (
    MEAN,
    Reduction,
    as_reduction,
    register,
)
from xpatch.core.errors import OptionError


class Count(Reduction):
    """A toy reduction, written here only: how many valid predictions cover each cell."""

    name = "count"

    def accumulation_dtype(self, dtype, window=None, covered=False):
        return np.dtype(np.float64)

    def block(self, out: np.ndarray, landing: Landing, shared: object = None) -> np.ndarray:
        k = len(landing.shape)
        lead = (slice(None),) * (out.ndim - k)
        out.fill(0)
        for p in landing.placements:
            values = landing.groups[p.group][(p.row, *lead, *p.patch_index)]
            out[lead + p.block_index] += ~np.isnan(values)
        return out

    def partial(self, landing: Landing, box, acc, reaching) -> Partial:
        total = self.block(np.empty(box, dtype=acc), landing)
        return Partial(landing.origin, total, None, reaching)

    def combine(self, out_shape, acc, pieces: list[Piece], block) -> np.ndarray:
        out = np.zeros(out_shape, dtype=acc)
        for piece in pieces:
            out[piece.region] += piece.partial.total
        return out


def brute_count(p, pred: np.ndarray) -> np.ndarray:
    """Per cell, the number of patches with a valid value there."""
    counts = np.zeros(p.obj.shape)
    for row, anchor in enumerate(p.anchors().values):
        index = tuple(slice(a, a + n) for a, n in zip(anchor, p.size.values()))
        counts[index] += ~np.isnan(pred[row])
    return counts


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_a_toy_reduction_from_one_module_reconstructs_and_applies(lazy):
    values = np.random.default_rng(0).random((30, 41))
    da = xr.DataArray(values, dims=("y", "x"))
    if lazy:
        da = da.chunk({"y": 13, "x": 17})
    p = da.patch(y=8, x=10, stride=5)
    pred = p.patches().compute()
    pred[3, 0, 0] = np.nan  # one invalid value is not counted
    expected = brute_count(p, pred.values)
    given = pred.chunk({"patch": 7}) if lazy else pred
    got = p.reconstruct(given, reduce=Count())
    assert isinstance(got.data, dsa.Array) == lazy
    np.testing.assert_array_equal(got.values, expected)
    applied = p.apply(lambda b: b * 2, reduce=Count())
    np.testing.assert_array_equal(applied.values, brute_count(p, np.ones(pred.shape)))


def test_a_registered_reduction_is_known_by_its_name(monkeypatch):
    monkeypatch.setattr(reductions, "_REGISTRY", dict(reductions._REGISTRY))  # for this test
    counting = register(Count())
    assert as_reduction("count") is counting
    da = xr.DataArray(np.ones((6, 6)), dims=("y", "x"))
    p = da.patch(y=4, x=4, stride=2)
    assert p.reconstruct(p.patches(), reduce="count").values[2, 2] == 4


def test_reductions_tokenize_as_their_names_and_refuse_unknown_ones():
    from dask.base import tokenize

    assert tokenize(MEAN) == tokenize("mean")  # graphs keep the names they had
    with pytest.raises(OptionError, match="reduce='median' is not a known reduce"):
        as_reduction("median")
    with pytest.raises(OptionError, match="argmax"):
        as_reduction("argmax")  # only where a label map can be made
    assert as_reduction("argmax", argmax=True).blend is MEAN
