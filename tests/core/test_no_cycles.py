"""Code that handles input chunks must free them when it returns, not at a gc pass.

A nested function that calls itself is a reference cycle: whatever it closes over
(the chunks it nests) lives until the cycle collector runs, which a numpy-heavy
task, allocating few Python objects, rarely triggers. One such closure held the
input chunks of a 1 GiB write: 110 MiB more at its peak.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import dask.array as dsa
import numpy as np
import pytest

from xpatch.core import extract
from xpatch.core.chunk_cache import read_region


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_cutting_patches_from_pieces_frees_the_pieces(no_gc):
    block = np.ones((1, 8, 8))
    gone = weakref.ref(block)
    crops = [[slice(None)], [slice(0, 8)], [slice(0, 8)]]
    patches = extract.cut_from_pieces([[[block]]], crops, [1, 2], np.array([[0, 0]]), [4, 4])
    del block
    assert gone() is None
    assert patches.shape == (1, 1, 4, 4)


def test_reading_a_region_of_several_chunks_frees_the_chunks(no_gc):
    # Two fresh 8 MB blocks per read (dsa.ones would give broadcast views, no memory).
    array = dsa.random.default_rng(0).random((2000, 1000), chunks=(1000, 1000))
    tracemalloc.start()
    try:
        region = read_region(array, [0, 1], [slice(0, 2000), slice(0, 1000)])
        assert region.shape == (2000, 1000)
        del region
        live, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert live < 2**20  # neither the blocks (16 MB) nor the result
