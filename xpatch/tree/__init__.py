"""Patches of a DataTree of co-registered resolutions: ``dt.patch(...)``.

``import xpatch.tree`` (or ``import xpatch``) registers the ``.patch`` accessor on
:class:`xarray.DataTree`.
"""

from xpatch.tree.patcher import TreePatcher
from xpatch.tree.source import TreeSource

__all__ = ["TreePatcher", "TreeSource"]
