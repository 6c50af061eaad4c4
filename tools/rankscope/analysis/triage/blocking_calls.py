"""The blocking calls a silent rank passes before the collective its peers timed out in.

A rank that left no traceback while the others timed out in a collective stopped somewhere on its
way to that collective. The others' tracebacks name the line; the code around it says where a rank
can stop without a word: a ``q.get()`` with no timeout, a lock, an event, a join, a child process,
a data iterator, ``input()``, a sleep. This reads the source of that one function (the
code before the collective, and the rest of the loop around it, which a rank passes before the
next pass's collective) and names each such call with what it waits on: for a queue, where it is
filled, and what the thread that fills it waits on itself. A call into a function of the same file
is followed once. These are candidates read from code, not a stack: the answer says so.
Pure: source text in, models out (the shell reads the file).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from rankscope.models.logs import BlockingCall

MAX_CALLS = 4
"""At most this many candidates, nearest the collective first (an answer names a few, not all)."""
MAX_CODE = 90
_LOCKISH = ("lock", "mutex", "cond", "sem")
_NOT_DATA = frozenset({"range", "enumerate", "zip", "sorted", "reversed", "list", "tuple", "dict", "set"})
_SUBPROCESS = frozenset({"run", "call", "check_call", "check_output"})


@dataclass(frozen=True)
class _Scope:
    """What a reading needs at hand: the module's tree and lines, and its functions by name."""

    tree: ast.Module
    lines: list[str]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]


def _text(node: ast.AST) -> str:
    return ast.unparse(node)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_CODE else text[: MAX_CODE - 3] + "..."


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, 0)


def _last(node: ast.expr) -> str:
    """``self.batches`` -> ``batches``: the name a receiver goes by anywhere in the module."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else _text(node)


def _no_wait_limit(call: ast.Call) -> bool:
    """A call without a ``timeout=`` and not told to return at once (``block=False``, ``blocking=False``)."""
    if _kw(call, "timeout") is not None or _is_false(_kw(call, "block")) or _is_false(_kw(call, "blocking")):
        return False
    return not (call.args and _is_false(call.args[0]))


def _method_wait(call: ast.Call, recv: ast.expr, method: str, in_loop: bool) -> str | None:
    """What a method call on ``recv`` waits for, when it is one that can wait forever."""
    r = f"`{_text(recv)}`"
    block_arg = not call.args or (
        len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and call.args[0].value is True
    )
    if method == "get" and block_arg and _no_wait_limit(call):
        return f"no timeout: waits for an item on {r}"
    if method == "acquire" and block_arg and _no_wait_limit(call):
        return f"no timeout: waits for {r}, held by another thread"
    if method == "wait" and not call.args and _no_wait_limit(call):
        return f"no timeout: waits until {r} is set or notified (or ends)"
    if method == "join" and not call.args and _no_wait_limit(call):
        return f"no timeout: the thread or process {r} to end"
    if method == "communicate" and _no_wait_limit(call):
        return f"no timeout: the child process {r} to end"
    if method == "result" and not call.args and _no_wait_limit(call):
        return f"no timeout: the result of {r}"
    if method in ("recv", "recv_bytes", "accept"):
        return f"a peer to send on {r}"
    if method in _SUBPROCESS and _text(recv) == "subprocess" and _kw(call, "timeout") is None:
        return "no timeout: the command to end"
    if method == "sleep" and _text(recv) == "time":
        return _sleeps(call, in_loop)
    return None


def _sleeps(call: ast.Call, in_loop: bool) -> str:
    return f"sleeps {_text(call.args[0]) if call.args else '?'} s" + (" on every pass" if in_loop else "")


def _reads(call: ast.Call) -> bool:
    """An ``open()`` for reading: no mode, or a literal mode without w, a, x or +."""
    mode = call.args[1] if len(call.args) > 1 else _kw(call, "mode")
    if mode is None:
        return True
    return (
        isinstance(mode, ast.Constant) and isinstance(mode.value, str) and not set(mode.value) & set("wax+")
    )


def _call_wait(call: ast.Call, in_loop: bool) -> str | None:
    """What ``call`` waits for, when it can wait without end; None for a call that cannot."""
    fn = call.func
    if isinstance(fn, ast.Attribute):
        return _method_wait(call, fn.value, fn.attr, in_loop)
    if not isinstance(fn, ast.Name):
        return None
    if fn.id == "input":
        return "a line on stdin"
    if fn.id == "open" and call.args and _reads(call):
        return f"opens `{_text(call.args[0])}` to read: blocks while it is a FIFO with no writer, or on a stalled file system"
    if fn.id == "next" and call.args:
        return f"the next item of `{_text(call.args[0])}` (a data iterator)"
    if fn.id in ("check_output", "check_call") and _kw(call, "timeout") is None:
        return "no timeout: the command to end"
    if fn.id == "sleep":
        return _sleeps(call, in_loop)
    return None


def _data_iter(loop: ast.For) -> ast.expr | None:
    """The iterable a ``for`` loop draws data from (``loader`` in ``for i, b in enumerate(loader)``),
    or None for counting loops (``range``, literals, ``.items()``)."""
    it: ast.expr = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "iter"):
        it = it.args[0] if it.args else it
    if isinstance(it, ast.Call):
        name = it.func.id if isinstance(it.func, ast.Name) else ""
        return None if name in _NOT_DATA or isinstance(it.func, ast.Attribute) else it
    return it if isinstance(it, (ast.Name, ast.Attribute)) else None


def _walk(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body``, nested functions and classes left out (they do not run here)."""
    todo: list[ast.AST] = list(reversed(body))
    while todo:
        node = todo.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)


