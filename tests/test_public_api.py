"""The public import paths keep working, and the paths that moved warn once."""

from __future__ import annotations

import importlib
import importlib.metadata

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


def test_the_old_module_paths_are_gone():
    # No release shipped xpatch.scene_source or xpatch.tree_grain: the names live in
    # xpatch.scenes and xpatch.tree only. A periodic dim is a boundary of the core
    # geometry: xpatch.periodic (PeriodicPatcher) and the padded object are gone.
    for old in (
        "xpatch.scene_source",
        "xpatch.tree_grain",
        "xpatch.periodic",
        "xpatch.xarray.padded",
    ):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_every_apply_verb_takes_the_same_options_with_the_same_defaults():
    import inspect

    from xpatch.xarray.apply import ApplyOptions

    verbs = [xpatch.Patcher.apply, xpatch.ScenePatcher.apply, xpatch.TreePatcher.apply]
    signatures = [inspect.signature(verb).parameters for verb in verbs]
    options = {name: p.default for name, p in signatures[0].items() if name not in ("self", "fn")}
    assert options == ApplyOptions().as_keywords()
    for parameters in signatures[1:]:
        assert {n: p.default for n, p in parameters.items() if n not in ("self", "fn")} == options
    assert [v.__doc__.split("\n")[0] for v in verbs] == [
        "Run ``fn`` over every patch in batches and blend the results onto the grid.",
        "Run ``fn`` over every scene's patches: ``{name: p.apply(fn, ...)}``, lazily.",
        "Run ``fn`` over every node's patches in batches and blend the results per node.",
    ]
