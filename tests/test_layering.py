"""xpatch.core is the numpy/dask layer: it must never import xarray."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import xpatch

CORE = Path(xpatch.__file__).parent / "core"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_sources_import_no_xarray_and_nothing_above_core():
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        for module in imported_modules(path):
            assert not module.startswith(("xarray", "pandas")), f"{path.name} imports {module}"
            if module.startswith("xpatch"):
                assert module.startswith("xpatch.core"), f"{path.name} imports {module}"


def test_core_runs_with_xarray_unimportable():
    # Load xpatch.core under a bare parent package, with `import xarray` made to fail.
    code = textwrap.dedent(
        f"""
        import sys, types
        sys.modules["xarray"] = None
        parent = types.ModuleType("xpatch")
        parent.__path__ = [{str(CORE.parent)!r}]
        sys.modules["xpatch"] = parent
        import numpy as np
        import xpatch.core as core
        g = core.Geometry.build({{"x": 10}}, {{"x": 4}}, 3, "shift")
        w = core.make_window("hann", g.dims, g.size)
        out = core.overlap_add(np.ones((4, 4)), g.grid_anchors(), g.shape, w)
        assert np.allclose(out, 1.0)
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
