"""Moved: the scenes' Grain source is :class:`xpatch.scenes.SceneSource`.

This module keeps the old import path working; importing it warns once.
"""

import warnings

from xpatch.scenes.source import SceneSource

warnings.warn(
    "xpatch.scene_source moved to xpatch.scenes: import SceneSource from xpatch.scenes "
    "(xpatch.scene_source will be removed).",
    FutureWarning,
    stacklevel=2,
)

__all__ = ["SceneSource"]
