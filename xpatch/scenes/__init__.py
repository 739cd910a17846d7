"""Many scenes under one patch layout: :func:`patch_scenes` and its Grain source."""

from xpatch.scenes.patcher import ScenePatcher, patch_scenes
from xpatch.scenes.source import SceneSource

__all__ = ["ScenePatcher", "SceneSource", "patch_scenes"]