def _enclosing(tree: ast.AST, line: int) -> tuple[ast.AST, list[ast.For | ast.While]]:
    """The innermost function holding ``line`` (the module if none) and the loops around it there."""
    func: ast.AST = tree
    loops: list[ast.For | ast.While] = []
    for node in ast.walk(tree):
        end = getattr(node, "end_lineno", None)
        if end is None or not node.lineno <= line <= end:  # type: ignore[attr-defined]
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno >= getattr(
            func, "lineno", 0
        ):
            func = node
    for node in _walk(list(getattr(func, "body", []))):
        if isinstance(node, (ast.For, ast.While)) and node.lineno <= line <= (node.end_lineno or 0):
            loops.append(node)
    return func, loops


def _lockish(item: ast.withitem) -> str | None:
    """What ``with lock:`` waits for, when its object is named like a lock (lock, mutex, cond, sem)."""
    expr = item.context_expr
    if isinstance(expr, (ast.Name, ast.Attribute)) and any(w in _last(expr).lower() for w in _LOCKISH):
        return f"waits for `{_text(expr)}`, held by another thread"
    return None


@dataclass(frozen=True)
class _Found:
    """One blocking call as found: its node, what it waits on, and the receiver's name for feeders."""

    line: int
    waits_on: str
    receiver: str | None
    method: str | None
    later_in_loop: bool = False


def _found_in(nodes: Iterator[ast.AST], in_loop: bool) -> Iterator[_Found]:
    """The blocking calls among ``nodes`` (each node once, in source order of the walk)."""
    for node in nodes:
        if isinstance(node, ast.Call):
            waits = _call_wait(node, in_loop)
            if waits is not None:
                fn = node.func
                recv = _last(fn.value) if isinstance(fn, ast.Attribute) else None
                method = fn.attr if isinstance(fn, ast.Attribute) else None
                yield _Found(node.lineno, waits, recv, method)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                held = _lockish(item)
                if held is not None:
                    yield _Found(node.lineno, held, _last(item.context_expr), "with")


