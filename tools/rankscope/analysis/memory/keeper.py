"""What keeps a leak's tensors: the statements of the job's function that store what it computed.

A leak's place names the script line whose call made the kept blocks (``logits =
model(val_tokens)`` in ``evaluate``). What keeps them is in the same function, below that line:
an append to a list, an assignment to an attribute, a global or a dict item, a sum carried over
iterations, or a return value its caller keeps. Quoting those statements lets an agent fix the
line without opening the script. The shell reads the file (it sits beside the snapshots or on
this host); this module only reads the text it is given, with :mod:`ast`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_KEEPS = 3
MAX_QUOTE = 120
"""Statements quoted per leak: the first ones below the call that store its result."""
_STORE_CALLS = frozenset({"append", "extend", "insert", "add", "appendleft", "put", "setdefault", "update"})
_RELEASES = frozenset({"item", "tolist", "cpu", "numpy", "float", "int", "bool", "str", "len"})
"""Calls whose result holds no GPU memory: ``return loss.item()`` keeps nothing."""


@dataclass(frozen=True)
class Keep:
    """One statement that stores what the function computed."""

    line: int
    text: str
    how: str  # append, store, accumulate, return
    value: str  # the stored expression, as written (logits[:, -8:])


def _loaded(node: ast.AST | None) -> set[str]:
    """The plain names an expression reads."""
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _function(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function whose body holds ``line``."""
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (best is None or node.lineno >= best.lineno):
                best = node
    return best


def _statements(func: ast.AST) -> list[ast.stmt]:
    """The function's statements at any depth, in line order, without those of nested functions."""
    out: list[ast.stmt] = []
    todo: list[ast.AST] = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.stmt):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(out, key=lambda s: (s.lineno, s.col_offset))


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        return [stmt.target]
    return []


def _value(stmt: ast.stmt) -> ast.expr | None:
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)):
        return stmt.value
    return None


def _stored(targets: list[ast.expr]) -> set[str]:
    """The plain names a statement assigns (tuple targets unpacked)."""
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _kind(stmt: ast.stmt, outside: set[str]) -> tuple[str, ast.expr] | None:
    """How a statement keeps a value beyond one pass of the function, and the value, or None."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr in _STORE_CALLS and call.args:
            return None if _released(call.args[-1]) else ("append", call.args[-1])
        return None
    if isinstance(stmt, ast.Return) and stmt.value is not None and not _released(stmt.value):
        return "return", stmt.value
    value = _value(stmt)
    if value is None:
        return None
    if _released(value):
        return None
    if isinstance(stmt, ast.AugAssign):
        return "accumulate", value
    for t in _targets(stmt):
        if isinstance(t, (ast.Attribute, ast.Subscript)) or (isinstance(t, ast.Name) and t.id in outside):
            return "store", value
    return None


def _released(value: ast.expr) -> bool:
    """A value that is a number or a host copy: ``loss.item()``, ``float(loss)``, ``x.cpu()``."""
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in _RELEASES


def _outside(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names the function declares global or nonlocal: assigning them keeps the value."""
    return {n for node in ast.walk(func) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}


def keeping_statements(source: str, line: int) -> tuple[str | None, list[Keep]]:
    """The function around ``line`` of ``source`` and its statements that keep what ``line`` computed.

    What ``line`` computed: the names its statement assigns, and every name later assigned from
    them (``last = logits[:, -1]``). A statement keeps it when it appends one to a container,
    assigns one to an attribute, an item, a global, adds it to a running sum, or returns it.
    A statement that does that on ``line`` itself (``outs.append(model(x))``) counts too.
    (None, []) when the text does not parse or has no function there.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None, []
    func = _function(tree, line)
    if func is None:
        return None, []
    statements = _statements(func)
    at = [s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
    if not at:
        return func.name, []
    call = at[-1]
    tracked = _stored(_targets(call))
    outside = _outside(func)
    keeps: list[Keep] = []
    for stmt in statements:
        if stmt.lineno < call.lineno or isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            continue
        kind = _kind(stmt, outside)
        reads = _loaded(kind[1]) if kind else set()
        if kind is not None and (stmt is call or reads & tracked):
            text = (ast.get_source_segment(source, stmt) or "").splitlines()[0][:MAX_QUOTE]
            keeps.append(Keep(stmt.lineno, text, kind[0], ast.unparse(kind[1])))
        elif stmt is not call and _loaded(_value(stmt)) & tracked:
            tracked |= _stored(_targets(stmt))
    return func.name, keeps[:MAX_KEEPS]


_FRAME = re.compile(r"^(?P<file>.+):(?P<line>\d+) in (?P<func>.+)$")


def split_frame(text: str | None) -> tuple[str, int, str] | None:
    """(file, line, function) of a frame's text (``train.py:40 in evaluate``), None when it has none."""
    m = _FRAME.match(text or "")
    return (m.group("file"), int(m.group("line")), m.group("func")) if m else None


@dataclass(frozen=True)
class KeeperWords:
    """What a leak's answer says about the statements that keep it."""

    kept: str = ""  # appended to the message: "; kept by FILE:LINE `stmt`"
    fix: str | None = None  # the fix, naming the statement; None: the caller's generic fix
    quotes: list[str] = field(default_factory=list)  # FILE:LINE `stmt`, for the facts


def _line(sources: Mapping[str, str], file: str, line: int) -> str:
    lines = sources.get(file, "").splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _remedy(keep: Keep, func: str, graph: bool) -> str:
    """The change at the keeping statement: no graph kept, and no more GPU memory than needed."""
    if keep.how == "accumulate":
        return f"add `{keep.value}.item()` instead (a number, no graph)"
    copy = f"keep `{keep.value}.detach().cpu()` (.item() for a number)"
    if graph:
        return f"run {func} under torch.no_grad() and {copy}"
    return copy + ", or nothing"


def keeper_words(
    site: str, script: str | None, sources: Mapping[str, str], *, graph: bool, every: str
) -> KeeperWords:
    """The statements that keep a leak's tensors, quoted, and the fix that names the first one.

    Read in the script line's function (``script``, with its caller after `` <- ``; the site
    itself when the site is in the script's file); a value it returns is kept by the caller,
    whose line is quoted too.
    """
    script, _, caller = (script or "").partition(" <- ")
    where = split_frame(script) or split_frame(site)
    if where is None or where[0] not in sources:
        return KeeperWords()
    file, line, _ = where
    func, keeps = keeping_statements(sources[file], line)
    if func is None or not keeps:
        return KeeperWords()
    quotes = [f"{file}:{k.line} `{k.text}`" for k in keeps]
    first = keeps[0]
    called = split_frame(caller)
    if first.how == "return" and called is not None and _line(sources, called[0], called[1]):
        quotes.append(f"{called[0]}:{called[1]} `{_line(sources, called[0], called[1])}`")
    what = "each output with its graph" if graph else every
    return KeeperWords(
        kept="; kept by " + ", ".join(quotes),
        fix=f"{quotes[0]} in {func} keeps {what} (the call at line {line}): {_remedy(first, func, graph)}.",
        quotes=quotes,
    )
