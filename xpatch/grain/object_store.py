"""Fetch a zarr array's chunk bytes from an object store without holding the interpreter lock.

zarr reads an object store's bytes on its event loop: through s3fs's Python HTTP for
an fsspec store, through obstore's asynchronous calls for zarr's ``ObjectStore``;
either way the interpreter lock is held while a response is parsed, and Grain's read
threads queue for it. obstore's synchronous calls (``obstore.get(store, key)``) wait
with the lock released, on the thread that asks. :func:`object_store_of` finds an
obstore store that reaches the same bytes as a zarr array's store: the one inside
zarr's ``ObjectStore``, or an ``S3Store`` built from an s3fs filesystem's endpoint,
region and credentials (what ``xr.open_zarr("s3://...", storage_options=...)`` gave
it), or an ``HTTPStore`` on an ``http(s)://`` URL opened without options. It returns
None when obstore is not installed or the store is anything else (gcsfs, adlfs, s3fs
or http options it does not translate): zarr reads those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: fsspec options that say nothing about where the bytes are or who may read them.
_NEUTRAL_OPTIONS = frozenset(
    {
        "asynchronous",
        "loop",
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "version_aware",
        "cache_regions",
    }
)
#: s3fs ``client_kwargs`` that obstore is told below; any other one keeps s3fs.
_KNOWN_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})


@dataclass
class ObjectStoreReader:
    """An obstore store and the key prefix under which a zarr array's keys lie.

    Built by :func:`object_store_of`. Pickles as its recipe (``build``, ``args``,
    ``kwargs``) and builds its store again in each process, on first use (one built
    elsewhere, :meth:`around`, pickles as itself). ``reader.fetch("c/0")`` returns
    the bytes stored at ``prefix/c/0``, or None where nothing is stored.
    """

    build: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    prefix: str = ""
    description: str = ""
    _store: Any = field(default=None, repr=False)

    @classmethod
    def around(cls, store: Any, prefix: str, description: str = "") -> ObjectStoreReader:
        """Return a reader of an obstore ``store`` built elsewhere (it pickles as itself)."""
        return cls(build=None, prefix=prefix, description=description, _store=store)

    @property
    def store(self) -> Any:
        """The obstore store, built on first use in this process."""
        if self._store is None:
            self._store = self.build(*self.args, **self.kwargs)
        return self._store

    def fetch(self, key: str) -> Any | None:
        """Return the bytes (an ``obstore.Bytes``) stored at ``key`` under the prefix, or None.

        None when nothing is stored there (a chunk never written). The wait for the
        store releases the interpreter lock.
        """
        import obstore
        from obstore.exceptions import NotFoundError

        path = f"{self.prefix}/{key}" if self.prefix else key
        try:
            return obstore.get(self.store, path).bytes()
        except (NotFoundError, FileNotFoundError):
            return None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self.build is not None:  # built again where it is unpickled
            state["_store"] = None
        return state


def object_store_of(zarr_store: Any, path: str) -> ObjectStoreReader | None:
    """Return a reader of the array at ``path`` of ``zarr_store`` through obstore, or None.

    None when obstore is not installed, or ``zarr_store`` is neither zarr's
    ``ObjectStore`` nor an ``FsspecStore`` over s3fs whose options it translates, or
    over http(s) without options.

    Examples
    --------
    >>> from zarr.storage import MemoryStore
    >>> object_store_of(MemoryStore(), "a") is None  # read on the calling thread already
    True
    """
    try:
        import obstore  # noqa: F401
    except ImportError:
        return None
    kind = type(zarr_store).__name__
    if kind == "ObjectStore" and hasattr(zarr_store, "store"):
        return ObjectStoreReader.around(zarr_store.store, path.strip("/"), repr(zarr_store))
    if kind == "FsspecStore":
        fs = getattr(zarr_store, "fs", None)
        fs = getattr(fs, "sync_fs", fs)  # zarr may wrap a synchronous filesystem
        root = f"{str(zarr_store.path).strip('/')}/{path.strip('/')}".strip("/")
        if type(fs).__name__ == "S3FileSystem" and type(fs).__module__.startswith("s3fs"):
            return _s3_reader(fs, root)
        if type(fs).__name__ == "HTTPFileSystem" and type(fs).__module__.startswith("fsspec"):
            return _http_reader(fs, f"{str(zarr_store.path).rstrip('/')}/{path.strip('/')}")
    return None


def _http_reader(fs: Any, url: str) -> ObjectStoreReader | None:
    """Return an ``HTTPStore`` reader of ``url``, or None when ``fs`` has options (headers...)."""
    from obstore.store import HTTPStore

    options = set(getattr(fs, "storage_options", {}) or {}) - _NEUTRAL_OPTIONS
    if options or not url.lower().startswith(("http://", "https://")):
        return None  # headers, authentication, a session: fsspec knows what they mean
    return ObjectStoreReader(
        build=HTTPStore.from_url,
        args=(url.rstrip("/"),),
        kwargs={"client_options": {"allow_http": True}} if url.startswith("http:") else {},
        description=url,
    )


def _s3_reader(fs: Any, root: str) -> ObjectStoreReader | None:
    """Return an ``S3Store`` reader of what s3fs ``fs`` reaches at ``root``, or None."""
    from obstore.store import S3Store

    options = dict(getattr(fs, "storage_options", {}) or {})
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    handled = {"key", "secret", "token", "anon", "endpoint_url", "username", "password"}
    unknown = set(options) - handled - _NEUTRAL_OPTIONS
    if unknown or set(client_kwargs) - _KNOWN_CLIENT_KWARGS:
        return None  # requester pays, a proxy, a profile...: s3fs knows what they mean
    bucket, _, prefix = root.partition("/")
    if not bucket:
        return None
    config: dict[str, Any] = {}
    endpoint = client_kwargs.get("endpoint_url") or getattr(fs, "endpoint_url", None)
    if endpoint:
        config["endpoint"] = endpoint
    region = client_kwargs.get("region_name")
    if region:
        config["region"] = region
    key = options.get("key", options.get("username"))
    secret = options.get("secret", options.get("password"))
    if options.get("anon"):
        config["skip_signature"] = True
    elif key is not None and secret is not None:
        config["access_key_id"] = key
        config["secret_access_key"] = secret
        if options.get("token"):
            config["session_token"] = options["token"]
    # Else obstore reads the AWS_* environment variables, as boto does.
    client_options = {"allow_http": True} if str(endpoint or "").startswith("http:") else {}
    return ObjectStoreReader(
        build=S3Store,
        args=(bucket,),
        kwargs={"config": config, "client_options": client_options},
        prefix=prefix,
        description=f"s3://{root}",
    )
