"""The layering of ARCHITECTURE.md, checked on the import statements of every module.

Arrows only go down: faces (cli, commands, mcp_server, mcp_tools) -> the façade (api)
-> capability shells -> runtime (the only code that starts processes or reads /proc)
-> the pure core (analysis, models, errors, options, validate). A module that imports
upwards fails here, with the offending import named, before it can become a cycle or
a hidden dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rankscope

PKG = Path(rankscope.__file__).parent

PURE_TOP = {"errors", "options", "validate", "lazy", "__init__"}
"""Top-level modules of the pure core (besides the analysis/ and models/ packages)."""
RUNTIME = {"runtime", "resources"}
"""Infrastructure: runtime/ (/proc, process trees, bounded subprocesses, py-spy, redaction) and the
bundled files."""
FACES = {"cli", "__main__", "mcp", "mcp_server", "commands", "mcp_tools"}
FACADE = {"api"}


def layer(module: str) -> str:
    """The layer of ``rankscope.<module>`` (dotted, without the ``rankscope.`` prefix)."""
    top = module.split(".")[0]
    if top in ("analysis", "models", "render") or module in PURE_TOP:
        return "pure"
    if top in RUNTIME:
        return "runtime"
    if top in FACES:
        return "face"
    if top in FACADE:
        return "facade"
    return "shell"


ALLOWED: dict[str, set[str]] = {
    "pure": {"pure"},
    "runtime": {"pure", "runtime"},
    "shell": {"pure", "runtime", "shell"},
    "facade": {"pure", "runtime", "shell"},
    "face": {"pure", "facade", "face"},
}
"""What each layer may import. Faces reach everything through api: the capabilities, the
redaction every answer passes, the bundled skill files."""

KNOWN_EXCEPTIONS: set[tuple[str, str]] = {
    ("capabilities.install", "mcp_server"),  # mcp-config builds the server once to warm its schema cache
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        name = ".".join(rel.parts)
        found[name.removesuffix(".__init__") if name != "__init__" else "__init__"] = path
    return found


def _imports(path: Path) -> set[str]:
    """Every ``rankscope.*`` module a file imports, at any depth of the file (lazy imports count)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rankscope":
                out.update(a.name for a in node.names)
            elif node.module.startswith("rankscope."):
                out.add(node.module.removeprefix("rankscope."))
        elif isinstance(node, ast.Import):
            out.update(
                a.name.removeprefix("rankscope.") for a in node.names if a.name.startswith("rankscope.")
            )
    return out


def test_every_import_goes_down_a_layer() -> None:
    wrong = []
    for module, path in sorted(_modules().items()):
        src = layer(module)
        for target in sorted(_imports(path)):
            if target in ("__version__",):
                continue
            dst = layer(target)
            if dst not in ALLOWED[src] and (module, target) not in KNOWN_EXCEPTIONS:
                wrong.append(f"{module} ({src}) imports {target} ({dst})")
    assert wrong == []


def test_the_pure_core_imports_no_io_module() -> None:
    """analysis/ and models/ take data and return models: no /proc, no subprocess, no sockets."""
    io_modules = {"subprocess", "socket", "shutil", "ctypes", "fcntl", "select"}  # signal: names only
    wrong = []
    for module, path in sorted(_modules().items()):
        if layer(module) != "pure":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module.split(".")[0]]
            wrong.extend(f"{module} imports {n}" for n in names if n in io_modules)
    assert wrong == []


def test_the_layer_map_knows_every_module() -> None:
    """A new top-level package must be placed on purpose: every module lands in a known layer."""
    layers = {layer(m) for m in _modules()}
    assert layers == {"pure", "runtime", "shell", "facade", "face"}
    assert (
        layer("analysis.stacks") == "pure"
        and layer("stacks") == "shell"
        and layer("runtime.procfs") == "runtime"
    )


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
    """Small pieces, each readable at once (docstrings count)."""
    import ast

    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long
