"""The output formats of :func:`xpatch.write`: the :class:`Output` protocol, and zarr.

:mod:`xpatch.io.steps` drives a write through the same steps for every format
(lock, record, create, write blocks, finish); an :class:`Output` says what each
step does to its format:

- :class:`ZarrOutput` writes into a zarr store, local or on an object store. Its
  record and lock live inside the store (``out.zarr/.xpatch/``), which zarr
  ignores. Creation is ``to_zarr(compute=False)``; finishing consolidates the
  metadata. Every key zarr writes is replaced atomically (a rename locally, one
  ``PUT`` on an object store).
- :class:`~xpatch.io.geotiff.GeoTiffOutput` writes a tiled local GeoTIFF.

A new format is a class with the protocol's attributes and methods in a module of
its own here, and a branch in :func:`xpatch.io.steps.open_output`.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Hashable
from typing import Any, Protocol

import numpy as np
import xarray as xr
from dask.base import tokenize

from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import OutputError, OutputExistsError
from xpatch.core.plan import block_regions
from xpatch.io.block_waves import STORE_TASK_PREFIX
from xpatch.io.location import Location
from xpatch.io.record import ProgressRecord, WriterLock, read_bytes, write_marker
from xpatch.xarray.provenance import facts_of, record_facts

#: Folder of the progress record inside a zarr store.
ZARR_RECORD_FOLDER = ".xpatch"


class Output(Protocol):
    """What :mod:`xpatch.io.steps` asks of an output format, step by step.

    Attributes
    ----------
    dataset
        The result as a Dataset: what the fingerprint of the computation describes.
    location
        Where the output lives (:class:`~xpatch.io.location.Location`).
    record, lock
        Its progress record and its writer's lock (:mod:`xpatch.io.record`).
    """

    dataset: xr.Dataset
    location: Location
    record: ProgressRecord
    lock: WriterLock

    def exists(self) -> bool:
        """Tell whether anything is at the output's path."""

    def looks_finished(self) -> bool:
        """Tell whether what is at the path is a finished output (no record says otherwise)."""

    def prepare(self, overwrite: bool) -> None:
        """Make way for a new write (``overwrite``: remove what is there)."""

    def wipe(self) -> None:
        """Remove what an unfinished earlier run left."""

    def create(self) -> None:
        """Create the empty output: metadata, no blocks."""

    def check_readable(self) -> None:
        """Refuse, naming the fix, to resume into an output that is missing or damaged."""

    def variables(self) -> list[Hashable]:
        """Return the variables whose blocks get markers."""

    def store_tasks(self, done: set[str]) -> StoreTasks:
        """Return the tasks that write the blocks whose markers are not in ``done``."""

    def finish(self) -> None:
        """Make the complete output visible (consolidate, rename)."""

    def tidy(self) -> None:
        """Remove what the record left, once nothing else uses it."""


class StoreTasks:
    """The store tasks of the blocks still to write, ready for :func:`xpatch.io.run_store_tasks`.

    Attributes
    ----------
    name
        The graph layer's name.
    tasks
        Store task key -> task.
    indices
        Store task key -> the index of the block it writes (for the waves).
    dependencies
        The dask arrays the tasks read.
    """

    def __init__(self, token: str) -> None:
        self.name = f"{STORE_TASK_PREFIX}{token}"
        self.tasks: dict = {}
        self.indices: dict = {}
        self.dependencies: list = []


def wave_order(dataset: Any) -> Any:
    """Return ``order(dims, index)``: a block's place in the write's waves.

    The index is taken along every dim of ``dataset`` (0 where a variable lacks
    one), the dims most variables share first: the blocks of several variables
    over the same region (the outputs of one ``apply``, which share their patch
    groups) are then written in the same wave, and each group is computed once.
    One data variable keeps the order of its block indices.

    Examples
    --------
    >>> import xarray as xr, numpy as np
    >>> ds = xr.Dataset({"a": (("c", "y"), np.zeros((2, 3))), "b": ("y", np.zeros(3))})
    >>> order = wave_order(ds)
    >>> order(("c", "y"), (0, 2)), order(("y",), (2,))
    ((2, 0), (2, 0))
    """
    shared: dict = {}
    for var in dataset.data_vars.values():
        for dim in var.dims:
            shared[dim] = shared.get(dim, 0) + 1
    for dim in dataset.dims:
        shared.setdefault(dim, 0)
    dims = sorted(shared, key=lambda d: -shared[d])  # stable: first seen first among ties

    def order(var_dims: tuple, index: tuple) -> tuple:
        where = dict(zip(var_dims, index))
        return tuple(where.get(d, 0) for d in dims)

    return order


