"""The xarray layer: layouts over labelled objects, their views, reconstruction and apply.

Everything here knows dimension names, coordinates and attributes, and hands numpy
and dask arrays to :mod:`xpatch.core`, which knows none of them.
"""
