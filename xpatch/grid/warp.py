"""Imagery and labels from different files on one grid, warped lazily per output chunk.

:func:`on_grid` returns a Dataset on the image's grid (its CRS, transform, shape and
chunks). Every other source is put on that grid one output chunk at a time: a raster
is warped by GDAL (a :class:`rasterio.vrt.WarpedVRT`) from the source window that chunk's
footprint needs (the chunk's bounds taken to the source's CRS, densified, plus a margin
for the resampling kernel), a vector layer is burned with
:func:`rasterio.features.rasterize` from the polygons the spatial index says meet the
chunk. Building the Dataset computes nothing; each output chunk is one dask task that
reads only its source window.

Why a rasterio warp per chunk with the exact transformer (and not odc-geo's
``xr_reproject``, nor :func:`rasterio.warp.reproject` per chunk): GDAL's warper
approximates the coordinate transform linearly along each row of the output window,
to 1/8 of a source pixel by default, so a chunked warp that keeps that default gives
values that depend on where the chunks cut the rows. Measured on the tests' scene
(256 x 256 cells of 10 m in EPSG:32632, labels at 0.0003 degrees in EPSG:4326):
``rasterio.warp.reproject`` into 64 x 64 chunks differs from the same call over the
whole grid at 151 of 65,536 cells with nearest and by up to 0.013 with bilinear, even
when every chunk is given the whole source. odc-geo's dask path (``odc.geo._dask``,
0.5.3) calls that same function per chunk with that same default, so it inherits this,
and it forces ``XSCALE=YSCALE=1`` (a one-pixel kernel when shrinking), which rioxarray
does not. Here each chunk is a :class:`rasterio.vrt.WarpedVRT` over its source window
with ``tolerance=1e-9``: the
exact transform per cell, so the result does not depend on the chunks (equal cell for
cell to the same warp of the whole raster, at any chunking; the tests check it with
hypothesis). rioxarray's ``reproject_match`` keeps GDAL's default approximation: it
differs from the exact warp at 160 of those 65,536 cells with nearest (0.24 %, each a
neighbouring source cell) and by up to 0.013 with bilinear, where its approximation
moves the sample by up to 1/8 pixel. On the issue's scene (4 x 4096 x 4096 at 10 m,
chunks of 512, labels of 1248 x 1756 cells at 0.0003 degrees) ``reproject_match``
differs at 3.9 % of the cells, and at 2,000 of them drawn at random the exact
transform (pyproj, cell centres) agrees with this warp at every one and with
``reproject_match`` at none. The exact transform costs: 0.16 s per 512 x 512 chunk
against 0.017 s with the approximation (one thread), 11 s for the 64 chunks of that
scene on 2 busy cores, against 0.9 s for ``reproject_match``'s one call.

GDAL also widens its kernels when shrinking by a scale it derives from each warp's
windows (a one-column chunk got a bilinear kernel of its own: hypothesis found it);
every chunk is given the ratio of cell sizes over the whole grid instead (``_scales``).
A whole-raster GDAL warp rounds its own window into that scale (0.875-0.9 of the ratio
on an 18 x 28-cell grid), so bilinear shrinking differs from it; average and mode equal
it at any chunking. rasterio is already
in the ``[geo]`` extra (rioxarray's dependency); odc-geo would be one more.

GDAL's block cache: GDAL keeps the blocks it decodes in one cache per process, by
default 5 % of the RAM (1.2 GB on a 23 GB machine). Training reads each chunk once an
epoch and xpatch's own chunk cache holds what is read again, so that cache only fills:
one epoch over a 4 x 10980² scene with its labels peaked at 1.8 GiB with it and 0.7
GiB with 64 MiB (``benchmarks/bench_grid_memory.py``). :func:`on_grid` and each of its
warp tasks (in any process the graph runs in) lower it to 64 MiB (:func:`bound_gdal_cache`)
unless the user chose it: ``GDAL_CACHEMAX`` in the environment or in an active
``rasterio.Env``. It is lowered only, never raised, and stays (process-wide, as
:mod:`xpatch.core.malloc`'s settings do).

Resampling per source: ``"nearest"``, ``"bilinear"``, ``"average"`` or ``"mode"``.
The default is ``"nearest"`` for integer and boolean sources (classes must not be
blended) and ``"bilinear"`` for float sources
(continuous values: reflectance, NDVI, elevation); a float class map needs
``resampling={"name": "nearest"}``. A boolean mask, which GDAL has no type for, is
warped as ``uint8`` (0 and 1, nearest only: any other kernel would make fractions or
votes of it) and given back as bool; cells it does not cover are False.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal, get_args

import dask
import dask.array as da
import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, GeometryError, MissingDependencyError, OptionError
from xpatch.xarray.encoding import encoded_nodata_of, nodata_of
from xpatch.xarray.georef import crs_of, grid_mapping_name, raster_dims, transform_of

Resampling = Literal["nearest", "bilinear", "average", "mode"]
RESAMPLINGS: tuple[str, ...] = get_args(Resampling)

#: GDAL's largest error, in source pixels, of its linear approximation of the transform.
#: Its default (1/8 pixel) interpolates along each row of the output window, so values
#: would depend on where the chunks cut the rows; a billionth of a pixel makes each cell
#: the exact transform's (0 itself fails in rasterio 1.4's WarpedVRT).
EXACT = 1e-9

#: GDAL's block cache for a process that reads through on_grid, unless the user chose one:
#: enough for the source blocks neighbouring chunks share (a label window's margin), far
#: below GDAL's default of 5 % of the RAM.
GDAL_CACHE_BYTES = 64 * 2**20

GRID_HINT = 'pip install "xarray-patch[geo]" (rasterio, rioxarray, geopandas)'

#: A vector source: a GeoDataFrame or a path geopandas reads, alone (burns 1) or with
#: the column whose values to burn, ``(frame, "class")``.
VectorSource = Any


def _rasterio() -> Any:
    try:
        import rasterio.features
        import rasterio.warp
    except ImportError as error:  # pragma: no cover - the [geo] extra is in the tests
        raise MissingDependencyError(f"xpatch.on_grid needs rasterio: {GRID_HINT}") from error
    return rasterio


_cache_lock = threading.Lock()
_cache_bounded_in: set[int] = set()  # process ids: a forked worker checks again


def bound_gdal_cache(limit: int = GDAL_CACHE_BYTES) -> bool:
    """Lower GDAL's block cache to ``limit`` bytes for this process, unless the user chose it.

    The user's choice wins: ``GDAL_CACHEMAX`` in the environment, or in the options of
    an active ``rasterio.Env``. A cache already at or below ``limit`` is left alone.
    Applied once per process; returns whether the cache was lowered (now or before).

    Examples
    --------
    >>> import os, rasterio
    >>> with rasterio.Env(GDAL_CACHEMAX=512 * 2**20):  # the user's own choice
    ...     bound_gdal_cache()
    False
    """
    rasterio = _rasterio()
    if "GDAL_CACHEMAX" in os.environ or (
        rasterio.env.hasenv() and "GDAL_CACHEMAX" in rasterio.env.getenv()
    ):
        return False
    with _cache_lock:
        if os.getpid() in _cache_bounded_in:
            return True
        # rasterio reads and sets this option as GDAL's cache size in bytes
        # (GDALGetCacheMax64 / GDALSetCacheMax64), not as the option's text.
        if int(rasterio.env.get_gdal_config("GDAL_CACHEMAX")) > limit:
            rasterio.env.set_gdal_config("GDAL_CACHEMAX", int(limit))
        _cache_bounded_in.add(os.getpid())
    return True


def _geopandas() -> Any:
    try:
        import geopandas
    except ImportError as error:  # pragma: no cover - the [geo] extra is in the tests
        raise MissingDependencyError(
            f"xpatch.on_grid needs geopandas for vector labels: {GRID_HINT}"
        ) from error
    return geopandas


def on_grid(
    image: xr.DataArray | xr.Dataset,
    /,
    resampling: Resampling | Mapping[str, Resampling] | None = None,
    all_touched: bool = False,
    **sources: xr.DataArray | VectorSource,
) -> xr.Dataset:
    """Return ``image`` and every source on the image's grid, warped lazily per output chunk.

    Parameters
    ----------
    image
        The raster whose grid the result takes: its CRS (a grid mapping, as
        ``rio.write_crs`` writes it), transform, shape and chunks. A DataArray
        becomes the variable of its name (``"image"`` if it has none); a Dataset's
        variables are kept.
    resampling
        How raster sources are warped: one name for all, or ``{source: name}``
        (sources left out take the default): ``"nearest"``, ``"bilinear"``,
        ``"average"`` or ``"mode"``. Default: ``"nearest"`` for integer and boolean
        sources (a boolean mask takes nearest only), ``"bilinear"`` for float ones.
    all_touched
        Vector sources: burn every cell a polygon touches, not only those whose
        centre it covers (:func:`rasterio.features.rasterize`'s option).
    **sources
        The other sources, by the name of their variable in the result:

        - a DataArray with a CRS (``rio.write_crs``) and a transform (regular x/y
          coordinates), numpy or dask; dims ``(..., y, x)``. Cells it does not cover
          are its nodata value (``_FillValue`` / ``nodata``; NaN for float sources
          without one; the dtype's largest value for unsigned, smallest for signed
          integer sources without one, as rioxarray chooses); its dtype is kept. A
          boolean mask is warped as 0/1 and stays bool, False where it does not reach.
        - a GeoDataFrame, or a path (``str`` / ``os.PathLike``) that
          :func:`geopandas.read_file` reads: polygons in any CRS, burned as 1
          (``uint8``, 0 elsewhere);
        - ``(frame_or_path, column)``: the polygons burned with the column's values
          (its dtype; 0 elsewhere, NaN for a float column). Later rows are burned
          over earlier ones where polygons overlap.

    Returns
    -------
    xarray.Dataset
        On the image's grid: the image's variables, then one per source, chunked as
        the image is (one chunk if the image is not backed by dask). Lazy when the
        image or a raster source is backed by dask: building it computes nothing and
        each output chunk reads only the source window it needs.

    Raises
    ------
    GeometryError
        The image or a raster source has no CRS or no transform.
    OptionError
        An unknown resampling name, a resampling for a source not given, one other
        than ``"nearest"`` for a boolean source, a source
        that is neither a raster nor a vector layer, or a vector column not in it.
    DimensionError
        A source's name is a variable of the image already.

    Examples
    --------
    >>> import numpy as np, xarray as xr, rioxarray, xpatch
    >>> scene = xr.DataArray(
    ...     np.zeros((64, 64), "float32"), dims=("y", "x"),
    ...     coords={"y": 5e6 - 5.0 - 10.0 * np.arange(64), "x": 3e5 + 5.0 + 10.0 * np.arange(64)},
    ... ).rio.write_crs("EPSG:32632").chunk(32)
    >>> west, _, _, north = scene.rio.transform_bounds("EPSG:4326")
    >>> lat, lon = north - 1e-4 - 2e-4 * np.arange(40), west + 1e-4 + 2e-4 * np.arange(30)
    >>> labels = xr.DataArray(  # 0.0002 degrees, stopping short of the scene's east edge
    ...     np.ones((40, 30), "uint8"), dims=("y", "x"), coords={"y": lat, "x": lon}
    ... ).rio.write_crs("EPSG:4326")
    >>> ds = xpatch.on_grid(scene.rename("image"), labels=labels)
    >>> ds.labels.dtype, ds.labels.chunks, ds.labels.attrs["_FillValue"]
    (dtype('uint8'), ((32, 32), (32, 32)), 255)
    >>> sorted(np.unique(ds.labels.values).tolist())  # 255: cells the labels do not cover
    [1, 255]
    """
    grid = _Grid(image)
    names = _image_variables(image)
    for name in sources:
        if name in names:
            raise DimensionError(
                f"source {name}= has the name of the image's variable {name!r}: name it "
                f"otherwise (on_grid(image, {name}_labels=...)); the image's variables are "
                f"{sorted(map(str, names))}."
            )
    methods = _resampling_of(resampling, sources)
    for name, source in sources.items():  # every source checked before any is read
        _check_source(name, source)
    _check_bool_resampling(methods, sources)
    bound_gdal_cache()  # the image's reads too, which go through GDAL's cache
    out = dict(names)
    for name, source in sources.items():
        if _is_raster(source):
            out[name] = _warped(name, source, grid, methods.get(name))
        else:
            out[name] = _burned(name, source, grid, all_touched)
    result = xr.Dataset(out, attrs=dict(image.attrs))
    lazy = grid.lazy or any(
        isinstance(s, xr.DataArray) and isinstance(s.data, da.Array) for s in sources.values()
    )
    if not lazy:  # numpy in, numpy out: the chunked graph is only the way there
        result = result.compute(scheduler="synchronous")
    return result


def _image_variables(image: xr.DataArray | xr.Dataset) -> dict[Hashable, xr.DataArray]:
    if isinstance(image, xr.Dataset):
        return {name: image[name] for name in image.data_vars}
    return {image.name if image.name is not None else "image": image}


def _resampling_of(
    resampling: Resampling | Mapping[str, Resampling] | None, sources: Mapping[str, Any]
) -> dict[str, Resampling]:
    if resampling is None:
        return {}
    given = (
        dict(resampling)
        if isinstance(resampling, Mapping)
        else {name: resampling for name, source in sources.items() if _is_raster(source)}
    )
    rasters = sorted(name for name, source in sources.items() if _is_raster(source))
    for name, method in given.items():
        if name not in rasters:
            raise OptionError(
                f"resampling= names {name!r}, which is not a raster source: the raster "
                f"sources are {rasters} (polygons are burned, not resampled); give "
                "resampling={source_name: method}."
            )
        if method not in RESAMPLINGS:
            raise OptionError(
                f"resampling={method!r} for source {name!r} is not a resampling: use one of "
                f"{list(RESAMPLINGS)}."
            )
    return given


def _check_bool_resampling(methods: Mapping[str, Resampling], sources: Mapping[str, Any]) -> None:
    """Refuse a resampling other than nearest for a boolean raster (it is warped as 0/1)."""
    for name, method in methods.items():
        source = sources[name]
        if method != "nearest" and _is_raster(source) and source.dtype == bool:
            raise OptionError(
                f"resampling={method!r} for source {name!r}, a boolean mask: a mask is "
                "warped nearest only. For the fraction of each cell it covers, give "
                f"{name}.astype('float32') with resampling={{{name!r}: 'average'}}."
            )


def _is_raster(source: Any) -> bool:
    return isinstance(source, xr.DataArray)


def _check_source(name: str, source: Any) -> None:
    """Refuse a source that cannot go on the grid, naming it and the fix (nothing read)."""
    if isinstance(source, xr.Dataset):
        raise OptionError(
            f"source {name}= is a Dataset: give its variables one by one "
            f"(on_grid(image, {name}=ds['band']))."
        )
    if _is_raster(source):
        if raster_dims(source) is None:
            raise DimensionError(
                f"source {name}= has no y and x dims (its dims are {list(source.dims)}): "
                "name them y/x (or lat/lon)."
            )
        if crs_of(source) is None:
            raise GeometryError(
                f"source {name}= has no CRS, so it cannot be warped onto the image's grid: "
                f'write it with {name}.rio.write_crs("EPSG:...") (the CRS its x/y are in).'
            )
        _transform_or_raise(source, f"source {name}")
        return
    frame = source
    if isinstance(source, tuple):
        if len(source) != 2 or not isinstance(source[1], str):
            raise OptionError(
                f"source {name}= is a tuple: give (frame_or_path, column), e.g. "
                f'{name}=(gdf, "class"); got {len(source)} item(s).'
            )
        frame = source[0]
    if not isinstance(frame, (str, os.PathLike)) and not hasattr(frame, "geometry"):
        raise OptionError(
            f"source {name}= is a {type(frame).__name__}: give a DataArray with a CRS, a "
            "GeoDataFrame, a path geopandas reads, or (frame_or_path, column)."
        )


class _Grid:
    """The output grid: CRS, transform, dims, shape, chunk boundaries and coordinates."""

    def __init__(self, image: xr.DataArray | xr.Dataset) -> None:
        dims = raster_dims(image)
        if dims is None:
            raise DimensionError(
                f"image= needs y and x dims (its dims are {list(image.dims)}); name them "
                "y/x (or lat/lon) or give rioxarray's spatial dims."
            )
        self.crs = crs_of(image)
        if self.crs is None:
            raise GeometryError(
                "image= has no CRS: on_grid warps the sources into the image's CRS; write "
                'it with image.rio.write_crs("EPSG:...").'
            )
        self.transform = _transform_or_raise(image, "image")
        self.dims = dims
        self.shape = (image.sizes[dims[0]], image.sizes[dims[1]])
        chunks = image.chunksizes if image.chunks else {}
        self.lazy = bool(chunks)
        self.chunks = tuple(chunks.get(d, (n,)) for d, n in zip(dims, self.shape))
        self.coords = {
            name: coord
            for name, coord in image.coords.items()
            if set(coord.dims) <= set(dims) and (coord.ndim or name == grid_mapping_name(image))
        }

    def windows(self) -> list[list[tuple[int, int, int, int]]]:
        """``(row0, row1, col0, col1)`` of every output chunk, by rows of chunks."""
        rows = np.cumsum((0, *self.chunks[0]))
        cols = np.cumsum((0, *self.chunks[1]))
        return [
            [(int(r0), int(r1), int(c0), int(c1)) for c0, c1 in itertools.pairwise(cols)]
            for r0, r1 in itertools.pairwise(rows)
        ]

    def chunk_transform(self, row: int, col: int) -> tuple[float, ...]:
        a, b, c, d, e, f = self.transform
        return (a, b, c + a * col + b * row, d, e, f + d * col + e * row)

    def bounds(self, window: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
        """``(left, bottom, right, top)`` of a window of the grid, in the grid's CRS."""
        r0, r1, c0, c1 = window
        xs, ys = _apply(self.transform, [c0, c1, c0, c1], [r0, r0, r1, r1])
        return min(xs), min(ys), max(xs), max(ys)


def _apply(t: Sequence[float], cols: Sequence[float], rows: Sequence[float]):
    a, b, c, d, e, f = t
    cols, rows = np.asarray(cols, float), np.asarray(rows, float)
    return a * cols + b * rows + c, d * cols + e * rows + f


def _transform_or_raise(obj: xr.DataArray | xr.Dataset, argument: str) -> tuple[float, ...]:
    try:
        transform = transform_of(obj)
    except GeometryError as error:
        raise GeometryError(f"{argument}=: {error}") from error
    if transform is None:
        raise GeometryError(
            f"{argument}= has no transform: give it regularly spaced numeric x/y coordinates "
            "or write one with .rio.write_transform(...)."
        )
    return transform


# -- rasters ---------------------------------------------------------------------------------


def _default_nodata(dtype: np.dtype) -> Any:
    """Return the nodata of a source without one, as rioxarray's ``reproject`` chooses it."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.max if info.min == 0 else info.min
    return np.nan


def _warped(
    name: str, source: xr.DataArray, grid: _Grid, method: Resampling | None
) -> xr.DataArray:
    rasterio = _rasterio()
    dims = raster_dims(source)
    crs = crs_of(source)
    transform = _transform_or_raise(source, f"source {name}")
    if method is None:
        method = "bilinear" if np.issubdtype(source.dtype, np.floating) else "nearest"
    extra = [d for d in source.dims if d not in dims]
    source = source.transpose(*extra, *dims)
    mask = source.dtype == bool
    if mask:  # GDAL has no boolean type: 0/1 as uint8, 0 where the mask does not reach
        nodata, dst_nodata = None, 0
    else:
        nodata = nodata_of(source)
        if nodata is None and encoded_nodata_of(source) is not None:
            nodata = np.nan  # masked on reading: NaN marks the nodata cells
        dst_nodata = _default_nodata(source.dtype) if nodata is None else nodata
    data = source.data if isinstance(source.data, da.Array) else da.from_array(source.data)
    if mask:
        data = data.astype(np.uint8)
    dtype = data.dtype
    lead = data.shape[:-2]
    src_shape = data.shape[-2:]
    ratio = _scales(transform, grid, crs)
    # Read past a chunk's footprint as far as its kernels reach, so that its values are
    # the whole raster's (nearest: two cells for the footprint's rounding).
    margin = 2 if method == "nearest" else 2 * math.ceil(max(*ratio, 1.0)) + 3
    task = {
        "src_crs": crs,
        "src_nodata": nodata,
        "dst_crs": grid.crs,
        "dst_nodata": dst_nodata,
        "resampling": method,
        # GDAL's kernel scale: below 1 when shrinking; 1 when enlarging, as GDAL takes it.
        "scales": tuple(min(1.0, 1.0 / r) for r in ratio),
    }
    blocks = []
    for row in grid.windows():
        line = []
        for window in row:
            r0, r1, c0, c1 = window
            shape = (*lead, r1 - r0, c1 - c0)
            src_window = _source_window(rasterio, grid, window, crs, transform, src_shape, margin)
            if src_window is None:
                line.append(da.full(shape, dst_nodata, dtype=dtype, chunks=shape))
                continue
            s0, s1, t0, t1 = src_window
            piece = data[..., s0:s1, t0:t1]
            piece = piece.rechunk(piece.shape)
            line.append(
                piece.map_blocks(
                    _warp_block,
                    chunks=tuple((n,) for n in shape),
                    dtype=dtype,
                    meta=np.empty((0,) * len(shape), dtype),
                    src_transform=_offset(transform, s0, t0),
                    dst_transform=grid.chunk_transform(r0, c0),
                    dst_shape=shape[-2:],
                    **task,
                )
            )
        blocks.append(line)
    warped = da.block(blocks) if len(blocks) > 1 or len(blocks[0]) > 1 else blocks[0][0]
    attrs = {k: v for k, v in source.attrs.items() if k not in ("grid_mapping", "_FillValue")}
    if mask:
        warped = warped.astype(bool)  # no _FillValue: False is "not in the mask", as off it
    else:
        attrs["_FillValue"] = dst_nodata
    coords = {d: source.coords[d] for d in extra if d in source.coords}
    out = xr.DataArray(warped, dims=(*extra, *grid.dims), coords=coords, attrs=attrs)
    return out.assign_coords(grid.coords)


def _offset(t: Sequence[float], row: int, col: int) -> tuple[float, ...]:
    a, b, c, d, e, f = t
    return (a, b, c + a * col + b * row, d, e, f + d * col + e * row)


def _scales(transform: Sequence[float], grid: _Grid, crs: Any) -> tuple[float, float]:
    """Source cells per output cell across the whole grid, along x and y.

    GDAL widens its bilinear (and other) kernels by this ratio when it shrinks a raster,
    and left to itself derives it from each warp's own windows: a one-cell chunk would
    get a kernel of its own. Computed once from the whole grid and handed to every
    chunk (``XSCALE`` / ``YSCALE``), every chunk uses the same kernel.
    """
    rasterio = _rasterio()
    left, bottom, right, top = grid.bounds((0, grid.shape[0], 0, grid.shape[1]))
    sl, sb, sr, st = rasterio.warp.transform_bounds(
        grid.crs, crs, left, bottom, right, top, densify_pts=21
    )
    width = abs(transform[0]) + abs(transform[1])
    height = abs(transform[3]) + abs(transform[4])
    return (sr - sl) / width / grid.shape[1], (st - sb) / height / grid.shape[0]


def _source_window(
    rasterio: Any,
    grid: _Grid,
    window: tuple[int, int, int, int],
    crs: Any,
    transform: Sequence[float],
    src_shape: tuple[int, int],
    margin: int,
) -> tuple[int, int, int, int] | None:
    """Rows and columns of the source a chunk's footprint covers, plus ``margin``; None if none."""
    left, bottom, right, top = rasterio.warp.transform_bounds(
        grid.crs, crs, *grid.bounds(window), densify_pts=21
    )
    inverse = ~rasterio.Affine(*transform)
    cols, rows = zip(*(inverse * xy for xy in _corners(left, bottom, right, top)))
    s0 = max(math.floor(min(rows)) - margin, 0)
    s1 = min(math.ceil(max(rows)) + margin, src_shape[0])
    t0 = max(math.floor(min(cols)) - margin, 0)
    t1 = min(math.ceil(max(cols)) + margin, src_shape[1])
    if s0 >= s1 or t0 >= t1:
        return None
    return s0, s1, t0, t1


def _corners(left: float, bottom: float, right: float, top: float):
    return [(left, bottom), (left, top), (right, bottom), (right, top)]


def _warp_block(
    block: np.ndarray,
    *,
    src_transform: Sequence[float],
    src_crs: Any,
    src_nodata: Any,
    dst_transform: Sequence[float],
    dst_crs: Any,
    dst_nodata: Any,
    dst_shape: tuple[int, int],
    resampling: str,
    scales: tuple[float, float],
) -> np.ndarray:
    """One output chunk: GDAL's warp of its source window, with the exact transformer."""
    rasterio = _rasterio()
    bound_gdal_cache()  # in a worker process too, where on_grid was not called
    from rasterio.io import MemoryFile
    from rasterio.vrt import WarpedVRT

    lead, (height, width) = block.shape[:-2], dst_shape
    flat = np.ascontiguousarray(block.reshape((-1, *block.shape[-2:])))
    profile = {
        "driver": "GTiff",
        "count": flat.shape[0],
        "height": flat.shape[1],
        "width": flat.shape[2],
        "dtype": flat.dtype,
        "crs": rasterio.crs.CRS.from_user_input(src_crs),
        "transform": rasterio.Affine(*src_transform),
        "nodata": src_nodata,
    }
    with MemoryFile() as memory:
        with memory.open(**profile) as dataset:
            dataset.write(flat)
        with (
            memory.open() as dataset,
            WarpedVRT(
                dataset,
                crs=rasterio.crs.CRS.from_user_input(dst_crs),
                transform=rasterio.Affine(*dst_transform),
                width=width,
                height=height,
                resampling=rasterio.enums.Resampling[resampling],
                tolerance=EXACT,
                nodata=dst_nodata,
                XSCALE=repr(scales[0]),
                YSCALE=repr(scales[1]),
            ) as warped,
        ):
            dest = warped.read()
    return dest.reshape((*lead, height, width))


# -- vectors ---------------------------------------------------------------------------------


def _burned(name: str, source: VectorSource, grid: _Grid, all_touched: bool) -> xr.DataArray:
    geopandas = _geopandas()
    rasterio = _rasterio()
    column = None
    if isinstance(source, tuple):
        source, column = source
    if isinstance(source, (str, os.PathLike)):
        source = geopandas.read_file(source)
    if not isinstance(source, geopandas.GeoDataFrame):
        raise OptionError(
            f"source {name}= is a {type(source).__name__}: give a DataArray with a CRS, a "
            "GeoDataFrame, a path geopandas reads, or (frame_or_path, column)."
        )
    if source.crs is None:
        raise GeometryError(
            f"source {name}= has no CRS: set it with {name}.set_crs('EPSG:...') (the CRS "
            "its coordinates are in)."
        )
    if column is not None and column not in source.columns:
        raise OptionError(
            f"source {name}=: column {column!r} is not in the frame; its columns are "
            f"{[c for c in source.columns if c != source.geometry.name]}."
        )
    frame = source.to_crs(rasterio.crs.CRS.from_user_input(grid.crs).to_wkt())
    if column is None:
        values = np.ones(len(frame), dtype=np.uint8)
    else:
        values = frame[column].to_numpy()
        if values.dtype == bool:
            values = values.astype(np.uint8)
    dtype = values.dtype
    fill = np.nan if np.issubdtype(dtype, np.floating) else 0
    geometries = frame.geometry.to_numpy()
    index = frame.sindex
    shapely_box = _shapely_box()
    blocks = []
    for row in grid.windows():
        line = []
        for window in row:
            r0, r1, c0, c1 = window
            hits = np.sort(index.query(shapely_box(*grid.bounds(window)), predicate="intersects"))
            shape = (r1 - r0, c1 - c0)
            if len(hits) == 0:
                line.append(da.full(shape, fill, dtype=dtype, chunks=shape))
                continue
            shapes = list(zip(geometries[hits], values[hits].tolist()))
            task = dask.delayed(_rasterize_block, pure=True)(
                shapes, shape, grid.chunk_transform(r0, c0), fill, all_touched, dtype.str
            )
            line.append(da.from_delayed(task, shape=shape, dtype=dtype))
        blocks.append(line)
    burned = da.block(blocks) if len(blocks) > 1 or len(blocks[0]) > 1 else blocks[0][0]
    # No _FillValue: 0 is "no polygon here", a label like any other, not a missing value.
    return xr.DataArray(burned, dims=grid.dims).assign_coords(grid.coords)


def _shapely_box() -> Any:
    from shapely.geometry import box  # geopandas' own dependency

    return box


def _rasterize_block(
    shapes: list,
    shape: tuple[int, int],
    transform: Sequence[float],
    fill: Any,
    all_touched: bool,
    dtype: str,
) -> np.ndarray:
    """One output chunk: ``rasterio.features.rasterize`` of the polygons that meet it."""
    rasterio = _rasterio()
    return rasterio.features.rasterize(
        shapes,
        out_shape=shape,
        transform=rasterio.Affine(*transform),
        fill=fill,
        all_touched=all_touched,
        dtype=dtype,
    )
