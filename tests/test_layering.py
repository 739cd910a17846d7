"""The house rules of the xpatch package, checked statically: rooms, their order, concerns.

The package is a row of rooms (folders, and a few top-level modules), each on a
level (:data:`ROOMS`, lowest first). The rules:

- **Direction.** A module imports only from its own room or rooms on lower levels,
  type hints included (``if TYPE_CHECKING:`` imports count). Rooms on one level
  (``grain`` and ``io``, ``scenes`` and ``tree``) do not import each other. A
  package's ``__init__`` may re-export from its own folder.
- **No circles** between modules, type hints included.
- **No private names** of one module read by another (``from m import _x``, ``obj._x``).
- **One concern per room**, as far as imports tell: a third-party library that
  belongs to one room (:data:`CONCERNS`: Grain to ``grain``, argparse to ``cli``,
  fsspec and rasterio to ``io``; zarr to ``io``, which writes it, and ``grain``, which
  reads its chunks for training) is imported nowhere else, and ``core`` imports
  neither xarray nor pandas.
- **Core functions are short to call**: at most 8 parameters (``self`` and ``cls``
  not counted; numba's kernels, which take flat arguments, are listed in
  :data:`FLAT_KERNELS`), and no ``# fmt: skip`` in ``core``.
- **Reductions are objects**: no module but ``core/blend/reductions.py`` compares
  anything to a reduction's name (``reduce == "mean"``, ``in ("vote", ...)``).

The checkers take the package folder as an argument; the self-tests at the end run
each of them on small synthetic packages, to show that each rule can fail.

``python tests/test_layering.py [PACKAGE_FOLDER]`` prints the import graph's counts
(modules, arrows, levels, circles, imports against the room order).
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

# Found without importing xpatch: the static checks must run even while the package is broken.
PACKAGE = Path(importlib.util.find_spec("xpatch").origin).parent
CORE = PACKAGE / "core"

#: The rooms of xpatch, lowest level first: a room's modules are those whose dotted
#: name starts with it (the longest match wins). Rooms in one tuple share a level.
ROOMS: tuple[tuple[str, ...], ...] = (
    ("xpatch.version", "xpatch.core"),
    ("xpatch.core.blend",),
    ("xpatch.core.apply",),
    ("xpatch.xarray",),
    ("xpatch.grain", "xpatch.io", "xpatch.grid"),
    ("xpatch.patcher",),
    ("xpatch.forecast",),
    ("xpatch.accessor", "xpatch.scenes", "xpatch.tree"),
    ("xpatch.cli",),
    ("xpatch", "xpatch.__main__"),
)

#: Third-party top-level modules -> the room (or rooms) that own them: nobody else imports them.
CONCERNS: dict[str, str | tuple[str, ...]] = {
    "grain": "xpatch.grain",
    "absl": "xpatch.grain",
    "argparse": "xpatch.cli",
    "zarr": ("xpatch.io", "xpatch.grain"),
    "fsspec": "xpatch.io",
    "rasterio": ("xpatch.io", "xpatch.grid"),
    "geopandas": "xpatch.grid",
    "rioxarray": "xpatch.io",
    "distributed": "xpatch.io",
    "fcntl": "xpatch.io",
}
#: Rooms that must not import a library at all: the numpy/dask core knows no labels.
FORBIDDEN: dict[str, tuple[str, ...]] = {"xpatch.core": ("xarray", "pandas")}

#: Core functions that may take more than 8 parameters, and why.
FLAT_KERNELS: dict[tuple[str, str], str] = {
    ("xpatch/core/blend/compiled.py", "_blend_rows"): "a numba kernel: flat arguments",
    ("xpatch/core/blend/compiled.py", "_blend_patches"): "a numba kernel: flat arguments",
    ("xpatch/core/blend/compiled.py", "_blend_clean_patches"): "a numba kernel: flat arguments",
}
MAX_PARAMETERS = 8

#: The names ``reduce=`` takes: only the reduction objects compare anything to them.
REDUCTION_NAMES = frozenset({"mean", "sum", "max", "min", "vote", "argmax"})
REDUCTIONS_MODULE = "xpatch.core.blend.reductions"


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


def import_graph(root: Path, type_hints: bool = True) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of its first import}.

    Imports under ``if TYPE_CHECKING:`` count (a type hint is a dependency too),
    unless ``type_hints=False``.
    """
    modules = package_modules(root)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for module, path in modules.items():
        tree = _parse(path)
        nodes = ast.walk(tree) if type_hints else _runtime_nodes(tree)
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in _import_targets(node, module, modules):
                    if target != module:
                        line = graph[module].get(target, node.lineno)
                        graph[module][target] = min(line, node.lineno)
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


