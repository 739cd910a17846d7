"""Moved: the tree's Grain source is :class:`xpatch.tree.TreeSource`.

This module keeps the old import path working; importing it warns once.
"""

import warnings

from xpatch.tree.source import SHARED_KEYS, TreeSource

warnings.warn(
    "xpatch.tree_grain moved to xpatch.tree: import TreeSource from xpatch.tree "
    "(xpatch.tree_grain will be removed).",
    FutureWarning,
    stacklevel=2,
)

__all__ = ["SHARED_KEYS", "TreeSource"]
