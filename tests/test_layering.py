"""Layering rules for the xpatch sources, checked statically.

- xpatch.core is the numpy/dask layer: it must never import xarray.
- No import cycle between xpatch modules (imports inside functions count, `if TYPE_CHECKING:`
  blocks do not).
- No module reads another module's private names (`from m import _x`, `obj._x`).
- No module is longer than 600 lines.

The checkers take the package folder as an argument; the self-tests at the end run them on
small synthetic packages, to show they catch planted violations and pass clean code.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

# Found without importing xpatch: the static checks must run even while the package is broken.
PACKAGE = Path(importlib.util.find_spec("xpatch").origin).parent
CORE = PACKAGE / "core"
MAX_LINES = 600


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
        anchors = g.grid_anchors()
        out = core.overlap_add(np.ones((len(anchors), 4)), anchors, g.shape, w)
        assert np.allclose(out, 1.0)
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------
# Static checkers over a package folder (the folder's name is the package's name).


def package_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _show(path: Path, root: Path) -> str:
    return path.relative_to(root.parent).as_posix()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under `node`, skipping the bodies of `if TYPE_CHECKING:` blocks."""
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _runtime_nodes(stmt)
        else:
            yield from _runtime_nodes(child)


def _longest_module(name: str, modules: dict[str, Path]) -> str | None:
    """`name` if it is a module, else its longest prefix that is one (None outside)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _from_base(node: ast.ImportFrom, module: str, modules: dict[str, Path]) -> str:
    """The absolute module named after `from` (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    is_package = modules[module].name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _import_targets(
    node: ast.Import | ast.ImportFrom, module: str, modules: dict[str, Path]
) -> Iterator[tuple[str, str | None]]:
    """(target module, imported name or None) for each alias of an import statement.

    `from p import x` targets the module p.x when x is a submodule of p, else p itself.
    """
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = _longest_module(alias.name, modules)
            if target:
                yield target, None
        return
    base = _from_base(node, module, modules)
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}", None
        else:
            target = _longest_module(base, modules)
            if target:
                yield target, alias.name


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of its first import}, TYPE_CHECKING imports left out."""
    modules = package_modules(root)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for module, path in modules.items():
        for node in _runtime_nodes(_parse(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in _import_targets(node, module, modules):
                    if target != module:
                        graph[module].setdefault(target, node.lineno)
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm; components of two or more modules only."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if succ in members and succ not in parents:
                    parents[succ] = node
                    next_frontier.append(succ)
        frontier = next_frontier
    raise AssertionError(f"no cycle in {component}")


def find_import_cycles(root: Path) -> list[str]:
    """One line per cycle of imports: `a -> b -> a  (a.py:3, b.py:40)`."""
    modules = package_modules(root)
    graph = import_graph(root)
    report = []
    for component in _strongly_connected(graph):
        cycle = _shortest_cycle(graph, component)
        where = ", ".join(
            f"{_show(modules[a], root)}:{graph[a][b]}" for a, b in itertools.pairwise(cycle)
        )
        line = f"{' -> '.join(cycle)}  ({where})"
        if len(component) > len(cycle) - 1:
            line += f"  [component: {', '.join(component)}]"
        report.append(line)
    return report


def _is_private(name: str) -> bool:
    return name.startswith("_") and len(name) > 1 and not name.endswith("__")


def _attribute_targets(target: ast.expr) -> Iterator[ast.Attribute]:
    if isinstance(target, ast.Attribute):
        yield target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _attribute_targets(element)
    elif isinstance(target, ast.Starred):
        yield from _attribute_targets(target.value)


def _name_targets(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _name_targets(element)


def _assign_targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines: def/class names, class-level assignments, `self._x = ...`,
    `object.__setattr__(self, "_x", ...)` and the strings of `__slots__`, anywhere in it.
    """
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                for target in _assign_targets(stmt):
                    names.update(_name_targets(target))
                    if isinstance(target, ast.Name) and target.id == "__slots__":
                        value = stmt.value
                        elements = value.elts if hasattr(value, "elts") else [value]
                        names.update(
                            e.value
                            for e in elements
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
        for target in _assign_targets(node):
            for attribute in _attribute_targets(target):
                if isinstance(attribute.value, ast.Name) and attribute.value.id in ("self", "cls"):
                    names.add(attribute.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__setattr__"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "object"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            names.add(node.args[1].value)
    return names


def _is_self_or_super(obj: ast.expr) -> bool:
    if isinstance(obj, ast.Name):
        return obj.id in ("self", "cls")
    return isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "super"


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    """Class names in an annotation: `Patcher`, `Patcher | None`, `"Patcher"`, `mod.Patcher`."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            return _annotation_names(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return set()
    names = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def _annotated_reads(tree: ast.Module) -> Iterator[tuple[ast.Attribute, set[str]]]:
    """Each `name._x` read whose `name` is annotated in scope (a parameter or `name: T = ...`),
    with the class names of its annotation.
    """

    def visit(node: ast.AST, scope: dict[str, set[str]]) -> Iterator:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            scope = dict(scope)
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None:
                    scope[arg.arg] = _annotation_names(getattr(arg, "annotation", None))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            scope[node.target.id] = _annotation_names(node.annotation)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name)
            and scope.get(node.value.id)
        ):
            yield node, scope[node.value.id]
        for child in ast.iter_child_nodes(node):
            yield from visit(child, scope)

    yield from visit(tree, {})


# (file relative to the package's parent, attribute) -> why reading it is fine. An untyped
# read is only flagged when an xpatch module defines the name, so third-party privates
# (xarray's `var._data`) pass unless xpatch happens to define the same name; list such
# clashes here.
ALLOWED_PRIVATE_READS: dict[tuple[str, str], str] = {}


def find_private_reads(root: Path, allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Private names of one module used by another.

    - `from m import _x` where m is not the importing module (importing a private *module*,
      `from pkg import _impl`, is fine);
    - `obj._x` where obj is not self/cls/super() and _x is defined in another module of the
      package but not in the reading module;
    - `obj._x` where obj is annotated with a class defined in another module, and _x is
      defined in that module (even if the reading module defines an `_x` of its own).
    """
    allowed = ALLOWED_PRIVATE_READS if allowed is None else allowed
    modules = package_modules(root)
    trees = {module: _parse(path) for module, path in modules.items()}
    definitions = {module: defined_names(tree) for module, tree in trees.items()}
    classes = {
        module: {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        for module, tree in trees.items()
    }
    found: set[tuple[str, int, str, str]] = set()  # (file, line, name, what)
    for module, tree in trees.items():
        here = _show(modules[module], root)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for target, name in _import_targets(node, module, modules):
                    if name and _is_private(name) and target != module:
                        what = f"imports {name} from {_show(modules[target], root)}"
                        found.add((here, node.lineno, name, what))
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and _is_private(node.attr)
                and not _is_self_or_super(node.value)
                and node.attr not in definitions[module]
            ):
                owners = [
                    _show(modules[other], root)
                    for other, names in definitions.items()
                    if other != module and node.attr in names
                ]
                if owners:
                    what = f"reads {node.attr} defined in {', '.join(owners)}"
                    found.add((here, node.lineno, node.attr, what))
        for node, annotation in _annotated_reads(tree):
            if not _is_private(node.attr) or annotation & classes[module]:
                continue
            owners = [
                _show(modules[other], root)
                for other in modules
                if other != module
                and annotation & classes[other]
                and node.attr in definitions[other]
            ]
            if owners:
                what = f"reads {node.attr} defined in {', '.join(owners)}"
                found.add((here, node.lineno, node.attr, what))
    return [
        f"{here}:{line} {what}"
        for here, line, name, what in sorted(found)
        if (here, name) not in allowed
    ]


def find_long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    report = []
    for path in package_modules(root).values():
        count = len(path.read_text().splitlines())
        if count > limit:
            report.append(f"{_show(path, root)} has {count} lines (limit {limit})")
    return report


# ---------------------------------------------------------------------------------------------
# The rules, on xpatch.


def test_no_import_cycle_inside_xpatch():
    cycles = find_import_cycles(PACKAGE)
    assert not cycles, "import cycles between xpatch modules:\n" + "\n".join(cycles)


def test_no_module_reads_another_modules_private_names():
    hits = find_private_reads(PACKAGE)
    assert not hits, "private names read across xpatch modules:\n" + "\n".join(hits)


def test_no_module_is_over_600_lines():
    long = find_long_modules(PACKAGE)
    assert not long, "xpatch modules over the limit:\n" + "\n".join(long)


# ---------------------------------------------------------------------------------------------
# Self-tests of the checkers, on synthetic packages.


def make_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN_SOURCES = {
    "__init__.py": """
        from pkg import _impl as _impl
        from pkg.core import Geometry
        from pkg.front import Front
        """,
    "cli.py": """
        import pkg  # the top package, which does not import cli: no cycle


        def main():
            return pkg.Front(pkg.Geometry((2, 2))).to_back()
        """,
    "_impl.py": """
        from pkg.core.geometry import Geometry
        """,
    "core/__init__.py": """
        from .geometry import Geometry
        """,
    "core/geometry.py": """
        class Geometry:
            __slots__ = ("_shape",)

            def __init__(self, shape):
                object.__setattr__(self, "_shape", shape)

            def __eq__(self, other):
                return self._shape == other._shape  # its own private name: fine
        """,
    "front.py": """
        from __future__ import annotations

        from typing import TYPE_CHECKING

        from pkg.core import Geometry

        if TYPE_CHECKING:
            from pkg.back import Back  # typing only: not a cycle


        class Front:
            _window = None

            def __init__(self, geometry: Geometry):
                self._geometry = geometry

            def window(self):
                return self._window

            def to_back(self) -> Back:
                from pkg.back import Back

                return Back(self.window(), __name__)
        """,
    "back.py": """
        class Base:
            def _setup(self):
                return 1


        class Back(Base):
            def __init__(self, window, name):
                self.total = super()._setup() + self._setup()
                self._window = window
                self.data = window._data  # a third-party private name: not pkg's business
        """,
}
CLEAN = {name: textwrap.dedent(text) for name, text in CLEAN_SOURCES.items()}


def test_checkers_pass_a_clean_package(tmp_path):
    root = make_package(tmp_path, CLEAN)
    graph = import_graph(root)
    assert set(graph["pkg.front"]) == {"pkg.core", "pkg.back"}  # not the TYPE_CHECKING import
    assert set(graph["pkg.cli"]) == {"pkg"}
    assert set(graph["pkg"]) == {"pkg._impl", "pkg.core", "pkg.front"}
    assert find_import_cycles(root) == []
    assert find_private_reads(root) == []
    assert find_long_modules(root) == []


def line_of(text: str, fragment: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


def test_checkers_catch_planted_violations(tmp_path):
    files = dict(CLEAN)
    # back -> front at module level closes front -> back (an import inside a function), and
    # back imports one of front's private names (a public one is fine).
    files["back.py"] += "\nfrom pkg.front import _helper, helper\n"
    files["front.py"] += textwrap.dedent(
        """

        def peek(back: Back):
            return back._setup(), back._window, back.__dict__


        def peek_untyped(other):
            return other._window  # front defines a _window too, and other's type is unknown


        def _helper():
            return 0


        helper = _helper
        """
    )
    # A core submodule imports its own package's __init__, which imports it.
    files["core/geometry.py"] = "from pkg.core import Geometry as G\n" + files["core/geometry.py"]
    files["long.py"] = "x = 1\n" * (MAX_LINES + 1)
    root = make_package(tmp_path, files)
    back_import = line_of(files["back.py"], "from pkg.front import")
    front_import = line_of(files["front.py"], "        from pkg.back import Back")
    peek = line_of(files["front.py"], "back._setup()")

    assert find_import_cycles(root) == [
        f"pkg.back -> pkg.front -> pkg.back  (pkg/back.py:{back_import}, "
        f"pkg/front.py:{front_import})",
        "pkg.core -> pkg.core.geometry -> pkg.core"
        "  (pkg/core/__init__.py:2, pkg/core/geometry.py:1)",
    ]
    assert find_private_reads(root) == [
        f"pkg/back.py:{back_import} imports _helper from pkg/front.py",
        f"pkg/front.py:{peek} reads _setup defined in pkg/back.py",
        f"pkg/front.py:{peek} reads _window defined in pkg/back.py",
    ]
    assert find_long_modules(root) == [f"pkg/long.py has {MAX_LINES + 1} lines (limit {MAX_LINES})"]
    # An allow-list entry silences one name in one file.
    allowed = {("pkg/front.py", "_setup"): "test", ("pkg/front.py", "_window"): "test"}
    assert find_private_reads(root, allowed) == [
        f"pkg/back.py:{back_import} imports _helper from pkg/front.py"
    ]