def _calls_in(body: list[ast.stmt]) -> Iterator[ast.Call]:
    return (n for n in _walk(body) if isinstance(n, ast.Call))


def _callee(call: ast.Call, scope: _Scope) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """A function of the same file that ``call`` runs (``f(...)`` or ``self.f(...)``)."""
    fn = call.func
    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
    if isinstance(fn, ast.Attribute) and not (
        isinstance(fn.value, ast.Name) and fn.value.id in ("self", "cls")
    ):
        return None
    return scope.functions.get(name)


def _bound_names(func: ast.FunctionDef | ast.AsyncFunctionDef, args: list[ast.expr]) -> dict[str, str]:
    """``{"q": "batches"}``: the callee's parameters by the names the caller passed (positional)."""
    params = [a.arg for a in func.args.args if a.arg not in ("self", "cls")]
    return {
        p: _last(a) for p, a in zip(params, args, strict=False) if isinstance(a, (ast.Name, ast.Attribute))
    }


def _site(scope: _Scope, line: int) -> str:
    """The line as written, its comment left out."""
    text = scope.lines[line - 1] if 0 < line <= len(scope.lines) else ""
    return _short(text.split("  #", 1)[0].split(" # ", 1)[0])


def _where(scope: _Scope, line: int) -> str:
    """``read_shard:31``: a line by the function it is in."""
    func, _ = _enclosing(scope.tree, line)
    return (
        f"{func.name}:{line}" if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else f"line {line}"
    )


_FILLS: dict[str, tuple[str, ...]] = {
    "get": ("put", "put_nowait"),
    "wait": ("set", "notify", "notify_all"),
    "acquire": ("release",),
}
"""What another thread calls on the same object to end each wait."""
_SAYS = {"get": ("fill", "filled"), "wait": ("set", "set"), "acquire": ("release", "released")}
"""The verb and its participle for what ends each wait."""


def _method_calls(nodes: Iterator[ast.AST], name: str, methods: tuple[str, ...]) -> list[int]:
    return [
        n.lineno
        for n in nodes
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in methods
        and _last(n.func.value) == name
    ]


def _thread_of(scope: _Scope, name: str) -> tuple[int, ast.FunctionDef | ast.AsyncFunctionDef, str] | None:
    """The thread (or process) handed ``name``: where it starts, its target, and the target's own name for it."""
    for node in ast.walk(scope.tree):
        if not (isinstance(node, ast.Call) and _last(node.func) in ("Thread", "Process")):
            continue
        target, args = _kw(node, "target"), _kw(node, "args")
        func = scope.functions.get(_last(target)) if target is not None else None
        if func is None or not isinstance(args, (ast.Tuple, ast.List)):
            continue
        for p, a in _bound_names(func, list(args.elts)).items():
            if a == name:
                return node.lineno, func, p
    return None


def _ends(func: ast.FunctionDef | ast.AsyncFunctionDef, line: int) -> str:
    """`` in `for b in shard` (no more once `shard` ends)``: the finite loop a feeder fills from."""
    for node in _walk(func.body):
        if isinstance(node, ast.For) and node.lineno < line <= (node.end_lineno or 0):
            it = _data_iter(node)
            if it is not None:
                return f" in `for {_text(node.target)} in {_text(it)}` (no more once `{_text(it)}` ends)"
    return ""


def _feeders(scope: _Scope, name: str, method: str) -> str:
    """Who ends the wait on ``name``: the thread it is handed to and where that thread puts on it (sets
    it, releases it) and waits itself first; else the lines that do; or that nothing in the file does."""
    fills = _FILLS.get(method)
    if fills is None:
        return ""
    verb, done = _SAYS[method]
    thread = _thread_of(scope, name)
    if thread is not None:
        start, func, alias = thread
        lines = _method_calls(_walk(func.body), alias, fills)
        if not lines:
            return f", handed to thread {func.name} (started at :{start}), which never {verb}s it"
        said = f", {done} by thread {func.name} (started at :{start}) at :{lines[0]}{_ends(func, lines[0])}"
        first = next((f for f in _found_in(_walk(func.body), False) if f.line < lines[0]), None)
        return said + (f" after its own wait at :{first.line} `{_site(scope, first.line)}`" if first else "")
    lines = _method_calls(ast.walk(scope.tree), name, fills)
    if lines:
        return f", {done} at " + ", ".join(_where(scope, n) for n in lines[:2])
    return f", and nothing in this file is seen to {verb} it"