def room_of(module: str, rooms: Sequence[Sequence[str]]) -> tuple[str, int] | None:
    """The room of ``module`` (the longest prefix that names one) and its level."""
    best = None
    for level, names in enumerate(rooms):
        for room in names:
            if (module == room or module.startswith(room + ".")) and (
                best is None or len(room) > len(best[0])
            ):
                best = (room, level)
    return best


def find_upward_imports(root: Path, rooms: Sequence[Sequence[str]]) -> list[str]:
    """One line per import that points up the room order, or across a level.

    A package's ``__init__`` may import from its own folder (it is the folder's face).
    """
    modules = package_modules(root)
    graph = import_graph(root)
    report = []
    for module, targets in graph.items():
        here = room_of(module, rooms)
        for target, line in sorted(targets.items()):
            there = room_of(target, rooms)
            if here is None or there is None or here[0] == there[0]:
                continue
            if modules[module].name == "__init__.py" and target.startswith(module + "."):
                continue
            if there[1] > here[1] or (there[1] == here[1]):
                what = "up" if there[1] > here[1] else "across"
                report.append(
                    f"{_show(modules[module], root)}:{line} imports {target}: {what} from room "
                    f"{here[0]} (level {here[1]}) to {there[0]} (level {there[1]})"
                )
    return sorted(report)


def _imported_top_modules(tree: ast.Module) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0], node.lineno


