"""The layering of ARCHITECTURE.md, checked on every module, and proven to bite.

The rules and the table come from ARCHITECTURE.md through tests/layering.py. The real tree must
break none of them; then each kind of violation is planted, alone, in a copy of the package, and
the checker must report it at the planted lines and nowhere else. A checker that passes a broken
tree is worse than none: it says "checked".
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import rankscope
from tests.layering import check, layer_of, modules, parse_table, table_problems
from tests.paths import ROOT

PKG = Path(rankscope.__file__).parent
TABLE = parse_table((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))


def test_the_real_tree_keeps_every_rule() -> None:
    assert [str(v) for v in check(PKG, TABLE)] == []


def test_the_table_places_each_module_where_the_picture_says() -> None:
    """The rows people read in ARCHITECTURE.md are the ones the checker applies."""
    where = {m: (layer.name if (layer := layer_of(m, TABLE)) else None) for m in modules(PKG)}
    assert {where[m] for m in ("validate", "api")} == {"facade"}
    assert where["options"] == "options"  # pure: runtime/pyspy.py takes the object a face built
    assert {where[m] for m in ("lazy", "errors", "")} == {"base"}
    assert where["analysis.redact"] == "analysis"  # it does no I/O
    assert where["runtime.procfs"] == where["resources"] == "runtime"
    assert where["capabilities.launch"] == where["probe.flight"] == "shell"
    assert where["mcp_server"] == where["mcp_tools._common"] == where["commands.base"] == "face"
    assert None not in where.values()


def test_a_table_whose_arrows_go_up_is_refused() -> None:
    bad = [
        replace(row, may_import=(*row.may_import, "render")) if row.name == "analysis" else row
        for row in TABLE
    ]
    assert [str(v) for v in table_problems(bad)] == [
        "analysis:0: table: may import render, which is not below it"
    ]
    twice = [*TABLE, replace(TABLE[-1], name="more")]
    assert any("listed twice" in str(v) for v in table_problems(twice))


@dataclass(frozen=True)
class Plant:
    """One violation to plant: ``code`` appended to the package's ``path`` (created when new)."""

    name: str
    path: str
    code: str
    rule: str
    says: str


ANALYSIS = "analysis/ranges.py"
SHELL = "capabilities/consistency.py"

