"""telescope.megatron's modules import each other without a circle (TYPE_CHECKING and function-local
imports included), take the run config as ``TelescopeConfig``, and define each function name once."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "telescope-megatron" / "src" / "telescope" / "megatron"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(("telescope", *parts)).removesuffix(".__init__")


def _trees() -> dict[str, ast.Module]:
    return {_module(p): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:  # `from telescope.megatron import checkpoint` names a module
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules}


def test_no_import_circle_between_megatron_modules() -> None:
    trees = _trees()
    graph = {name: _imports(tree, set(trees)) - {name} for name, tree in trees.items()}
    for pkg in [n for n in graph if any(m.startswith(n + ".") for m in graph)]:  # a package's __init__
        graph[pkg] = {m for m in graph[pkg] if not m.startswith(pkg + ".")}  # re-exports its own children
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif len(path) < len(graph):
                visit(nxt, [*path, nxt])

    for start in graph:
        visit(start, [start])
    assert not cycles, f"import circles: {cycles[:3]}"


def test_the_run_config_is_typed() -> None:
    untyped = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg == "cfg":
                if node.annotation is None or ast.unparse(node.annotation) != "TelescopeConfig":
                    untyped.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "cfg":
                if ast.unparse(node.annotation) != "TelescopeConfig":
                    untyped.append(f"{name}:{node.lineno}")
    assert not untyped, untyped


def test_each_public_function_is_defined_once() -> None:
    where: dict[str, list[str]] = {}
    for name, tree in _trees().items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(name)
    assert {f: m for f, m in where.items() if len(m) > 1} == {}