def find_mixed_concerns(
    root: Path,
    rooms: Sequence[Sequence[str]],
    concerns: dict[str, str | tuple[str, ...]] | None = None,
    forbidden: dict[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """Imports of a library that another room owns, or that a room must not use."""
    concerns = CONCERNS if concerns is None else concerns
    forbidden = FORBIDDEN if forbidden is None else forbidden
    report = []
    for module, path in package_modules(root).items():
        here = room_of(module, rooms)
        for library, line in _imported_top_modules(_parse(path)):
            owner = concerns.get(library)
            owners = (owner,) if isinstance(owner, str) else owner
            if owners is not None and not any(
                here is not None and here[0].startswith(o) and module.startswith(o) for o in owners
            ):
                owned = " and ".join(owners)
                report.append(
                    f"{_show(path, root)}:{line} imports {library}, which is {owned}'s concern"
                )
            for room, libraries in forbidden.items():
                in_room = module == room or module.startswith(room + ".")
                if in_room and library in libraries:
                    report.append(f"{_show(path, root)}:{line} imports {library} in {room}")
    return sorted(set(report))


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [n for n in names if n not in ("self", "cls")]


def find_long_signatures(
    root: Path,
    folder: Path,
    limit: int = MAX_PARAMETERS,
    allowed: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """Functions under ``folder`` that take more than ``limit`` parameters."""
    allowed = FLAT_KERNELS if allowed is None else allowed
    report = []
    for path in sorted(folder.rglob("*.py")):
        here = _show(path, root)
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = len(_parameters(node))
                if count > limit and (here, node.name) not in allowed:
                    report.append(f"{here}:{node.lineno} {node.name} takes {count} parameters")
    return report


def find_format_skips(root: Path, folder: Path) -> list[str]:
    """Lines under ``folder`` that opt out of the formatter (``# fmt: skip``, ``# fmt: off``)."""
    report = []
    for path in sorted(folder.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "# fmt: skip" in line or "# fmt: off" in line:
                report.append(f"{_show(path, root)}:{number} {line.strip()}")
    return report


def _names_a_reduction(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in REDUCTION_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_reduction(e) for e in node.elts)
    return False


def find_reduction_name_checks(root: Path, owner: str = REDUCTIONS_MODULE) -> list[str]:
    """Comparisons with a reduction's name (``== "mean"``, ``in ("max", ...)``) elsewhere."""
    report = []
    for module, path in package_modules(root).items():
        if module == owner:
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Compare) and any(
                _names_a_reduction(side) for side in (node.left, *node.comparators)
            ):
                report.append(f"{_show(path, root)}:{node.lineno} compares with a reduction's name")
    return report


def _levels(graph: dict[str, set[str]]) -> int:
    """The longest chain of arrows in ``graph``, counting its nodes; circles count as one node."""
    components = _strongly_connected({n: dict.fromkeys(t) for n, t in graph.items()})
    group = {m: i for i, members in enumerate(components) for m in members}
    nodes: dict = {}
    for node, targets in graph.items():
        here = group.get(node, node)
        nodes.setdefault(here, set()).update(
            group.get(t, t) for t in targets if group.get(t, t) != here
        )
    depth: dict = {}

    def level(node) -> int:
        if node not in depth:
            depth[node] = 1 + max((level(t) for t in nodes.get(node, ())), default=0)
        return depth[node]

    return max((level(n) for n in nodes), default=0)


def top_room(module: str) -> str:
    """A module's room for counting: the package's child it lives in (a folder or a module)."""
    return ".".join(module.split(".")[:2])


def graph_counts(root: Path, rooms: Sequence[Sequence[str]] | None = None) -> dict[str, int]:
    """The import graph in numbers, of modules and of rooms (the package's children).

    Levels: the longest chain of imports, the modules of one circle counted as one.
    With ``rooms``, the imports that point up (or across) their order.
    """
    graph = import_graph(root)
    modules = {m: set(t) for m, t in graph.items()}
    between: dict[str, set[str]] = {}
    for m, targets in modules.items():
        here = top_room(m)
        between.setdefault(here, set()).update(top_room(t) for t in targets if top_room(t) != here)
    room_graph = {r: dict.fromkeys(t) for r, t in between.items()}
    counts = {
        "modules": len(graph),
        "arrows": sum(len(t) for t in graph.values()),
        "levels": _levels(modules),
        "circles": len(_strongly_connected(graph)),
        "rooms": len(between),
        "arrows between rooms": sum(len(t) for t in between.values()),
        "room levels": _levels(between),
        "room circles": len(_strongly_connected(room_graph)),
    }
    if rooms is not None:
        counts["imports up or across the rooms"] = len(find_upward_imports(root, rooms))
    return counts


# ---------------------------------------------------------------------------------------------
# The rules, on xpatch.


def test_every_xpatch_module_has_a_room():
    homeless = [m for m in package_modules(PACKAGE) if room_of(m, ROOMS) is None]
    assert not homeless, f"modules in no room of ROOMS: {homeless}"


def test_imports_point_down_the_rooms_type_hints_included():
    hits = find_upward_imports(PACKAGE, ROOMS)
    assert not hits, "imports against the room order:\n" + "\n".join(hits)


def test_no_import_cycle_inside_xpatch():
    cycles = find_import_cycles(PACKAGE)
    assert not cycles, "import cycles between xpatch modules:\n" + "\n".join(cycles)


def test_no_module_reads_another_modules_private_names():
    hits = find_private_reads(PACKAGE)
    assert not hits, "private names read across xpatch modules:\n" + "\n".join(hits)


def test_each_library_stays_in_its_room():
    hits = find_mixed_concerns(PACKAGE, ROOMS)
    assert not hits, "libraries outside their room:\n" + "\n".join(hits)


def test_core_functions_take_at_most_8_parameters_and_keep_the_format():
    long = find_long_signatures(PACKAGE, CORE)
    skips = find_format_skips(PACKAGE, CORE)
    assert not long + skips, "\n".join(long + skips)


def test_only_the_reduction_objects_compare_reduction_names():
    hits = find_reduction_name_checks(PACKAGE)
    assert not hits, "\n".join(hits)


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
# Self-tests of the checkers, on synthetic packages.


def make_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


#: A synthetic house: core < front < (back, side) < cli, the package itself on top.
SYNTHETIC_ROOMS = (
    ("pkg.core",),
    ("pkg.front",),
    ("pkg.back", "pkg.side"),
    ("pkg.cli",),
    ("pkg", "pkg._impl"),
)
SYNTHETIC_CONCERNS = {"argparse": "pkg.cli"}
SYNTHETIC_FORBIDDEN = {"pkg.core": ("xarray",)}

CLEAN_SOURCES = {
    "__init__.py": """
        from pkg import _impl as _impl
        from pkg.core import Geometry
        from pkg.front import Front
        """,
    "cli.py": """
        import argparse

        import pkg.back


        def main():
            argparse.ArgumentParser()
            return pkg.back.Back(None, __name__)
        """,
    "_impl.py": """
        from pkg.core.geometry import Geometry
        """,
    "core/__init__.py": """
        from .geometry import Geometry
        """,
    "core/geometry.py": """
        import numpy as np


        class Geometry:
            __slots__ = ("_shape",)

            def __init__(self, shape):
                object.__setattr__(self, "_shape", shape)

            def __eq__(self, other):
                return self._shape == other._shape  # its own private name: fine

            def size(self, a, b, c, d, e, f, g, h):  # 8 parameters besides self: fine
                return np.prod(self._shape)
        """,
    "front.py": """
        from __future__ import annotations

        from pkg.core import Geometry


        class Front:
            _window = None

            def __init__(self, geometry: Geometry, reduce: str = "mean"):
                self._geometry = geometry
                self.reduce = reduce  # a default, not a comparison: fine

            def window(self):
                return self._window
        """,
    "back.py": """
        from pkg.front import Front


        class Base:
            def _setup(self):
                return 1


        class Back(Base):
            def __init__(self, window, name):
                self.total = super()._setup() + self._setup()
                self._window = window
                self.front = Front(None)
                self.data = window._data if window else None  # a third-party private name
        """,
    "side.py": """
        from pkg.core.geometry import Geometry
        """,
}
CLEAN = {name: textwrap.dedent(text) for name, text in CLEAN_SOURCES.items()}


def test_checkers_pass_a_clean_package(tmp_path):
    root = make_package(tmp_path, CLEAN)
    graph = import_graph(root)
    assert set(graph["pkg.back"]) == {"pkg.front"}
    assert set(graph["pkg.cli"]) == {"pkg.back"}
    assert set(graph["pkg"]) == {"pkg._impl", "pkg.core", "pkg.front"}
    assert find_import_cycles(root) == []
    assert find_private_reads(root) == []
    assert find_upward_imports(root, SYNTHETIC_ROOMS) == []
    assert find_mixed_concerns(root, SYNTHETIC_ROOMS, SYNTHETIC_CONCERNS, SYNTHETIC_FORBIDDEN) == []
    assert find_long_signatures(root, root / "core", allowed={}) == []
    assert find_format_skips(root, root / "core") == []
    assert find_reduction_name_checks(root, owner="pkg.core") == []
    assert graph_counts(root, SYNTHETIC_ROOMS) == {
        "modules": 8,
        "arrows": 9,
        "levels": 5,  # cli -> back -> front -> core -> core.geometry
        "circles": 0,
        "rooms": 7,  # pkg, _impl, cli, core, front, back, side
        "arrows between rooms": 8,
        "room levels": 4,  # cli -> back -> front -> core
        "room circles": 0,
        "imports up or across the rooms": 0,
    }


def line_of(text: str, fragment: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


def test_checkers_catch_planted_cycles_and_private_reads(tmp_path):
    files = dict(CLEAN)
    # front -> back (a type hint only) closes back -> front, and back imports one of
    # front's private names (a public one is fine).
    files["back.py"] += "\nfrom pkg.front import _helper, helper\n"
    files["front.py"] += textwrap.dedent(
        """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from pkg.back import Back


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
    root = make_package(tmp_path, files)
    back_import = line_of(files["back.py"], "from pkg.front import Front")
    front_import = line_of(files["front.py"], "    from pkg.back import Back")
    peek = line_of(files["front.py"], "back._setup()")
    private = line_of(files["back.py"], "from pkg.front import _helper")

    assert find_import_cycles(root) == [
        f"pkg.back -> pkg.front -> pkg.back  (pkg/back.py:{back_import}, "
        f"pkg/front.py:{front_import})",
        "pkg.core -> pkg.core.geometry -> pkg.core"
        "  (pkg/core/__init__.py:2, pkg/core/geometry.py:1)",
    ]
    assert find_private_reads(root) == [
        f"pkg/back.py:{private} imports _helper from pkg/front.py",
        f"pkg/front.py:{peek} reads _setup defined in pkg/back.py",
        f"pkg/front.py:{peek} reads _window defined in pkg/back.py",
    ]
    # A type hint that points up the rooms is caught too.
    assert find_upward_imports(root, SYNTHETIC_ROOMS) == [
        f"pkg/front.py:{front_import} imports pkg.back: up from room pkg.front (level 1) "
        "to pkg.back (level 2)"
    ]
    # An allow-list entry silences one name in one file.
    allowed = {("pkg/front.py", "_setup"): "test", ("pkg/front.py", "_window"): "test"}
    assert find_private_reads(root, allowed) == [
        f"pkg/back.py:{private} imports _helper from pkg/front.py"
    ]
    assert graph_counts(root, SYNTHETIC_ROOMS)["circles"] == 2


def test_checkers_catch_imports_up_and_across_the_rooms(tmp_path):
    files = dict(CLEAN)
    files["core/geometry.py"] += (
        "\n\ndef late():\n    from pkg.front import Front\n\n    return Front\n"
    )
    files["side.py"] += "from pkg.back import Back\n"
    root = make_package(tmp_path, files)
    late = line_of(files["core/geometry.py"], "from pkg.front import Front")
    across = line_of(files["side.py"], "from pkg.back import Back")
    assert find_upward_imports(root, SYNTHETIC_ROOMS) == [
        f"pkg/core/geometry.py:{late} imports pkg.front: up from room pkg.core (level 0) "
        "to pkg.front (level 1)",
        f"pkg/side.py:{across} imports pkg.back: across from room pkg.side (level 2) "
        "to pkg.back (level 2)",
    ]


def test_checkers_catch_a_library_outside_its_room(tmp_path):
    files = dict(CLEAN)
    files["back.py"] = "import argparse.tools\n" + files["back.py"]
    files["core/geometry.py"] = "import xarray as xr\n" + files["core/geometry.py"]
    root = make_package(tmp_path, files)
    assert find_mixed_concerns(root, SYNTHETIC_ROOMS, SYNTHETIC_CONCERNS, SYNTHETIC_FORBIDDEN) == [
        "pkg/back.py:1 imports argparse, which is pkg.cli's concern",
        "pkg/core/geometry.py:1 imports xarray in pkg.core",
    ]


def test_a_library_of_two_rooms_is_imported_in_both_and_nowhere_else(tmp_path):
    files = dict(CLEAN)
    for name in ("back.py", "side.py", "front.py"):
        files[name] = "import zarr\n" + files.get(name, "")
    root = make_package(tmp_path, files)
    concerns = {"zarr": ("pkg.back", "pkg.side")}
    assert find_mixed_concerns(root, SYNTHETIC_ROOMS, concerns, {}) == [
        "pkg/front.py:1 imports zarr, which is pkg.back and pkg.side's concern"
    ]


def test_checkers_catch_long_signatures_format_skips_and_name_checks(tmp_path):
    files = dict(CLEAN)
    files["core/geometry.py"] += textwrap.dedent(
        """

        def wide(a, b, c, d, e, f, g, h, *rest):
            return a  # fmt: skip


        def reduced(values, reduce):
            if reduce == "max" or reduce in ("vote", "other"):
                return values.max()
            return values
        """
    )
    root = make_package(tmp_path, files)
    text = files["core/geometry.py"]
    wide, skip = line_of(text, "def wide("), line_of(text, "# fmt: skip")
    check = line_of(text, 'if reduce == "max"')
    assert find_long_signatures(root, root / "core", allowed={}) == [
        f"pkg/core/geometry.py:{wide} wide takes 9 parameters"
    ]
    allowed = {("pkg/core/geometry.py", "wide"): "test"}
    assert find_long_signatures(root, root / "core", allowed=allowed) == []
    assert find_format_skips(root, root / "core") == [
        f"pkg/core/geometry.py:{skip} return a  # fmt: skip"
    ]
    assert find_reduction_name_checks(root, owner="pkg.front") == [
        f"pkg/core/geometry.py:{check} compares with a reduction's name",
        f"pkg/core/geometry.py:{check} compares with a reduction's name",
    ]
    assert find_reduction_name_checks(root, owner="pkg.core.geometry") == []


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    has_rooms = (folder / "core" / "blend").is_dir()
    for key, value in graph_counts(folder, ROOMS if has_rooms else None).items():
        print(f"{key}: {value}")