PLANTS = [
    Plant("models imports analysis", "models/base.py", "from rankscope.analysis.ranges import rank_ranges\n",
          "upward", "models imports analysis.ranges (analysis)"),
    Plant("analysis imports render", ANALYSIS, "from rankscope.render.stacks import render_stacks\n",
          "upward", "imports render.stacks (render)"),
    Plant("analysis imports validate", ANALYSIS, "from rankscope.validate import check_pid\n",
          "upward", "imports validate (facade)"),
    Plant("a relative import of a face", ANALYSIS, "from ..cli import main\n", "upward", "imports cli (face)"),
    Plant("a package-relative import", "analysis/memory/__init__.py", "from ... import api\n",
          "upward", "imports api (facade)"),
    Plant("a submodule imported from the package", ANALYSIS, "from rankscope import cli\n",
          "upward", "imports cli (face)"),
    Plant("import ... as", ANALYSIS, "import rankscope.commands.base as base\n",
          "upward", "imports commands.base (face)"),
    Plant("an import inside a function", ANALYSIS, "def _late() -> object:\n    from rankscope import api\n\n    return api\n",
          "upward", "imports api (facade)"),
    Plant("importlib.import_module", ANALYSIS,
          "import importlib\n\n\ndef _late() -> object:\n    return importlib.import_module('rankscope.cli')\n",
          "upward", "imports cli (face)"),
    Plant("a relative import_module", ANALYSIS,
          "from importlib import import_module\n\nX = import_module('..cli', package='rankscope.analysis')\n",
          "upward", "imports cli (face)"),
    Plant("an f-string import_module", ANALYSIS,
          "import importlib\n\n\ndef _late(n: str) -> object:\n    return importlib.import_module(f'rankscope.commands.{n}')\n",
          "upward", "imports commands (face)"),
    Plant("a lazy table", ANALYSIS, "EXPORTS = {'dump_stacks': 'rankscope.capabilities.stacks'}\n",
          "upward", "imports capabilities.stacks (shell)"),
    Plant("a shell imports the facade", SHELL, "from rankscope import api\n", "upward", "imports api (facade)"),
    Plant("a shell imports a renderer", SHELL, "from rankscope.render.stacks import render_stacks\n",
          "upward", "imports render.stacks (render)"),
    Plant("a face skips the facade", "mcp_tools/jobs.py", "from rankscope.capabilities.stacks import dump_stacks\n",
          "upward", "imports capabilities.stacks (shell)"),
    Plant("a face picks its own bound", "mcp_tools/jobs.py", "from rankscope.analysis.sizing.bound import bound_report\n",
          "upward", "imports analysis.sizing.bound (analysis)"),
    Plant("a command picks its own renderer", "commands/ps.py", "from rankscope.render.jobs import render_jobs\n",
          "upward", "imports render.jobs (render)"),
    Plant("open('/proc/...') in analysis", ANALYSIS,
          "def _status() -> str:\n    with open('/proc/1/status') as fh:\n        return fh.read()\n",
          "effect", "reads /proc ('/proc/1/status')"),
    Plant("a /proc path from procfs, opened in a shell", SHELL,
          "from rankscope.runtime import procfs\n\n\ndef _limits(pid: int) -> str:\n    return procfs.path(pid, 'limits').read_text()\n",
          "effect", "reads /proc (rankscope.runtime.procfs.path"),
    Plant("subprocess.Popen in a shell", SHELL,
          "import subprocess\n\n\ndef _start() -> object:\n    return subprocess.Popen(['true'])\n",
          "effect", "starts a process (subprocess.Popen)"),
    Plant("subprocess.run under another name", SHELL,
          "from subprocess import run as go\n\n\ndef _start() -> object:\n    return go(['true'], timeout=1)\n",
          "effect", "starts a process (subprocess.run)"),
    Plant("os.kill in a shell", SHELL, "import os\n\n\ndef _stop(pid: int) -> None:\n    os.kill(pid, 15)\n",
          "effect", "sends a signal (os.kill)"),
    Plant("a started process signalled in a shell", SHELL,
          "def _stop(proc: object) -> None:\n    proc.send_signal(15)  # type: ignore[attr-defined]\n",
          "effect", "sends a signal (.send_signal()"),
    Plant("socket.socket in a shell", SHELL, "import socket\n\n\ndef _open() -> object:\n    return socket.socket()\n",
          "effect", "opens a socket (socket.socket)"),
    Plant("urlopen in a face", "mcp_tools/jobs.py",
          "import urllib.request\n\n\ndef _get(url: str) -> object:\n    return urllib.request.urlopen(url, timeout=1)\n",
          "effect", "opens a socket (urllib.request.urlopen)"),
    Plant("an I/O module in the pure core", "render/stacks.py", "import shutil\n",
          "pure", "the render layer is pure, but this imports shutil"),
    Plant("a new top-level package", "newpkg/__init__.py", '"""Filed nowhere."""\n',
          "unclaimed", "no layer of the table claims this module"),
    Plant("a new top-level module", "newmod.py", '"""Filed nowhere."""\n',
          "unclaimed", "no layer of the table claims this module"),
    Plant("an import of a module no layer claims", ANALYSIS, "import rankscope.nowhere\n",
          "upward", "imports nowhere, which no layer claims"),
]  # fmt: skip


def _module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("plant", PLANTS, ids=[p.name for p in PLANTS])
def test_each_planted_violation_fails_the_check(plant: Plant, tmp_path: Path) -> None:
    root = tmp_path / "rankscope"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / plant.path
    before = target.read_text(encoding="utf-8").count("\n") if target.exists() else 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a", encoding="utf-8") as fh:
        fh.write("\n" + plant.code)
    found = check(root, TABLE)
    shown = [str(v) for v in found]
    module = _module_name(plant.path)
    assert found and all(v.module == module for v in found), shown
    assert any(v.rule == plant.rule and plant.says in v.detail and v.line > before for v in found), shown


def test_the_facades_lazy_exports_and_type_names_agree() -> None:
    """api.py and probe/__init__.py list each name twice (lazy map, TYPE_CHECKING block): keep them equal."""
    for rel in ("api.py", "probe/__init__.py"):
        tree = ast.parse((PKG / rel).read_text())
        exports: set[str] = set()
        typed: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.target.id == "EXPORTS" and isinstance(node.value, ast.Dict):
                    exports = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                typed = {
                    a.asname or a.name for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names
                }
        assert exports and exports == typed, rel


def test_no_function_is_over_80_lines() -> None:
    """Small pieces, each readable at once (docstrings count). The lines counted are the formatted
    ones: nothing in the package turns the formatter off (CI checks the rest is formatted)."""
    unformatted = [
        f"{name}:{i}"
        for name, path in modules(PKG).items()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"#\s*fmt:\s*(skip|off)", line)
    ]
    assert not unformatted, f"the formatter is turned off at {unformatted}: the 80-line count would not hold"
    long = []
    for name, path in modules(PKG).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long


def test_no_class_is_over_200_lines() -> None:
    """A class that holds one thing stays short; one that grows past this holds several (the log
    scanner did: torchrun's table, tracebacks, each rule's facts), and each should be its own."""
    long = []
    for name, path in modules(PKG).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > 200:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long