def _region(func: ast.AST, loops: list[ast.For | ast.While], line: int) -> Iterator[tuple[ast.AST, bool]]:
    """The nodes a rank passes before the collective at ``line`` (bool: later in the loop, i.e. passed
    on the way to the next pass's collective); the collective's own line left out."""
    for node in _walk(list(getattr(func, "body", []))):
        at = getattr(node, "lineno", None)
        if at is None or at == line:
            continue
        if at < line:
            yield node, False
        elif any(at <= (loop.end_lineno or 0) for loop in loops):
            yield node, True


def _scope(source: str) -> _Scope | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return _Scope(tree=tree, lines=source.splitlines(), functions=functions)


def _in_loop(line: int, loops: list[ast.For | ast.While]) -> bool:
    return any(loop.lineno <= line <= (loop.end_lineno or 0) for loop in loops)


def _found_before(
    scope: _Scope, func: ast.AST, loops: list[ast.For | ast.While], line: int
) -> Iterator[tuple[_Found, str | None]]:
    """Each blocking call on the way to ``line``, with the call of the same file it was reached through."""
    for node, later in _region(func, loops, line):
        in_loop = _in_loop(getattr(node, "lineno", 0), loops)
        for f in _found_in(iter([node]), in_loop):
            yield _Found(f.line, f.waits_on, f.receiver, f.method, later), None
        if not isinstance(node, ast.Call) or _call_wait(node, in_loop) is not None:
            continue
        callee = _callee(node, scope)
        if callee is None or callee is func:
            continue
        names = _bound_names(callee, list(node.args))
        via = f":{node.lineno} `{_site(scope, node.lineno)}`"
        for f in _found_in(_walk(callee.body), False):
            receiver = names.get(f.receiver or "", f.receiver)
            yield _Found(f.line, f.waits_on, receiver, f.method, later), via
    for loop in loops:
        it = _data_iter(loop) if isinstance(loop, ast.For) else None
        if it is not None:
            yield _Found(loop.lineno, f"the next item of `{_text(it)}` (a data iterator)", None, None), None


def blocking_calls(source: str, line: int) -> list[BlockingCall]:
    """The calls that can block for good which a rank passes on its way to the collective at
    ``line`` of ``source`` (one file's text), nearest first, at most ``MAX_CALLS``."""
    scope = _scope(source)
    if scope is None or not 0 < line <= len(scope.lines):
        return []
    func, loops = _enclosing(scope.tree, line)
    found: dict[tuple[int, str], BlockingCall] = {}
    for f, via in _found_before(scope, func, loops, line):
        key = (f.line, f.waits_on)
        if key in found:
            continue
        fed = _feeders(scope, f.receiver, f.method) if f.receiver and f.method else ""
        found[key] = BlockingCall(
            line=f.line,
            code=_site(scope, f.line),
            waits_on=f.waits_on + fed,
            via=via,
            later_in_loop=f.later_in_loop,
        )

    def distance(c: BlockingCall) -> int:
        at = int((c.via or "").split(" ", 1)[0].lstrip(":") or c.line)
        return (at - line) * 1000 if c.later_in_loop else line - at

    return sorted(sorted(found.values(), key=distance)[:MAX_CALLS], key=lambda c: (c.later_in_loop, c.line))


__all__ = ["MAX_CALLS", "blocking_calls"]
