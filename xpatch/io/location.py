"""Where an output lives: a local path, an fsspec URL or a zarr store.

:func:`locate` turns what the caller gave :func:`xpatch.write` into a
:class:`Location`: an fsspec filesystem (synchronous, picklable) and a path on it,
plus the zarr store that writes there. The progress record and the writer's lock
(:mod:`xpatch.io.record`) use the filesystem; the data goes through the zarr store.
A URL is never mistaken for a local folder: a scheme fsspec does not know, or one
whose package is missing, is refused before anything is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from xpatch.core.errors import MissingDependencyError, OptionError

#: Schemes whose fsspec filesystems cannot write.
READ_ONLY_SCHEMES = ("http", "https")

#: The package that gives fsspec each common scheme, for the message when it is missing.
SCHEME_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}


@dataclass(frozen=True)
class Location:
    """An output's filesystem and path, and how to name it in messages.

    Attributes
    ----------
    fs
        A synchronous fsspec filesystem; it pickles, so store tasks on dask
        workers write their progress markers through it.
    root
        The output's path on ``fs`` (no scheme).
    name
        The path or URL as the caller gave it.
    storage_options
        Passed to fsspec for URLs (empty for local paths).
    store
        The zarr store the caller gave, if any.
    """

    fs: Any
    root: str
    name: str
    storage_options: dict = field(default_factory=dict)
    store: Any = None

    @property
    def local(self) -> bool:
        """True when the output is on the local filesystem."""
        return isinstance(self.fs, LocalFileSystem)

    def join(self, *parts: str) -> str:
        """Return the path of ``parts`` under :attr:`root`.

        Examples
        --------
        >>> locate("memory://bucket/out.zarr").join(".xpatch", "record.json")
        '/bucket/out.zarr/.xpatch/record.json'
        """
        return "/".join([self.root.rstrip("/"), *parts])

    def sibling(self, suffix: str) -> Location:
        """Return the location of the output's path with ``suffix`` appended."""
        return Location(
            self.fs, self.root.rstrip("/") + suffix, self.name + suffix, self.storage_options
        )

    def zarr_store(self) -> Any:
        """Return the zarr store that writes at this location."""
        if self.store is not None:
            return self.store
        if self.local:
            from zarr.storage import LocalStore

            return LocalStore(self.root)
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(self.name, storage_options=self.storage_options or None)


def locate(path: Any, storage_options: dict | None = None) -> Location:
    """Resolve an output path, URL or zarr store into a :class:`Location`.

    Parameters
    ----------
    path
        A local path (``str`` or ``os.PathLike``), an fsspec URL such as
        ``"s3://bucket/out.zarr"``, ``"memory://out.zarr"`` or
        ``"file:///tmp/out.zarr"``, or a zarr ``LocalStore`` / ``FsspecStore``.
    storage_options
        fsspec options for a URL (credentials, ``endpoint_url``...), as in
        xarray's ``to_zarr``.

    Returns
    -------
    Location

    Raises
    ------
    OptionError
        For a scheme fsspec does not know, a read-only one (``https://``),
        ``storage_options`` with a local path, or another kind of zarr store.
    MissingDependencyError
        For a scheme whose filesystem package is not installed (the message names
        it, e.g. ``s3fs``).

    Examples
    --------
    >>> location = locate("memory://demo/out.zarr")
    >>> location.root, location.local
    ('/demo/out.zarr', False)
    >>> locate("/tmp/out.zarr").local
    True
    """
    if storage_options is not None and not isinstance(storage_options, dict):
        raise OptionError(
            f"storage_options={storage_options!r} must be a dict of fsspec options, e.g. "
            "{'endpoint_url': ..., 'key': ..., 'secret': ...}."
        )
    options = dict(storage_options or {})
    store = _from_zarr_store(path, options)
    if store is not None:
        return store
    if not isinstance(path, str | os.PathLike):
        raise OptionError(
            f"path={path!r} must be a local path, an fsspec URL ('s3://bucket/out.zarr') or a "
            "zarr LocalStore / FsspecStore."
        )
    text = os.fspath(path)
    if "://" not in text:
        if options:
            raise OptionError(
                f"storage_options={options!r} were given with the local path {text!r}; they "
                "apply to URLs such as 's3://bucket/out.zarr'. Drop them, or give a URL."
            )
        return Location(LocalFileSystem(), str(Path(text).absolute()), text)
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        return Location(LocalFileSystem(), str(Path(text.split("://", 1)[1]).absolute()), text)
    if scheme in READ_ONLY_SCHEMES:
        raise OptionError(
            f"path={text!r}: {scheme}:// URLs are read-only; write to a local path or an object "
            "store URL (s3://, gs://, az://) instead."
        )
    fs_class = _filesystem_class(scheme, text)
    fs = fs_class(**options)
    return Location(fs, fs_class._strip_protocol(text), text, options)


def _filesystem_class(scheme: str, text: str) -> type:
    try:
        return fsspec.get_filesystem_class(scheme)
    except ImportError as error:
        package = SCHEME_PACKAGES.get(scheme, "the fsspec implementation of this scheme")
        extra = " (or pip install 'xarray-patch[cloud]')" if package == "s3fs" else ""
        raise MissingDependencyError(
            f"path={text!r} needs {package} to write {scheme}:// URLs: pip install {package}"
            f"{extra}. ({error})"
        ) from None
    except ValueError:
        raise OptionError(
            f"path={text!r}: fsspec knows no filesystem for the scheme {scheme!r}; use a local "
            "path or a URL such as 's3://bucket/out.zarr', 'gs://...' or 'memory://...'."
        ) from None


def _from_zarr_store(store: Any, options: dict) -> Location | None:
    """Return the location of a zarr store object, or None if ``store`` is not one."""
    try:
        from zarr.abc.store import Store
        from zarr.storage import FsspecStore, LocalStore
    except ImportError:  # pragma: no cover - zarr 2
        return None
    if not isinstance(store, Store):
        return None
    if options:
        raise OptionError(
            "storage_options were given with a zarr store object; configure the store instead."
        )
    if isinstance(store, LocalStore):
        return Location(
            LocalFileSystem(), str(Path(store.root).absolute()), str(store.root), store=store
        )
    if isinstance(store, FsspecStore):
        # The store's filesystem is asynchronous; the record needs a synchronous twin.
        fs = store.fs
        wrapped = getattr(fs, "sync_fs", None)
        if wrapped is not None:
            fs = wrapped
        else:
            fs = type(fs)(**{**fs.storage_options, "asynchronous": False})
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        name = f"{protocol}://{store.path}"
        options = {k: v for k, v in fs.storage_options.items() if k != "asynchronous"}
        return Location(fs, store.path, name, options, store=store)
    raise OptionError(
        f"path={type(store).__name__}(...): xpatch writes through a zarr LocalStore or "
        "FsspecStore, or a local path or fsspec URL; for zarr's MemoryStore use "
        "'memory://name.zarr'."
    )
