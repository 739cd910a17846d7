"""Dask arrays recognised without importing ``dask.array``.

``dask.array`` pulls in scipy and costs about 20 MiB of memory, which a process
that reads zarr chunks for training without dask never needs. The modules of
xpatch import it inside the functions that build dask arrays, and recognise one
with :func:`is_dask_array`, which does not import it: an object cannot be a dask
array unless ``dask.array`` has been imported.
"""

from __future__ import annotations

import sys


def is_dask_array(value: object) -> bool:
    """Whether ``value`` is a :class:`dask.array.Array`, without importing ``dask.array``.

    Examples
    --------
    >>> import numpy as np
    >>> is_dask_array(np.zeros(3))
    False
    >>> import dask.array as da
    >>> is_dask_array(da.zeros(3))
    True
    """
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(value, module.Array)
