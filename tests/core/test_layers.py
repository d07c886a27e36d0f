"""Imports only go down: the layer order of ``docs/architecture.md`` holds, and no module circles.

The order is written once, in the ```layers block of docs/architecture.md; this test parses it.
Imports under ``if TYPE_CHECKING:`` are annotations (they never run), so they may name a type of a
higher layer (``hookspecs`` names the rollout records); they still count for circles.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_SRC = ROOT / "telescope-core" / "src"
PACKAGE_SRCS = sorted(ROOT.glob("telescope-*/src"))
# Distributions above telescope-core: core never imports them (it names plugins by string only).
PLUGIN_PACKAGES = (
    "telescope.fsdp",
    "telescope.megatron",
    "telescope.envs",
    "telescope.sandboxes",
    "telescope.cli",
)


@dataclass(frozen=True)
class Edge:
    """One import statement: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    type_checking: bool


def layer_order() -> list[str]:
    """The unit names of docs/architecture.md's ```layers block, lowest first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    units: list[str] = []
    for line in block.group(1).splitlines():
        names = line.split(":", 1)[1] if ":" in line else ""
        units += [n.strip() for n in names.split(",") if n.strip()]
    return units


def modules(src: Path) -> dict[str, Path]:
    found = {}
    for path in src.rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and "TYPE_CHECKING" in ast.unparse(parent.test):
            return True
        parent = parents.get(parent)
    return False


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[Edge]:
    """Every ``telescope.*`` module ``name`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            # ``from pkg import submodule`` imports the submodule, not names of pkg/__init__.py.
            targets = submodules if len(submodules) == len(node.names) else [node.module, *submodules]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            if target.startswith("telescope.") and target != name:
                yield Edge(name, target, node.lineno, _under_type_checking(node, parents))


def unit_of(module: str, units: list[str]) -> str | None:
    """The most specific layer unit ``module`` belongs to (``telescope.core.X`` or ``core`` itself)."""
    rest = module.removeprefix("telescope.core")
    if rest == module:
        return None
    best = None
    for unit in units:
        if unit == "core" and rest == "":
            return unit
        if rest == f".{unit}" or rest.startswith(f".{unit}."):
            if best is None or len(unit) > len(best):
                best = unit
    return best


def core_edges() -> list[Edge]:
    known = modules(CORE_SRC)
    return [edge for name, path in known.items() for edge in imports(name, path, known)]


def test_every_core_module_belongs_to_a_layer() -> None:
    units = layer_order()
    orphans = sorted(m for m in modules(CORE_SRC) if m != "telescope" and unit_of(m, units) is None)
    assert not orphans, f"add these to the ```layers block of docs/architecture.md: {orphans}"


def test_imports_only_go_down() -> None:
    units = layer_order()
    rank = {unit: i for i, unit in enumerate(units)}
    upward = []
    for edge in core_edges():
        source, target = unit_of(edge.source, units), unit_of(edge.target, units)
        if edge.type_checking or source is None or target is None or source == target:
            continue
        if rank[target] > rank[source]:
            upward.append(f"{edge.source}:{edge.line} imports {edge.target} ({source} < {target})")
    assert not upward, "imports that climb a layer:\n" + "\n".join(upward)


def test_core_never_imports_a_plugin_package() -> None:
    bad = [f"{e.source}:{e.line} -> {e.target}" for e in core_edges() if e.target.startswith(PLUGIN_PACKAGES)]
    assert not bad, bad


def test_the_run_directory_schema_imports_nothing_else_of_observe() -> None:
    """``observe/rundir`` is the data model that ``runs show`` and the dashboard read alone."""
    bad = [
        f"{e.source}:{e.line} -> {e.target}"
        for e in core_edges()
        if e.source.startswith("telescope.core.observe.rundir")
        and e.target.startswith("telescope.core.observe")
        and not e.target.startswith("telescope.core.observe.rundir")
    ]
    assert not bad, bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("src", PACKAGE_SRCS, ids=lambda p: p.parent.name)
def test_no_module_circles(src: Path) -> None:
    known = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for edge in imports(name, path, known):
            if edge.target in known:
                graph[name].add(edge.target)
    assert not _cycles(graph), f"modules that import each other (TYPE_CHECKING included): {_cycles(graph)}"


def test_cycle_finder_finds_a_circle() -> None:
    """The checker itself: a three-module circle and a self-contained chain."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
