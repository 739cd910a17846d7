"""Periodic dims and reductions are the core's business: the layers above ask, not branch.

Issue 38's rule, checked on the source: outside ``xpatch/core/`` and the option
parser (``xpatch/xarray/layout.py``) no code names a periodic boundary (docstrings
aside), and outside ``xpatch/core/blend/`` no code compares a reduction by its name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import xpatch

PACKAGE = Path(xpatch.__file__).parent
REDUCTIONS = {"mean", "sum", "max", "min", "vote", "argmax"}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def periodic_names(source: str) -> list[int]:
    """Lines that name a periodic boundary in code (not in docstrings or comments)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and id(node) not in docs:
            name = node.value if isinstance(node.value, str) else ""
        else:
            continue
        if "periodic" in name.lower() and (not isinstance(node, ast.Constant) or " " not in name):
            lines.append(node.lineno)
    return lines


def reduction_comparisons(source: str) -> list[int]:
    """Lines that compare something with a reduction's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
            for value in values:
                constants = (
                    value.elts if isinstance(value, ast.Tuple | ast.List | ast.Set) else [value]
                )
                if any(isinstance(c, ast.Constant) and c.value in REDUCTIONS for c in constants):
                    lines.append(node.lineno)
    return lines


def _modules(outside: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(outside):
            found[rel] = path.read_text()
    return found


def test_the_checks_find_what_they_look_for():
    branch = 'def f(g):\n    """A periodic dim."""\n    if g.periodic_axes:\n        return 1\n'
    assert periodic_names(branch) == [3]
    assert periodic_names('b = {"x": "periodic"}\n') == [1]
    assert reduction_comparisons('if reduce.name == "vote":\n    pass\n') == [1]
    assert reduction_comparisons('if r in ("max", "min"):\n    pass\n') == [1]


def test_no_layer_above_the_core_branches_on_a_periodic_boundary():
    offences = {
        rel: periodic_names(text)
        for rel, text in _modules(("core/", "xarray/layout.py")).items()
        if periodic_names(text)
    }
    assert offences == {}


def test_no_module_outside_the_blends_compares_reductions_by_name():
    offences = {
        rel: reduction_comparisons(text)
        for rel, text in _modules(("core/blend/",)).items()
        if reduction_comparisons(text)
    }
    assert offences == {}
