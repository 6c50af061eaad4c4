"""The layer checker: ARCHITECTURE.md's layer table, applied to every module of a source tree.

The table lives once, in ARCHITECTURE.md (the fenced ``layers`` block), so the picture people
read and the rule the tests apply cannot drift apart. :func:`check` reads a package's sources
(never imports them, so a planted violation in a copy is checked as written) and returns every
place the rules are broken:

* ``unclaimed``: a module no layer of the table claims (a new top-level package must be placed
  on purpose, not filed silently as a shell);
* ``upward``: an import of a layer the module's layer may not import. Imports are read at any
  depth (inside functions, under ``TYPE_CHECKING``), relative ones resolved, and so are
  ``importlib.import_module``/``__import__`` with a constant name (or a constant prefix of an
  f-string) and the module paths of lazy tables (a string constant that names a module of the
  package, as ``api.EXPORTS`` does). A name only known at run time (``lazy.py``'s
  ``import_module(target)``) cannot be read; the table it is given is;
* ``effect``: code outside the runtime layer that starts a process, sends a signal, opens a
  socket or reads /proc (by a ``/proc`` path literal, or by a path ``procfs`` builds);
* ``pure``: a layer below runtime (the functional core) that imports an I/O module;
* ``table``: the table itself lets a layer import one above it (arrows only go down).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EFFECT_LAYER = "runtime"
"""The one layer that starts processes, sends signals, opens sockets and reads /proc; the layers
below it in the table are the functional core."""

PROCESS_CALLS = frozenset(
    {
        "subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
        "subprocess.check_output", "subprocess.getoutput", "subprocess.getstatusoutput",
        "os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
        "pty.fork", "pty.spawn", "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
        "multiprocessing.Process", "multiprocessing.Pool", "multiprocessing.get_context",
    }
)  # fmt: skip
PROCESS_PREFIXES = ("os.exec", "os.spawn")
SIGNAL_CALLS = frozenset(
    {"os.kill", "os.killpg", "signal.pthread_kill", "signal.raise_signal", "signal.pidfd_send_signal"}
)
SIGNAL_METHODS = frozenset({"kill", "terminate", "send_signal"})
"""Methods of a started process (``subprocess.Popen``) that signal it, matched by name."""
SOCKET_CALLS = frozenset(
    {
        "socket.socket", "socket.create_connection", "socket.create_server", "socket.socketpair",
        "socket.fromfd", "http.client.HTTPConnection", "http.client.HTTPSConnection",
        "urllib.request.urlopen", "urllib.request.build_opener", "asyncio.open_connection",
        "asyncio.open_unix_connection", "asyncio.start_server", "asyncio.start_unix_server",
        "torch._C._distributed_c10d.TCPStore", "torch.distributed.TCPStore",
    }
)  # fmt: skip
PROC_PATHS = frozenset({"runtime.procfs.path", "runtime.procfs.PROC"})
"""Names (under the package) that hand out a /proc path for the caller to open itself."""
PROSE_KEYWORDS = frozenset({"description", "help"})
"""Keyword arguments that hold text for people (a field's description may name /proc/PID/exe)."""
IO_MODULES = frozenset(
    {"subprocess", "socket", "shutil", "ctypes", "fcntl", "select", "http", "urllib", "multiprocessing", "pty"}
)  # fmt: skip
"""Modules the functional core never imports (``signal`` is allowed: signal names only)."""


@dataclass(frozen=True)
class Layer:
    """One row of the table: the modules it claims (dotted, under the package; ``__init__`` is the
    package itself) and the layers it may import besides its own."""

    name: str
    modules: tuple[str, ...]
    may_import: tuple[str, ...]


@dataclass(frozen=True)
class Violation:
    """One broken rule, at ``module``'s ``line``."""

    rule: str
    module: str
    line: int
    detail: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.rule}: {self.detail}"


_BLOCK = re.compile(r"^```layers\n(.*?)^```", re.MULTILINE | re.DOTALL)


def parse_table(markdown: str) -> list[Layer]:
    """The layers, top first, from the fenced ``layers`` block of ``markdown``.

    Each line: ``name  module module ...  ->  layer layer ...``; ``#`` starts a comment.
    """
    found = _BLOCK.search(markdown)
    if found is None:
        raise ValueError("no ```layers block")
    layers = []
    for raw in found.group(1).splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        left, arrow, right = line.partition("->")
        if not arrow:
            raise ValueError(f"layer line without '->': {raw!r}")
        name, *modules = left.split()
        layers.append(Layer(name, tuple(modules), tuple(right.split())))
    return layers


