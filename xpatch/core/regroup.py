"""Rows of a lazy stack in another order and chunking, a bounded number of tasks each.

Predictions reach ``reconstruct`` chunked any way along ``"patch"`` (one patch
per chunk, say) and in the user's order; overlap-add wants them in the plan's
groups. Patches of explicit anchors are cut group by group and handed out in
the caller's order. Both move rows with :func:`gather_rows`: one task per
output chunk, reading only the input chunks that hold its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.plan import chunk_starts, locate_rows

if TYPE_CHECKING:
    import dask.array as da


class Selections:
    """Per source part, ``(positions, local_rows)``: an opaque value inside a dask task.

    A plain object, so that dask does not walk the index arrays looking for keys.
    """

    __slots__ = ("count", "pairs")

    def __init__(self, count: int, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        self.count = int(count)
        self.pairs = list(pairs)

    def __getstate__(self) -> tuple:
        return self.count, self.pairs

    def __setstate__(self, state: tuple) -> None:
        self.count, self.pairs = state


def gather_rows(selections: Selections, *parts) -> np.ndarray:
    """Stack rows taken from ``parts``: ``out[positions] = part[local_rows]``.

    Examples
    --------
    >>> a, b = np.array([0, 1]), np.array([2, 3])
    >>> pairs = [(np.array([2]), np.array([1])), (np.array([0, 1]), np.array([1, 0]))]
    >>> gather_rows(Selections(3, pairs), a, b).tolist()
    [3, 2, 1]
    """
    first = np.asarray(parts[0])
    out = np.empty((selections.count, *first.shape[1:]), dtype=first.dtype)
    for (positions, local), part in zip(selections.pairs, parts):
        out[positions] = np.asarray(part)[local]
    return out


def row_sources(name: str, chunks: Sequence[int], rows: np.ndarray, index: tuple[int, ...]):
    """Keys and selections of :func:`gather_rows` for ``rows`` of the array ``name``.

    ``index`` is the block index along the other axes. Returns the source key
    alone when ``rows`` are exactly one whole chunk in order (nothing to gather).
    """
    located = locate_rows(np.asarray(rows, dtype=np.int64), chunks)
    if len(located) == 1:
        c, _, local = located[0]
        whole = len(local) == chunks[c] and (local == np.arange(chunks[c])).all()
        if whole:
            return (name, c, *index)
    keys = [(name, c, *index) for c, _, _ in located]
    selections = Selections(len(rows), [(positions, local) for _, positions, local in located])
    return (gather_rows, selections, *keys)


def take_rows(array: da.Array, rows: np.ndarray, chunks: Sequence[int]) -> da.Array:
    """``array[rows]`` along the first axis, chunked ``chunks`` there, one task per block.

    Unlike fancy indexing, every output block is one task whatever the order of
    ``rows``: it reads the input chunks that hold its rows.

    Examples
    --------
    >>> import dask.array as da
    >>> x = da.arange(6, chunks=2)
    >>> take_rows(x, np.array([5, 0, 3, 1, 2, 4]), [3, 3]).compute().tolist()
    [5, 0, 3, 1, 2, 4]
    """
    import dask.array as da

    rows = np.asarray(rows, dtype=np.int64)
    name = f"xpatch-take-{tokenize(array, rows, tuple(chunks))}"
    starts = chunk_starts(chunks)
    other = [range(len(c)) for c in array.chunks[1:]]
    layer: dict = {}
    for j in range(len(chunks)):
        selected = rows[starts[j] : starts[j + 1]]
        for index in np.ndindex(*(len(r) for r in other)):
            layer[(name, j, *index)] = row_sources(array.name, array.chunks[0], selected, index)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[array])
    return da.Array(graph, name, (tuple(int(c) for c in chunks), *array.chunks[1:]), meta=array)
