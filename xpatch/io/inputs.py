"""Open input files lazily: a GeoTIFF, zarr store or netCDF file as one DataArray.

:func:`open_input` is what ``xpatch apply`` and :func:`xpatch.patch_scenes` use
for paths: it reads headers and metadata only, and its errors name the file and
the fix. A URL (``s3://bucket/x.zarr``, ``gs://``, ``az://``, ``https://``) is a zarr
store opened through fsspec with the caller's ``storage_options``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import xarray as xr

from xpatch.core.errors import MissingDependencyError, OptionError, XPatchError
from xpatch.io.location import SCHEME_PACKAGES

#: Suffixes of the GeoTIFF files xpatch reads and writes.
GEOTIFF_SUFFIXES = (".tif", ".tiff")


def open_input(
    path: str | Path,
    variable: str | None = None,
    chunks: int = 1024,
    storage_options: dict | None = None,
) -> xr.DataArray:
    """Open a GeoTIFF, zarr store or netCDF file lazily as one DataArray.

    GeoTIFFs need the ``geo`` extra (rioxarray) and are read in ``chunks`` x
    ``chunks`` blocks with all bands. A file holding several variables needs
    ``variable``. A URL (``s3://bucket/x.zarr``) is a zarr store, opened with
    fsspec's ``storage_options`` (endpoint, credentials, ``anon``).

    Raises
    ------
    OptionError
        If the input does not exist, is an empty (0-byte) file, cannot be opened
        (damaged, truncated, or not of the format its name says), or holds
        several variables and ``variable`` does not pick one of them; if a URL is
        not a zarr store, or ``storage_options`` come with a local path.
    MissingDependencyError
        If a URL's scheme needs a package that is not installed (``s3fs``...).
    """
    if is_url(path):
        return _one_variable(_open_zarr_url(str(path), storage_options), str(path), variable)
    if storage_options:
        raise OptionError(
            f"storage options {storage_options!r} were given with the local INPUT "
            f"{str(path)!r}; they apply to URLs such as 's3://bucket/x.zarr'. Drop them, or "
            "give a URL."
        )
    if isinstance(path, str) and path.lower().startswith("file://"):
        path = path[len("file://") :]
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.exists():
        raise OptionError(f"INPUT {str(path)!r} does not exist.")
    if path.is_file() and path.stat().st_size == 0:
        raise OptionError(
            f"INPUT {str(path)!r} is an empty file (0 bytes), as an interrupted copy or "
            "download leaves; copy or re-create it."
        )
    if suffix in GEOTIFF_SUFFIXES:
        try:
            import rasterio.errors
            import rioxarray
        except ImportError:
            raise OptionError(
                "reading GeoTIFF needs rioxarray: pip install 'xarray-patch[geo]'."
            ) from None
        with _readable(path, "a GeoTIFF", rasterio.errors.RasterioError):
            check_complete_tiff(path)
            opened = rioxarray.open_rasterio(path, chunks={"band": -1, "y": chunks, "x": chunks})
        if isinstance(opened, list):  # pragma: no cover - multi-subdataset files
            raise OptionError(f"INPUT {str(path)!r} holds several subdatasets; convert it first.")
        return opened
    if suffix == ".zarr" or (path / "zarr.json").exists() or (path / ".zgroup").exists():
        with _readable(path, "a zarr store"):
            dataset = xr.open_zarr(path)
    elif suffix in (".nc", ".nc4", ".netcdf", ".h5"):
        with _readable(path, "netCDF"):
            dataset = xr.open_dataset(path, chunks={})
    else:
        raise OptionError(f"INPUT {str(path)!r}: unknown format; give a .tif, .zarr or .nc file.")
    return _one_variable(dataset, str(path), variable)


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL other than ``file://``: an input read through fsspec.

    Examples
    --------
    >>> is_url("s3://bucket/x.zarr"), is_url("x.zarr"), is_url("file:///tmp/x.zarr")
    (True, False, False)
    """
    return isinstance(path, str) and "://" in path and not path.lower().startswith("file://")


def _open_zarr_url(url: str, storage_options: dict | None) -> xr.Dataset:
    """Open the zarr store at ``url`` lazily; errors name the URL and what to check."""
    if url.lower().rstrip("/").endswith((*GEOTIFF_SUFFIXES, ".nc", ".nc4", ".netcdf", ".h5")):
        raise OptionError(
            f"INPUT {url!r}: only zarr stores are read from URLs; copy the file to a local "
            "path first, or convert it to zarr."
        )
    scheme = url.split("://", 1)[0].lower()
    try:
        return xr.open_zarr(url, storage_options=storage_options or None)
    except ImportError as error:
        package = SCHEME_PACKAGES.get(scheme, f"the fsspec filesystem of {scheme}://")
        raise MissingDependencyError(
            f"INPUT {url!r} needs {package} to read {scheme}:// URLs: pip install {package}. "
            f"({error})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        first_line = (str(error).splitlines() or [""])[0]
        raise OptionError(
            f"INPUT {url!r} cannot be opened as a zarr store ({type(error).__name__}: "
            f"{first_line}). Check that it exists, and the storage options (endpoint_url, "
            "credentials, anon)."
        ) from None


def _one_variable(dataset: xr.Dataset, path: str, variable: str | None) -> xr.DataArray:
    """Return the variable of ``dataset`` (opened from ``path``) that ``variable`` picks."""
    if isinstance(dataset, xr.DataArray):  # pragma: no cover - defensive
        return dataset
    names = list(dataset.data_vars)
    if variable is None:
        if len(names) != 1:
            raise OptionError(
                f"INPUT {str(path)!r} holds variables {names}; pick one with --variable."
            )
        variable = names[0]
    if variable not in names:
        raise OptionError(f"--variable {variable!r} is not in {str(path)!r}; it holds {names}.")
    return dataset[variable]


def check_complete_tiff(path: Path) -> None:
    """Refuse a TIFF whose blocks reach past its end: a truncated copy or download.

    Its header opens, so the damage would only show as a read error deep in the
    write, naming no file. GDAL lists every block's offset and size (metadata
    only, about 10 us a block); with pixel interleaving one band's list serves all.
    """
    import rasterio

    size = path.stat().st_size
    with rasterio.open(path) as source:
        if source.driver != "GTiff":
            return
        pixel = source.interleaving is not None and source.interleaving.name.lower() == "pixel"
        bands = source.indexes[:1] if pixel else source.indexes
        end = 0
        for band in bands:
            for (row, col), _ in source.block_windows(band):
                offset = source.get_tag_item(f"BLOCK_OFFSET_{col}_{row}", "TIFF", bidx=band)
                length = source.get_tag_item(f"BLOCK_SIZE_{col}_{row}", "TIFF", bidx=band)
                end = max(end, int(offset or 0) + int(length or 0))
    if end > size:
        raise OptionError(
            f"INPUT {str(path)!r} is truncated: its blocks reach byte {end}, but the file "
            f"has {size} bytes (an interrupted copy or download). Copy or download it "
            "again, or leave it out."
        )


@contextlib.contextmanager
def _readable(path: Path, kind: str, *errors: type[Exception]) -> Iterator[None]:
    """Turn the errors of opening ``path`` into an :class:`OptionError` naming it and the fix."""
    try:
        yield
    except XPatchError:
        raise
    except (OSError, ValueError, KeyError, TypeError, *errors) as error:
        first_line = (str(error).splitlines() or [""])[0]
        raise OptionError(
            f"INPUT {str(path)!r} cannot be opened as {kind} ({type(error).__name__}: "
            f"{first_line}). "
            "It is damaged, incomplete or of another format: copy or re-create it."
        ) from None
