"""The hang analysis and the capabilities import in one direction: no module of analysis/hang or
of capabilities/ reaches itself again through the others' imports (``TYPE_CHECKING`` imports and
imports inside functions count: a cycle hidden there is still one the next change trips on)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

TOOLS = ROOT / "tools"


def _module(path: Path) -> str:
    """The dotted name of a file under tools/ (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(TOOLS).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names(node: ast.AST, here: str, is_package: bool) -> list[str]:
    """The dotted names an import statement reaches, relative ones resolved against ``here``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = here.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join([*anchor, *([base] if base else [])])
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def _graph(folder: Path) -> dict[str, set[str]]:
    """Each module of ``folder`` (at any depth) and the modules of ``folder`` it imports."""
    files = {_module(p): p for p in folder.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _names(node, name, path.stem == "__init__"):
                known = [m for m in files if target == m or target.startswith(m + ".")]
                if known:
                    out.add(max(known, key=len))
        graph[name] = out - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_hang_analysis_has_no_import_cycle() -> None:
    graph = _graph(TOOLS / "rankscope" / "analysis" / "hang")
    hang = "rankscope.analysis.hang."
    assert {hang + m for m in ("verdict_facts", "verdict_evidence", "verdict_phrases")} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_capabilities_have_no_import_cycle() -> None:
    graph = _graph(TOOLS / "rankscope" / "capabilities")
    caps = "rankscope.capabilities."
    assert caps + "recorder.debug_server" in graph[caps + "recorder.pickup"]  # subpackages are read
    assert caps + "judge" in graph[caps + "remote"]  # imports inside functions are read
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_a_cycle_is_found_and_named() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_are_resolved() -> None:
    tree = ast.parse("from . import b\nfrom .sub import c\n")
    assert [n for node in tree.body for n in _names(node, "pkg.mod", False)] == [
        "pkg",
        "pkg.b",
        "pkg.sub",
        "pkg.sub.c",
    ]
    assert _names(tree.body[0], "pkg", True) == ["pkg", "pkg.b"]  # in a package's __init__
