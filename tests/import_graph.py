"""The import graph of `utils/`: every module's imports (imports inside
functions count, relative ones resolved) and a cycle finder; the
structure and provenance tests read it."""

from __future__ import annotations

import ast
from pathlib import Path

UTILS = Path(__file__).resolve().parents[1] / "utils"


def module_name(path: Path) -> str:
    rel = path.relative_to(UTILS.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


PACKAGES = {module_name(p) for p in UTILS.rglob("__init__.py")}


def modules() -> dict[str, ast.Module]:
    return {
        module_name(p): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted(UTILS.rglob("*.py"))
    }


def imported(tree: ast.Module, name: str, top_level_only: bool = False) -> set[str]:
    """Names of modules (and of what they import) that the module `name`
    imports; relative imports resolved."""
    package = name if name in PACKAGES else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                head = pkg[: len(pkg) - node.level + 1]
                base = ".".join(head + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {
        name: {m for m in imported(tree, name) if m in mods and m != name}
        for name, tree in mods.items()
    }


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None
