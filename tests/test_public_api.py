"""The public import paths keep working, and the paths that moved warn once."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

import xpatch


@pytest.mark.parametrize("name", xpatch.__all__)
def test_every_public_name_imports(name):
    assert getattr(xpatch, name) is not None


def test_public_packages_keep_their_names():
    import xpatch.cli
    import xpatch.grain
    import xpatch.io
    import xpatch.scenes
    import xpatch.tree

    assert xpatch.io.write is xpatch.write
    assert callable(xpatch.io.compute) and callable(xpatch.io.progress_record)
    assert xpatch.grain.PatchSource.__name__ == "PatchSource"
    assert callable(xpatch.grain.require_grain)
    assert xpatch.tree.TreePatcher is xpatch.TreePatcher
    assert xpatch.scenes.ScenePatcher is xpatch.ScenePatcher
    assert xpatch.scenes.patch_scenes is xpatch.patch_scenes


def test_the_console_script_is_xpatch_cli_main():
    (script,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "xpatch"
    ]
    assert script.value == "xpatch.cli:main"
    assert script.load() is xpatch.cli.main


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("xpatch.scene_source", "SceneSource", "xpatch.scenes"),
        ("xpatch.tree_grain", "TreeSource", "xpatch.tree"),
    ],
)
def test_moved_modules_import_and_warn_once(old, name, new):
    # A fresh interpreter: the warning comes with the first import of the old path only.
    code = textwrap.dedent(
        f"""
        import importlib, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = importlib.import_module({old!r})
            again = importlib.import_module({old!r})
        moved = [w for w in caught if issubclass(w.category, FutureWarning)]
        assert len(moved) == 1, [str(w.message) for w in caught]
        assert {new!r} in str(moved[0].message)
        assert getattr(first, {name!r}) is getattr(importlib.import_module({new!r}), {name!r})
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