def table_problems(layers: list[Layer]) -> list[Violation]:
    """A table whose arrows do not all point down, or that names a layer or module twice."""
    out: list[Violation] = []
    names = [layer.name for layer in layers]
    claimed = [m for layer in layers for m in layer.modules]
    for dup in sorted(
        {n for n in names if names.count(n) > 1} | {m for m in claimed if claimed.count(m) > 1}
    ):
        out.append(Violation("table", dup, 0, "listed twice"))
    for i, layer in enumerate(layers):
        below = set(names[i + 1 :])
        for target in layer.may_import:
            if target not in below:
                out.append(Violation("table", layer.name, 0, f"may import {target}, which is not below it"))
    return out


def layer_of(module: str, layers: list[Layer]) -> Layer | None:
    """The layer that claims ``module`` (dotted, under the package; "" is the package): the
    longest claimed prefix wins."""
    best: tuple[int, Layer] | None = None
    for layer in layers:
        for claim in layer.modules:
            name = "" if claim == "__init__" else claim
            if module == name or (name and module.startswith(name + ".")):
                if best is None or len(name) > best[0]:
                    best = (len(name), layer)
    return best[1] if best else None


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name under it ("" for its __init__)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@dataclass(frozen=True)
class _Source:
    """One module being read: its name, whether it is a package, the package's modules."""

    pkg: str
    name: str
    is_package: bool
    known: frozenset[str]

    def resolve(self, dotted: str) -> str | None:
        """``pkg.a.b`` (or ``pkg``) to the module under the package it names ("" for the
        package); None for a name outside the package."""
        if dotted == self.pkg:
            return ""
        if not dotted.startswith(self.pkg + "."):
            return None
        return dotted[len(self.pkg) + 1 :]

    def relative(self, level: int, module: str | None) -> str | None:
        """The absolute dotted name of ``from <level dots><module> import``; None past the top."""
        here = self.name.split(".") if self.name else []
        base = here if self.is_package else here[:-1]
        if level - 1 > len(base):
            return None
        base = base[: len(base) - (level - 1)]
        return ".".join([self.pkg, *base, *([module] if module else [])])

    def nearest(self, module: str) -> str:
        """``module`` itself when it exists, else its nearest existing parent: ``from pkg.a import
        name`` imports ``pkg.a`` when ``name`` is an attribute, not a module."""
        probe = module
        while probe not in self.known and "." in probe:
            probe = probe.rpartition(".")[0]
        return probe if probe in self.known else module


def _aliases(nodes: list[ast.AST], src: _Source) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every import in the file."""
    out: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module if node.level == 0 else src.relative(node.level, node.module)
            for a in node.names:
                if base:
                    out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` with ``a`` replaced by what its import names; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = aliases.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def _skipped(nodes: list[ast.AST]) -> set[int]:
    """ids of the nodes the checks do not read: docstrings, annotations, prose keywords, logger names."""
    skip: set[int] = set()
    for node in nodes:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                skip.add(id(body[0].value))
        annotations: list[ast.expr | None] = []
        if isinstance(node, ast.arg):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, ast.keyword) and node.arg in PROSE_KEYWORDS:
            annotations.append(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
        ):
            annotations.extend(node.args)
        for sub in annotations:
            if sub is not None:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_IMPORT_FUNCS = frozenset({"importlib.import_module", "__import__", "builtins.__import__"})


def _const_prefix(node: ast.expr) -> str | None:
    """A constant string, or the package an f-string names before its first ``{}``
    (``f"pkg.tools.{name}"`` imports a module of ``pkg.tools``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str) and "." in head.value:
            return head.value.rpartition(".")[0]
    return None


def _dynamic(node: ast.Call, src: _Source) -> str | None:
    """The dotted name an ``importlib.import_module(...)``/``__import__(...)`` call imports, when
    its name is constant (relative names resolved against a constant ``package``)."""
    if not node.args:
        return None
    name = _const_prefix(node.args[0])
    if name is None or not name.startswith("."):
        return name
    package_arg = node.args[1] if len(node.args) > 1 else None
    package_arg = next((k.value for k in node.keywords if k.arg == "package"), package_arg)
    package = _const_prefix(package_arg) if package_arg is not None else None
    if package is None:
        return None
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")
    if level - 1 >= len(base):
        return None
    return ".".join([*base[: len(base) - (level - 1)], *([name[level:]] if name[level:] else [])])


def _imports(
    nodes: list[ast.AST], src: _Source, aliases: dict[str, str], skip: set[int]
) -> Iterator[tuple[str, int]]:
    """(module under the package, line) for everything the file imports from the package."""
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                target = src.resolve(a.name)
                if target is not None:
                    yield src.nearest(target), node.lineno
        elif isinstance(node, ast.ImportFrom):
            absolute = node.module if node.level == 0 else src.relative(node.level, node.module)
            base = src.resolve(absolute) if absolute else None
            if base is None:
                continue
            for a in node.names:
                candidate = f"{base}.{a.name}" if base else a.name
                yield (candidate if candidate in src.known else src.nearest(base)), node.lineno
        elif isinstance(node, ast.Call) and _dotted(node.func, aliases) in _IMPORT_FUNCS:
            dotted = _dynamic(node, src)
            target = src.resolve(dotted) if dotted else None
            if target is not None:
                yield src.nearest(target), node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # a lazy table's module path ("pkg.capabilities.stacks") is an import made later
            target = src.resolve(node.value) if _DOTTED_NAME.match(node.value) else None
            if target is not None and target in src.known:
                yield target, node.lineno