@contextlib.contextmanager
def _record_ignored() -> Any:
    """Silence zarr's notice that the record's folder is not part of the hierarchy."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=f"Object at {ZARR_RECORD_FOLDER} is not recognized",
            category=UserWarning,
        )
        # zarr 3 notes that consolidated metadata is not in its spec yet; xarray reads it.
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        yield


def _store_zarr_block(block: np.ndarray, target: Any, region: tuple, fs: Any, marker: str) -> int:
    target[region] = block
    write_marker(fs, marker)  # after the bytes: a marker means the block is stored
    return 1


def zarr_chunk_sizes(chunks: tuple[tuple[int, ...], ...], encoded: Any = None) -> dict[int, int]:
    """Return ``{axis: size}`` for the axes whose dask ``chunks`` zarr cannot store as they are.

    Zarr chunks are regular: one size per axis, the last chunk cut short. Dask
    blocks can be anything (``(10, 7, 13)`` after a ragged ``chunk``), and xarray
    refuses to write them. Without ``encoded`` zarr chunk sizes, an axis is
    fine when its blocks are regular (all one size but a shorter last one); its
    zarr chunk is then the first block's size, as xarray picks. Otherwise the
    axis gets the size of its largest block, so the write has no more blocks than
    before. With ``encoded`` sizes (a variable's ``encoding["chunks"]``), an axis
    is fine when every block starts on a zarr chunk, else it gets the encoded size.

    Examples
    --------
    >>> zarr_chunk_sizes(((3,), (10, 7, 13), (10, 10, 4)))
    {1: 13}
    >>> zarr_chunk_sizes(((8, 8, 4),), encoded=(4,)), zarr_chunk_sizes(((6, 6),), encoded=(4,))
    ({}, {0: 4})
    """
    sizes: dict[int, int] = {}
    for axis, blocks in enumerate(chunks):
        if len(blocks) < 2:
            continue
        if encoded is not None and len(encoded) == len(chunks):
            size = int(encoded[axis])
            starts = np.cumsum(blocks[:-1])
            if np.any(starts % size):
                sizes[axis] = size
        elif any(b != blocks[0] for b in blocks[:-1]) or blocks[-1] > blocks[0]:
            sizes[axis] = max(blocks)
    return sizes


def zarr_chunked(dataset: xr.Dataset) -> xr.Dataset:
    """Return ``dataset`` with each dask variable's blocks made regular zarr chunks, lazily.

    A variable whose blocks zarr cannot store (:func:`zarr_chunk_sizes`) is
    rechunked along those axes only: every block of the result is then exactly
    one zarr chunk, or a run of whole ones, so no two blocks write into the same
    chunk (concurrent store tasks stay safe) and each block's marker in the
    progress record means whole chunks. The rechunk is deterministic, so a
    resumed run finds the same blocks. The facts recorded for a result
    (:func:`xpatch.xarray.provenance.record_facts`) carry over to its rechunked
    array, so that a refused resume still says what changed.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"v": (("y", "x"), np.zeros((30, 8)))}).chunk({"y": (10, 7, 13)})
    >>> zarr_chunked(ds)["v"].chunks
    ((13, 13, 4), (8,))
    """
    changed: dict[Hashable, xr.Variable] = {}
    for var_name, var in dataset.variables.items():
        data = var.data
        if not is_dask_array(data):
            continue
        sizes = zarr_chunk_sizes(data.chunks, var.encoding.get("chunks"))
        if not sizes:
            continue
        rechunked = data.rechunk(sizes)
        facts = facts_of(data.name)
        if facts is not None:
            record_facts(rechunked.name, facts)
        changed[var_name] = var.copy(deep=False, data=rechunked)
    if not changed:
        return dataset
    coords = {name: var for name, var in changed.items() if name in dataset.coords}
    data_vars = {name: var for name, var in changed.items() if name not in dataset.coords}
    return dataset.assign_coords(coords).assign(data_vars)


def tree_groups(tree: xr.DataTree) -> dict[str, xr.Dataset]:
    """Return the zarr group path (``""`` for the root) -> the variables of each node of ``tree``.

    Each node holds its own variables only: coordinates it inherits are stored
    in the ancestor that defines them, as ``DataTree.to_zarr`` writes them.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> tree = xr.DataTree.from_dict({"/a": xr.Dataset({"v": ("x", np.zeros(2))}), "/a/b": None})
    >>> {path: list(ds.variables) for path, ds in tree_groups(tree).items()}
    {'': [], 'a': ['v'], 'a/b': []}
    """
    groups = {}
    for node in tree.subtree:
        path = node.relative_to(tree)
        groups["" if path == "." else path] = node.to_dataset(inherit=False)
    return groups


def group_variable(group: str, name: Hashable) -> str:
    """Return the path of variable ``name`` of zarr group ``group`` from the store's root.

    Examples
    --------
    >>> group_variable("", "v"), group_variable("10m", "b02")
    ('v', '10m/b02')
    """
    return f"{group}/{name}" if group else str(name)


class ZarrOutput:
    """A zarr output at ``location``: a group holding a Dataset's variables, or a tree of groups.

    ``result`` is a Dataset (one group: the store's root) or a DataTree (one
    group per node, as ``DataTree.to_zarr`` writes it). ``groups`` maps each
    group's path (``""`` for the root) to its own variables; a block's marker
    names its variable by its path from the root (``"10m/b02"``). ``dataset``
    is the root group's variables.
    """

    def __init__(self, result: xr.Dataset | xr.DataTree, location: Location) -> None:
        self.result = result
        self.groups = tree_groups(result) if isinstance(result, xr.DataTree) else {"": result}
        self.dataset = self.groups[""]
        self.location = location
        folder = location.join(ZARR_RECORD_FOLDER)
        self.record = ProgressRecord(location.fs, folder, location.name)
        self.lock = WriterLock(location.fs, folder, location.name)
        self.store = location.zarr_store()

    def _entries(self) -> list[str]:
        fs = self.location.fs
        try:
            entries = fs.ls(self.location.root, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return [self.location.root] if fs.isfile(self.location.root) else []
        return [e for e in entries if e.rstrip("/").rsplit("/", 1)[-1] != ZARR_RECORD_FOLDER]

    def exists(self) -> bool:
        """Tell whether the store holds anything besides the record."""
        return bool(self._entries())

    def looks_finished(self) -> bool:
        """Tell whether the store's metadata was consolidated, as a finished write does."""
        data = read_bytes(self.location.fs, self.location.join("zarr.json"))
        try:
            return bool(json.loads(data or b"{}").get("consolidated_metadata"))
        except (ValueError, AttributeError):  # not JSON, or not an object
            return False

    def prepare(self, overwrite: bool) -> None:
        """Make room for the record: a plain file at the output's path is not a store."""
        fs, root = self.location.fs, self.location.root
        if fs.isfile(root):
            if not overwrite:
                raise OutputExistsError(
                    f"{self.location.name!r} is a file, not a zarr store; pass overwrite=True "
                    "to replace it, or choose another output path."
                )
            fs.rm_file(root)

    def wipe(self) -> None:
        """Remove everything in the store but the record (and the lock it holds)."""
        for entry in self._entries():
            self.location.fs.rm(entry, recursive=True)

    def create(self) -> None:
        """Write the metadata and the eager variables; dask-backed ones are allocated."""
        # mode="a": the store already holds the record and lock, which "w-" would refuse
        # and "w" would delete.
        with _record_ignored():
            self.result.to_zarr(self.store, mode="a", compute=False, consolidated=False)

    def check_readable(self) -> None:
        """Refuse a resume whose zarr metadata is missing or damaged."""
        import zarr

        try:
            with _record_ignored():
                group = zarr.open_group(self.store, mode="r+")
                for path, dataset in self.groups.items():
                    for var_name in dataset.variables:
                        group[group_variable(path, var_name)]
        except Exception as error:  # zarr raises KeyError, JSON and format errors alike
            raise OutputError(
                f"the zarr metadata of {self.location.name!r} is missing or damaged "
                f"({type(error).__name__}: {error}); its blocks cannot be resumed. Start again "
                "with overwrite=True (xpatch apply --restart)."
            ) from None

    def store_tasks(self, done: set[str]) -> StoreTasks:
        """Return the tasks that write the blocks without a marker."""
        import zarr

        group = zarr.open_group(self.store, mode="r+")
        tasks = StoreTasks(tokenize(*self.groups.values(), self.location.name))
        fs = self.location.fs
        for path, dataset in self.groups.items():
            # Each group's blocks in its own order: the blocks of nodes at several
            # resolutions over the same ground (the same index) share a wave.
            order = wave_order(dataset)
            # Data variables, and coordinates backed by dask, which to_zarr(compute=False)
            # leaves unwritten.
            for var_name, var in dataset.variables.items():
                data = var.data
                if not is_dask_array(data):
                    continue
                tasks.dependencies.append(data)
                stored = group_variable(path, var_name)
                target = group[stored]
                for index, region in block_regions(data.chunks):
                    marker = self.record.marker(stored, index)
                    if marker in done:
                        continue
                    key = (tasks.name, stored, *index)
                    tasks.indices[key] = order(var.dims, index)
                    tasks.tasks[key] = (
                        _store_zarr_block,
                        (data.name, *index),
                        target,
                        region,
                        fs,
                        marker,
                    )
        return tasks

    def variables(self) -> list[Hashable]:
        """Return the variables that get block markers."""
        return [
            group_variable(path, n)
            for path, dataset in self.groups.items()
            for n, v in dataset.variables.items()
            if is_dask_array(v.data)
        ]

    def finish(self) -> None:
        """Consolidate the metadata, so that readers open the store with one read."""
        import zarr

        with _record_ignored():
            zarr.consolidate_metadata(self.store)

    def tidy(self) -> None:
        """Remove empty folders: the record's, and the store's if creation failed.

        Object stores have no folders; local ones keep them after their files go.
        """
        if self.location.local:
            for folder in (self.record.folder, self.location.root):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
        elif "memory" in self.location.fs.protocol:
            # fsspec's memory filesystem keeps empty folders too.
            with contextlib.suppress(OSError):
                self.location.fs.rmdir(self.record.folder)
