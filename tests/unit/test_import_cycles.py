"""The hang analysis imports in one direction: no module of analysis/hang reaches itself again
through the others' imports (``TYPE_CHECKING`` imports and imports inside functions count: a
cycle hidden there is still one the next change trips on)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

HANG = ROOT / "tools" / "rankscope" / "analysis" / "hang"
PKG = "rankscope.analysis.hang"


def _imports(path: Path) -> set[str]:
    """The modules of analysis/hang that ``path`` imports, at any depth."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n[len(PKG) + 1 :].split(".")[0] for n in names if n.startswith(PKG + ".")}
    return out


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
    graph = {p.stem: _imports(p) - {p.stem} for p in HANG.glob("*.py") if p.stem != "__init__"}
    assert set(graph) >= {"verdict_facts", "verdict_evidence", "verdict_phrases"}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