def _effect(dotted: str, src: _Source) -> str | None:
    """What a reference to ``dotted`` does that only the runtime layer may do; None for nothing."""
    if dotted in PROCESS_CALLS or dotted.startswith(PROCESS_PREFIXES):
        return f"starts a process ({dotted})"
    if dotted in SIGNAL_CALLS:
        return f"sends a signal ({dotted})"
    if dotted in SOCKET_CALLS:
        return f"opens a socket ({dotted})"
    inner = src.resolve(dotted)
    if inner in PROC_PATHS:
        return f"reads /proc ({dotted}: a /proc path opened here)"
    return None


def _effects(
    nodes: list[ast.AST], src: _Source, aliases: dict[str, str], skip: set[int]
) -> Iterator[tuple[int, str]]:
    """(line, what) for every process started, signal sent, socket opened or /proc path read."""
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node, aliases)
            what = _effect(dotted, src) if dotted else None
            if what:
                yield node.lineno, what
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SIGNAL_METHODS and _dotted(node.func, aliases) not in SIGNAL_CALLS:
                yield node.lineno, f"sends a signal (.{node.func.attr}() of a started process)"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value == "/proc" or node.value.startswith("/proc/"):
                yield node.lineno, f"reads /proc ({node.value!r})"


def _impure(nodes: list[ast.AST]) -> Iterator[tuple[int, str]]:
    """(line, module) for every I/O module the file imports."""
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in IO_MODULES:
                yield node.lineno, name


@dataclass(frozen=True)
class _Facts:
    """What one file imports from the package, the effects it has, the I/O modules it imports."""

    imports: tuple[tuple[str, int], ...]
    effects: tuple[tuple[int, str], ...]
    io: tuple[tuple[int, str], ...]


@functools.lru_cache(maxsize=4096)
def _facts(src: _Source, text: str) -> _Facts:
    """The facts of one file, read once per text: a planted copy shares all its files but one."""
    nodes = list(ast.walk(ast.parse(text, filename=src.name or "__init__")))
    aliases = _aliases(nodes, src)
    skip = _skipped(nodes)
    return _Facts(
        imports=tuple(sorted(set(_imports(nodes, src, aliases, skip)))),
        effects=tuple(sorted(set(_effects(nodes, src, aliases, skip)))),
        io=tuple(sorted(set(_impure(nodes)))),
    )


def _check_module(
    pkg: str, name: str, path: Path, own: Layer, layers: list[Layer], known: frozenset[str], pure: bool
) -> Iterator[Violation]:
    """Every rule one module breaks."""
    src = _Source(pkg, name, path.name == "__init__.py", known)
    shown = name or "__init__"
    facts = _facts(src, path.read_text(encoding="utf-8"))
    allowed = {own.name, *own.may_import}
    for target, line in facts.imports:
        dst = layer_of(target, layers)
        if dst is None:
            yield Violation("upward", shown, line, f"imports {target}, which no layer claims")
        elif dst.name not in allowed:
            yield Violation(
                "upward", shown, line,
                f"{own.name} imports {target or '__init__'} ({dst.name}); {own.name} may import "
                + (", ".join(own.may_import) or "nothing but itself"),
            )  # fmt: skip
    if own.name != EFFECT_LAYER:
        for line, what in facts.effects:
            yield Violation("effect", shown, line, f"{what}: only the {EFFECT_LAYER} layer may")
    if pure:
        for line, io in facts.io:
            yield Violation("pure", shown, line, f"the {own.name} layer is pure, but this imports {io}")


def check(root: Path, layers: list[Layer]) -> list[Violation]:
    """Every violation of the layer rules in the package at ``root`` (its directory), table first."""
    out = table_problems(layers)
    names = [layer.name for layer in layers]
    pure = set(names[names.index(EFFECT_LAYER) + 1 :]) if EFFECT_LAYER in names else set()
    mods = modules(root)
    known = frozenset(mods)
    for name, path in mods.items():
        own = layer_of(name, layers)
        if own is None:
            out.append(
                Violation("unclaimed", name or "__init__", 1, "no layer of the table claims this module")
            )
            continue
        out.extend(_check_module(root.name, name, path, own, layers, known, own.name in pure))
    return out
