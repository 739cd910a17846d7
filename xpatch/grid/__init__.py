"""Sources from other files on one grid: warped rasters, rasterized polygons, the guard.

:func:`xpatch.on_grid` (in :mod:`xpatch.grid.warp`) puts an image and its labels on
the image's grid, lazily, one output chunk at a time; :mod:`xpatch.grid.guard` refuses
a Dataset whose variables do not share one grid. Only the guard is imported by
``import xpatch``: the warp needs the ``[geo]`` extra (rasterio, geopandas).
"""
