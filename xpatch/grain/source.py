"""A Grain data source over the patches of a Patcher (optional extra ``grain``).

:class:`PatchSource` satisfies ``grain.sources.RandomAccessDataSource``
(``__len__`` and ``__getitem__(int)``), and PyTorch's map-style ``Dataset`` too.
It serves each patch from the input chunks it touches: a chunk is computed once,
held in a bounded cache shared by the read threads of its process, and sliced by
every patch that needs it. :meth:`PatchSource.chunk_shuffle` is a shuffle that
keeps that cache useful.

The source itself needs only numpy; :meth:`PatchSource.chunk_shuffle` needs
``pip install "xarray-patch[grain]"``.

Examples
--------
>>> import numpy as np, xarray as xr, xpatch
>>> scene = xr.DataArray(np.arange(256 * 256, dtype="float32").reshape(256, 256), dims=("y", "x"))
>>> src = xpatch.patch(scene, y=32, x=32, stride=24, window="hann").to_grain()
>>> len(src), sorted(src[0]), src[0]["data"].shape
(121, ['anchor', 'data', 'index', 'weights'], (32, 32))
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from dask.base import tokenize

from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES, CacheStats
from xpatch.core.errors import DimensionError, OptionError, PredictionError
from xpatch.core.sweep import reads_span, sweep_budget, waiting_row
from xpatch.grain.base import Source, mark_absl_flags_parsed
from xpatch.grain.disk_cache import DiskChunks, DiskStats
from xpatch.grain.reader import PatchReader, VariablePlan
from xpatch.grain.store_wait import RoundTrips
from xpatch.grain.zarr_chunks import ZarrChunks
from xpatch.xarray.georef import patch_transforms
from xpatch.xarray.layout import HasLayout, Layout, layout_of
from xpatch.xarray.variables import data_token


def _cache_folder(cache_dir: str | os.PathLike | None) -> Path | None:
    """Return the folder ``cache_dir`` names, made if missing; OptionError if it cannot be."""
    if cache_dir is None:
        return None
    if not isinstance(cache_dir, str | os.PathLike) or not str(cache_dir):
        raise OptionError(
            f"cache_dir={cache_dir!r} must be the path of a local folder (a str or a Path), "
            "e.g. cache_dir='/tmp/xpatch-chunks', or None for no disk cache."
        )
    folder = Path(cache_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OptionError(
            f"cache_dir={str(cache_dir)!r} is not a folder that can be made or written "
            f"({type(error).__name__}: {error}); give a writable local folder."
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OptionError(
            f"cache_dir={str(cache_dir)!r} is not writable; give a writable local folder."
        )
    return folder


#: Keys every item carries besides its data.
ITEM_KEYS = ("weights", "anchor", "index")


class PatchSource(Source):
    """Random access to the patches of a :class:`~xpatch.Patcher`, for Grain and PyTorch.

    ``src[i]`` is a dict of numpy arrays for patch ``i`` (the order of
    ``p.anchors()``):

    - ``"data"`` for a DataArray, or one entry per data variable of a Dataset
      (all cut from the same window): the patch, with the input's dims and dtype;
    - ``"weights"``: float32 over the patched dims, the blending window, 0 on
      cells past the array's edge (``boundary="pad"``); left out with
      ``weights=False``, which spares a quarter of the bytes of a float32 patch
      of 4 bands when training needs no weights;
    - ``"anchor"``: int64, the patch's start per patched dim;
    - ``"index"``: int64, ``i``;
    - ``"transform"`` with ``transform=True``: the patch's affine transform.

    Dask-backed input is read chunk by chunk: a patch is copied out of the
    chunks it touches, each computed once (one small dask computation on the
    calling thread) and kept in a least-recently-used cache of ``cache_bytes``.
    Concurrent requests for one chunk load it once. :meth:`cache_stats` counts
    loads and hits. Numpy input is sliced directly; lazily opened files without
    dask chunks are read window by window through xarray.

    The source pickles without its cache: every worker process of
    ``mp_prefetch`` or ``DataLoader(worker_count>0)`` reopens lazily opened
    files and fills its own cache. Its :attr:`fingerprint` identifies data and
    layout in every process: ``repr`` shows it (``DataLoader`` checkpoints compare
    it) and :meth:`with_fingerprint` puts it in a pipeline's checkpoints.

    Parameters
    ----------
    patcher
        The patch layout; build it with ``obj.patch(...)``.
    variables
        For a Dataset, the data variables to serve (default: every variable that
        has all of the patched dims).
    cache_bytes
        Upper bound of the chunk cache of each process, in bytes (default
        512 MiB). A sequential pass reads each chunk once if the cache holds two
        rows of chunks: the patches of one chunk reach into the next row.
    transform
        Add ``"transform"`` to every item: float64 ``(6,)``, the patch's affine
        transform in rasterio's ``Affine`` order (see ``Patcher.transforms``).
    weights
        Add ``"weights"`` to every item (default). Reconstruction does not need
        them: ``p.reconstruct`` blends with the patcher's window.
    cache_dir
        A local folder that keeps every decoded zarr chunk (one file per chunk,
        under the source's :attr:`fingerprint`), so that later epochs, the workers of
        ``mp_prefetch`` and other ranks read local disk instead of the store. Safe
        with several processes and after a kill (:mod:`xpatch.grain.disk_cache`).
        Only variables read from a zarr store directly use it; dask-computed ones
        (and sharded or CF-decoded zarr arrays) are read as without it.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> image = xr.DataArray(np.zeros((2, 64, 64), "float32"), dims=("band", "y", "x"))
    >>> ds = xr.Dataset({"image": image.chunk(x=32, y=32), "mask": image[0] > 0})
    >>> src = ds.patch(y=32, x=32, stride=16).to_grain()
    >>> item = src[3]
    >>> item["image"].shape, item["mask"].shape, item["anchor"].tolist()
    ((2, 32, 32), (32, 32), [16, 16])
    >>> src.cache_stats().loads
    4
    """

    def __init__(
        self,
        patcher: HasLayout | Layout,
        *,
        variables: Sequence[Hashable] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        transform: bool = False,
        weights: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        cache_folder = _cache_folder(cache_dir)
        if not isinstance(cache_bytes, int | np.integer) or cache_bytes < 0:
            raise OptionError(
                f"cache_bytes={cache_bytes!r} must be a number of bytes >= 0, e.g. 2**30 for 1 GiB."
            )
        for name, flag in (("transform", transform), ("weights", weights)):
            if not isinstance(flag, bool | np.bool_):
                raise OptionError(f"{name}={flag!r} must be True or False.")
        # With a halo the items are the grown patches: the layout they are read through.
        inner = layout_of(patcher)
        layout = inner.reading
        obj = layout.obj
        dims = layout.dims
        usable = layout.variables
        if isinstance(obj, xr.DataArray):
            if variables is not None:
                raise OptionError(
                    f"variables={variables!r} applies to Datasets; a DataArray's patches are "
                    "served as 'data'. Leave variables out."
                )
            chosen = {"data": next(iter(usable.values()))}
        else:
            names = list(usable) if variables is None else list(variables)
            unusable = [n for n in names if n not in usable]
            if unusable:
                raise DimensionError(
                    f"variables={variables!r}: {unusable!r} have none of the patched dims "
                    f"{list(dims)!r} (or are not data variables); those with some of them are "
                    f"{list(usable)!r}."
                )
            if not names:
                raise OptionError("variables=[] selects nothing; name at least one variable.")
            clash = [n for n in names if n in (*ITEM_KEYS, "transform")]
            if clash:
                raise OptionError(
                    f"data variable(s) {clash!r} would collide with the item keys {ITEM_KEYS}; "
                    "rename them first, e.g. ds.rename({'weights': 'weights_var'})."
                )
            chosen = {str(n): usable[n] for n in names}
        size = [layout.size[d] for d in dims]
        plans = [
            VariablePlan(name, var, dims, size, layout.pad_value) for name, var in chosen.items()
        ]
        # The items' anchors are the windows'; their cells are read from a halo before.
        anchors = inner.plan.anchors
        read_anchors = layout.plan.anchors
        # The plan's chunks (the input's, which order the patches) are the ones
        # cached, so that a pass in patch order reads chunk after chunk.
        grid = layout.plan.grid if any(plan.lazy for plan in plans) else None
        mark_absl_flags_parsed()
        self._patcher = patcher
        self._layout = layout
        self._plans = plans
        self._anchors = anchors
        self._anchor_tuples = [tuple(row) for row in anchors.tolist()]
        self._read_anchors = read_anchors
        self._read_tuples = (
            self._anchor_tuples
            if read_anchors is anchors
            else [tuple(row) for row in read_anchors.tolist()]
        )
        self._pad_mode = layout.pad_mode
        self._with_weights = bool(weights)
        self._reader = PatchReader(
            plans,
            grid,
            read_anchors,
            size,
            inner.geometry.shape,
            layout.axis_pad_modes(),
            layout.blend_window.values.astype(np.float32),
            int(cache_bytes),
        )
        self._transforms = None
        if transform:
            self._transforms = patch_transforms(obj, dims, read_anchors)
            if self._transforms is None:
                raise OptionError(
                    "transform=True needs a raster: y and x dims with regularly spaced numeric "
                    "coordinates, or a grid mapping with a GeoTransform (da.rio.write_transform())."
                )
        self._fingerprint: str | None = None  # computed on first use: it may hash the data
        if cache_folder is not None:
            self._use_disk(cache_folder)

    def _use_disk(self, folder: Path) -> None:
        # Only zarr chunks decoded here have a chunk of their own to keep; the files
        # are the fingerprint's, so another data or layout never reads them.
        kept = [plan for plan in self._plans if isinstance(plan.stored, ZarrChunks)]
        if not kept:
            warnings.warn(
                f"cache_dir={str(folder)!r} keeps nothing: none of the variables "
                f"{list(self.variables)!r} is read from a zarr store directly (in memory, "
                "computed by dask, sharded or CF-decoded). Open the zarr with "
                "xr.open_zarr(...) (chunks={} or None) and without decoding, or leave "
                "cache_dir out.",
                UserWarning,
                stacklevel=3,
            )
        for plan in kept:
            plan.stored.disk = DiskChunks(folder, self.fingerprint, plan.name)

    def disk_cache_stats(self) -> dict[str, DiskStats]:
        """Return this process's disk-cache counts per variable (``cache_dir=``).

        Variables without a disk cache are left out.
        """
        return {
            str(plan.name): plan.stored.disk.stats
            for plan in self._plans
            if isinstance(plan.stored, ZarrChunks) and plan.stored.disk is not None
        }

    # -- protocol -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._anchors)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Patch ``index`` as a dict of numpy arrays (see the class docstring)."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"patch index {index!r} must be an int.")
        n = len(self._anchors)
        position = int(index)
        if not -n <= position < n:
            raise IndexError(f"patch index {position} is out of range for {n} patches.")
        position %= n
        read_at = self._read_tuples[position]
        item = self._reader.read(position, read_at)
        if self._with_weights:
            item["weights"] = self._reader.weights(read_at)
        item["anchor"] = np.array(self._anchor_tuples[position], dtype=np.int64)
        item["index"] = np.int64(position)
        if self._transforms is not None:
            item["transform"] = self._transforms[position].copy()
        return item

    def __repr__(self) -> str:
        size = ", ".join(f"{d}: {s}" for d, s in self._layout.size.items())
        return (
            f"xpatch.PatchSource({len(self)} patches of ({size}) from a "
            f"{type(self._layout.obj).__name__} {self.variables}, fingerprint={self.fingerprint})"
        )

    # -- information ------------------------------------------------------------------

    @property
    def patcher(self) -> HasLayout | Layout:
        """The patcher (or layout) this source was built from."""
        return self._patcher

    @property
    def layout(self) -> Layout:
        """The patch layout this source serves."""
        return self._layout

    @property
    def reader(self) -> PatchReader:
        """How patches are read: chunk grid, cache and frames (one per process)."""
        return self._reader

    def item_spec(self) -> dict[str, tuple[tuple[Hashable, ...], tuple[int, ...], np.dtype]]:
        """Dims, shape and dtype of each data entry of an item, by key.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((3, 64, 64), "uint16"), dims=("band", "y", "x"))
        >>> da_.patch(y=32, x=32).to_grain().item_spec()
        {'data': (('band', 'y', 'x'), (3, 32, 32), dtype('uint16'))}
        """
        return {
            str(plan.name): (tuple(plan.var.dims), tuple(plan.patch_shape), plan.dtype)
            for plan in self._plans
        }

    @property
    def variables(self) -> tuple[str, ...]:
        """The data keys of an item: ``("data",)`` or the Dataset's variables."""
        return tuple(str(plan.name) for plan in self._plans)

    def cache_stats(self) -> CacheStats:
        """Chunk loads, hits, evictions and bytes held by this process's cache.

        ``loads / number of chunks`` is the read amplification of a pass. Each
        worker process has its own cache and counters.
        """
        return self._reader.cache.stats()

    def clear_cache(self) -> None:
        """Drop the cached chunks and reset the counters."""
        self._reader.cache.clear()

    @property
    def chunk_count(self) -> int:
        """Number of input chunks (1 for input without dask chunks)."""
        grid = self._reader.grid
        return grid.count if grid is not None else 1

    def chunk_of_patch(self) -> np.ndarray:
        """For every patch, the flat (C-order) index of the chunk holding its anchor."""
        if self._reader.grid is None:
            return np.zeros(len(self), dtype=np.int64)
        return self._layout.plan.chunk_of_patch()

    def touched_chunks(self) -> np.ndarray:
        """``(n, m)``: for every patch, the flat indices of the chunks it touches, -1 padded.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros(8), dims="x").chunk(4)
        >>> da_.patch(x=4, stride=2).to_grain().touched_chunks().tolist()
        [[0, -1], [0, 1], [1, -1]]
        """
        grid = self._reader.grid
        if grid is None:
            return np.zeros((len(self), 1), dtype=np.int64)
        reader = self._reader
        return grid.touched_ids(self._read_anchors, reader.size, reader.pad_mode)

    def shuffle_groups(self) -> np.ndarray:
        """Return the groups :meth:`chunk_shuffle` visits: a chunk per patch, or all it touches.

        When patches straddle chunk borders and the cache holds every chunk's
        frame (the edges that straddling patches read) besides a chunk, a
        straddling patch comes with the last of its chunks and the cache keeps
        frames of the chunks it evicts: each chunk is then read once per epoch.
        Otherwise a patch comes with the chunk of its anchor, and frames are off
        (a sequential pass does better without them).
        """
        if not self._reader.frames_fit():
            return self.chunk_of_patch()
        self._reader.keep_frames()
        return self.touched_chunks()

    def chunk_grids(self) -> list[tuple[int, ...]]:
        """Return the number of chunks along each patched axis: ``[(1,)]`` without chunks."""
        grid = self._reader.grid
        return [grid.numblocks if grid is not None else (1,)]

    def sweep_settings(self, mix: int | None, ahead: int | None) -> tuple[int, int]:
        """Return ``(mix, ahead)`` of a sweep within ``cache_bytes``; keep frames when they pay."""
        chunk_bytes, share = self._reader.sweep_costs()
        if 0 < share < 1:
            self._reader.keep_frames()
        waiting = waiting_row(self.chunk_grids()[0]) * share * chunk_bytes
        span = reads_span(len(self), self.chunk_count)
        cache_bytes = self._reader.cache_bytes
        return sweep_budget(cache_bytes, chunk_bytes, int(waiting), span, mix, ahead)

    def read_ahead(self, chunk: int, wanted: Callable[[], bool] | None = None) -> None:
        """Load chunk ``chunk`` (a flat C-order index) into this process's cache, if wanted."""
        self._reader.read_ahead(chunk, wanted)

    def release(self, chunk: int, keep_frame: bool) -> None:
        """Drop chunk ``chunk`` from this process's cache, keeping its frame or not."""
        self._reader.release(chunk, keep_frame)

    def fetch_depth(self) -> int:
        """Chunks whose stored bytes a sweep may fetch beyond its reads ahead (0: none)."""
        return self._reader.fetch_depth()

    def fetch_round_trips(self) -> RoundTrips | None:
        """Return the fetches whose queueing sets how many go out ahead (None: as asked)."""
        return self._reader.fetch_round_trips()

    def fetch_chunk_bytes(self, chunk: int) -> None:
        """Start fetching the stored bytes of chunk ``chunk`` (decoded when it is read)."""
        self._reader.fetch_chunk_bytes(chunk)

    def set_sweep_direction(self, reversed_axes: list[tuple[bool, ...]]) -> None:
        """Keep, of evicted chunks, the frame sides facing the chunks the sweep visits later."""
        self._reader.set_sweep_direction(reversed_axes[0])

    def make_fingerprint(self) -> str:
        """Compute :attr:`fingerprint`: 16 hex digits for the layout and the data served.

        It covers the patched dims, size, stride, boundary, window,
        ``pad_value`` and ``pad_mode``; the sampler's kind and its anchors in order (``min_valid``
        acts through them); the variables served (names, dims, shapes, dtypes; not
        their order, which xarray may change from one open of a zarr to the next);
        ``transform=True``; whether :meth:`chunk_shuffle` serves straddling patches
        with their last chunk (:meth:`shuffle_groups`, which ``cache_bytes`` decides);
        and each variable's data token: the graph's name for
        dask data (xarray derives it from the file's path and modification time), a
        hash of the values for data in memory, path and modification time for a file
        opened without dask chunks. The same construction gives the same fingerprint
        in every process. Data rewritten in place under the same path and time (a
        zarr store's time is its folder's) keeps it: write new data to a new path.

        Computed on first use (``repr`` shows it) and pickled with the source. Dask
        and file data cost nothing (no chunk is read); data in memory costs one hash
        of its bytes (about 1 GB/s).

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64), "float32"), dims=("y", "x"))
        >>> fp = da_.patch(y=32, x=32, stride=16).to_grain().fingerprint
        >>> len(fp), fp == da_.patch(y=32, x=32, stride=16).to_grain().fingerprint
        (16, True)
        >>> fp in {da_.patch(y=32, x=32, stride=8).to_grain().fingerprint,
        ...        (da_ + 1).patch(y=32, x=32, stride=16).to_grain().fingerprint}
        False
        """
        p, g = self._layout, self._layout.geometry
        # By name: xarray opens a zarr's variables in an order that can change from one
        # open to the next (zarr lists a group's members as they answer).
        variables = sorted(
            (
                (v.name, v.var.dims, v.var.shape, str(v.dtype), v.pad_value, data_token(v.var))
                for v in self._plans
            ),
            key=lambda entry: str(entry[0]),
        )
        # Files opened without dask chunks (not in memory): zarr names its path on the Dataset.
        unread = [v for v in self._plans if not (v.dask or getattr(v.var, "_in_memory", 1))]
        # The pad mode only when not the default: older fingerprints stay valid.
        padding = () if self._pad_mode == "constant" else (self._pad_mode,)
        # Whether straddling patches come with their last chunk changes the
        # chunk-shuffled order; only then is it named, so other fingerprints stay.
        grouping = ("straddlers last",) if self._reader.frames_fit() else ()
        return tokenize(
            ("xpatch.PatchSource v1", type(p.obj).__name__, p.dims, g.shape, g.size),
            (g.stride, g.boundary, type(p.sampler).__qualname__, self._anchors),
            (p.blend_window.values, variables, self._transforms),
            p.obj.encoding.get("source") if unread else None,
            *padding,
            *grouping,
        )[:16]

    # -- predictions ----------------------------------------------------------------

    def predictions(
        self,
        values: Any,
        *,
        index: Any,
        dims: Sequence[Hashable],
        name: Hashable | None = None,
    ) -> xr.DataArray:
        """Predictions gathered from a pipeline, as ``p.reconstruct`` takes them.

        Parameters
        ----------
        values
            ``(n, *dims)`` outputs, one per patch, in any order (stack the
            batches of a pipeline).
        index
            ``(n,)`` the ``"index"`` of each item, as the pipeline delivered it.
        dims
            Names of the dims of one prediction, e.g. ``("class", "y", "x")``;
            must include the patched dims with the patch size.
        name
            Name of the returned DataArray.

        Returns
        -------
        xarray.DataArray
            dims ``("patch", *dims)`` in patch order, with ``{dim}_anchor``
            coordinates.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.arange(16.0).reshape(4, 4), dims=("y", "x"))
        >>> p = da_.patch(y=2, x=2)
        >>> src = p.to_grain()
        >>> items = [src[i] for i in (3, 1, 0, 2)]
        >>> pred = src.predictions(
        ...     np.stack([it["data"] for it in items]), index=[it["index"] for it in items],
        ...     dims=("y", "x"))
        >>> bool(p.reconstruct(pred).equals(da_))
        True
        """
        n = len(self)
        if isinstance(dims, str) or "patch" in dims or len(set(dims)) != len(dims):
            raise PredictionError(
                f"dims={dims!r} must be a sequence of distinct dim names other than 'patch', "
                "one per axis of a prediction, e.g. ('class', 'y', 'x')."
            )
        index = np.asarray(index)
        if index.size == 0:
            index = index.astype(np.int64)
        values = np.asarray(values)
        if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
            raise PredictionError(
                f"index must be a 1-D sequence of ints (the items' 'index'); got shape "
                f"{index.shape} of dtype {index.dtype}."
            )
        if values.ndim != len(dims) + 1 or len(values) != len(index):
            raise PredictionError(
                f"values has shape {values.shape}; with dims={tuple(dims)!r} and {len(index)} "
                f"indices it must be ({len(index)}, <one size per dim>)."
            )
        counts = np.bincount(index[(index >= 0) & (index < n)], minlength=n)
        if (index < 0).any() or (index >= n).any() or (counts != 1).any():
            missing = np.flatnonzero(counts == 0)[:5].tolist()
            repeated = np.flatnonzero(counts > 1)[:5].tolist()
            outside = index[(index < 0) | (index >= n)][:5].tolist()
            raise PredictionError(
                f"index must name each of the {n} patches once; missing {missing}, repeated "
                f"{repeated}, out of range {outside} (first few shown). Collect one prediction "
                "per patch (drop_remainder=False, every shard)."
            )
        order = np.argsort(index, kind="stable")
        coords = {
            f"{d}_anchor": ("patch", self._anchors[:, j].copy())
            for j, d in enumerate(self._layout.dims)
        }
        return xr.DataArray(values[order], dims=("patch", *dims), coords=coords, name=name)
