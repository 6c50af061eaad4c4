"""Shared pieces for the MCP adapters: error translation, annotations, progress.

Every adapter follows the same pattern (see ``rankscope.mcp_tools.jobs``):

* a module-level function per tool, decorated with :func:`guard`, whose
  parameters are plain JSON types and whose return annotation is the pydantic
  model the CLI's ``--json`` prints (so the SDK sends structured content and an
  output schema);
* blocking library calls run in a worker thread via :func:`in_thread`, so the
  server keeps answering pings and cancellations while py-spy works;
* long work reports progress through :func:`progress` (a no-op when the client
  did not ask for it);
* ``register(server)`` adds the tools with :func:`add_tool`, which fills in the
  name, title, annotations and structured output in one place.

Start-up is part of every agent session, and a third of rankscope's share of it is
pydantic generating the JSON output schemas of the tools' report models. They depend
only on the models and the installed pydantic/mcp, so :func:`add_tool` keeps them in a
small cache file (``$RANKSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/rankscope`` or
``~/.cache/rankscope``; ``RANKSCOPE_CACHE_DIR=`` empty turns it off), keyed by those
versions and the size and mtime of every model and adapter module, so an edited model
is never served with a stale schema. Any problem with the cache falls back to the SDK's
own schema generation.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from rankscope import api
from rankscope.errors import PermissionDenied, ProcessNotFound, RankscopeError, ToolTimeout

log = logging.getLogger("rankscope.mcp")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
"""Inspectors: they read /proc, ptrace briefly, read files; they change nothing."""

STARTS_PROCESSES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
"""Tools that launch processes (run_all_ranks)."""

WRITES_FILES = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
"""generate_repro: writes a script (replacing a file only with overwrite=true) and may run it."""


class _LastAnswers:
    """What this server answered last, for tools that continue from it (generate_repro after
    dump_stacks), so the agent does not pass a whole report back."""

    stacks: BaseModel | None = None


LAST_ANSWERS = _LastAnswers()


def arg(description: str) -> Any:
    """A parameter's description in the input schema: what a model needs to fill it in."""
    return Field(description=description)


Full = Annotated[
    bool,
    arg("Return the whole answer. Without it every answer is at most 8 KB and left_out names what was cut."),
]
"""Every tool takes ``full``: by default an answer is at most 8 KB and says what it left out."""


def tool_error(exc: BaseException) -> ToolError:
    """The ToolError an agent sees for ``exc``: one line, the problem and its fix.

    In SDK 2.3 only ToolError text reaches the model; anything else is masked
    as "Error executing tool", which leaves an agent with nothing to act on.
    """
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, RankscopeError):
        return ToolError(exc.render().replace("\n", " "))
    if isinstance(exc, PermissionError):
        return ToolError(f"Permission denied: {exc}. Fix: {PermissionDenied.default_fix}")
    if isinstance(exc, ProcessLookupError):
        return ToolError(f"No such process: {exc}. Fix: {ProcessNotFound.default_fix}")
    if isinstance(exc, TimeoutError):
        return ToolError(f"Timed out: {exc}. Fix: {ToolTimeout.default_fix}")
    return ToolError(f"{exc}. Fix: check the arguments and paths you passed.")


def argument_error(tool: str, exc: Any, schema: dict[str, Any]) -> str:
    """``exc`` (pydantic's ValidationError of a tool's arguments) as one line: each parameter,
    what was wrong with the value given, and what the parameter takes (its description)."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    problems: list[str] = []
    fixes: list[str] = []
    for err in exc.errors()[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p != "arguments"]
        param = loc[0] if loc else "?"
        given = repr(err.get("input"))[:40]
        msg = str(err.get("msg", "is not valid")).replace("Input should be", "should be")
        problems.append(f"{'.'.join(loc) or param} {msg[0].lower() + msg[1:]} (got {given})")
        prop = props.get(param, {})
        if prop.get("description") and param not in {f.split(":")[0] for f in fixes}:
            fixes.append(f"{param}: {prop['description']}")
        elif param not in props:
            fixes.append(f"{param} is not a parameter of {tool}; it takes {', '.join(sorted(props))}")
    fix = "; ".join(fixes) or "see the tool's input schema"
    return f"Invalid arguments for {tool}: {'; '.join(problems)}. Fix: {fix}"


_TRANSLATED: tuple[type[BaseException], ...] = (
    RankscopeError,
    PermissionError,
    ProcessLookupError,
    TimeoutError,
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
)


def _redacted(result: Any) -> Any:
    """Every answer leaves through here redacted (text block and structured content alike)."""
    return api.redact_model(result) if isinstance(result, BaseModel) else result


def shaped(fn: F) -> F:
    """What the server sends for ``fn``'s answer: a compact text block for the model and the
    structured content its output schema describes, both bounded unless the call passed
    ``full=true``. Applied at registration, so calling a tool function returns its model."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, BaseModel):
            return result
        text, data = api.shape_answer(result, full=bool(kwargs.get("full")))
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)

    return wrapper  # type: ignore[return-value]


def guard(fn: F) -> F:
    """Turn RankscopeError (and bad arguments, permission and lookup errors) into ToolError with the fix."""

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return _redacted(await fn(*args, **kwargs))
            except ToolError:
                raise
            except _TRANSLATED as exc:
                raise tool_error(exc) from exc

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return _redacted(fn(*args, **kwargs))
        except ToolError:
            raise
        except _TRANSLATED as exc:
            raise tool_error(exc) from exc

    return wrapper  # type: ignore[return-value]


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run a blocking library call in a worker thread (py-spy, /proc scans, subprocesses)."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def progress(ctx: Context[Any, Any] | None, done: float, total: float, message: str) -> None:
    """Report progress when the client asked for it; never fail the tool because of it."""
    if ctx is None:
        return
    try:
        await ctx.report_progress(done, total, message)
    except Exception as exc:  # progress is best effort: a closed stream must not lose the answer
        log.debug("progress notification failed: %s", exc)


SCHEMA_CACHE_FORMAT = 2


def _schema_cache_file() -> Path | None:
    configured = os.environ.get("RANKSCOPE_CACHE_DIR")
    if configured is not None:
        return Path(configured) / "mcp-output-schemas.json" if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rankscope" / "mcp-output-schemas.json"


@functools.lru_cache(maxsize=1)
def _schema_cache_key() -> str:
    """What the output schemas depend on: Python, pydantic, the SDK, rankscope's models and adapters."""
    import pydantic
    from mcp.server.mcpserver.utilities import func_metadata

    from rankscope import __version__

    parts = [str(SCHEMA_CACHE_FORMAT), sys.version, pydantic.VERSION, __version__]
    package = Path(__file__).resolve().parents[1]
    files = [Path(func_metadata.__file__ or ""), *sorted(package.glob("models/*.py"))]
    files += sorted(package.glob("mcp_tools/*.py"))
    for path in files:
        st = path.stat()
        parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class _SchemaCache:
    """Output schemas by tool name, loaded once per process, written back by :func:`save_schema_cache`."""

    def __init__(self) -> None:
        self.loaded = False
        self.tools: dict[str, dict[str, Any]] = {}
        self.dirty = False

    def load(self) -> dict[str, dict[str, Any]]:
        if not self.loaded:
            self.loaded = True
            path = _schema_cache_file()
            try:
                if path is not None and path.is_file():
                    data = json.loads(path.read_text(encoding="utf-8"))
                    if data.get("key") == _schema_cache_key() and isinstance(data.get("tools"), dict):
                        self.tools = data["tools"]
            except (OSError, ValueError) as exc:
                log.debug("ignoring the output schema cache: %s", exc)
        return self.tools


_CACHE = _SchemaCache()


def save_schema_cache() -> None:
    """Write the output schemas computed in this process, if any (best effort, atomic)."""
    path = _schema_cache_file()
    # Also write when nothing changed in this process but the file is missing (a new cache
    # location, or a server built again after the file was removed).
    if path is None or not _CACHE.tools or (not _CACHE.dirty and path.is_file()):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": _schema_cache_key(), "tools": _CACHE.tools}), encoding="utf-8")
        os.replace(tmp, path)
        _CACHE.dirty = False
    except OSError as exc:
        log.debug("cannot write the output schema cache %s: %s", path, exc)


def _return_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model ``fn`` returns, when its return annotation is one."""
    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable annotations: let the SDK report them
        return None
    return ret if isinstance(ret, type) and issubclass(ret, BaseModel) else None


def _registered(server: MCPServer, name: str) -> Any:
    """The SDK's Tool object for ``name`` (None if this SDK keeps its tools elsewhere)."""
    manager = getattr(server, "_tool_manager", None)
    get_tool = getattr(manager, "get_tool", None)
    return get_tool(name) if callable(get_tool) else None


def add_tool(
    server: MCPServer,
    fn: Callable[..., Any],
    *,
    title: str,
    annotations: ToolAnnotations,
    name: str | None = None,
) -> None:
    """Register ``fn`` (already wrapped with :func:`guard`) with structured output.

    The description is the function's docstring: write it for the agent (what
    the tool answers, when to call it, what to call next). The output schema comes
    from the cache when it is there (the SDK reads a tool's ``output_model`` and
    ``output_schema`` live, so setting them is the same as having it derive them).
    """
    tool_name = name or fn.__name__
    model = _return_model(fn)
    fn = shaped(fn)
    model_id = f"{model.__module__}.{model.__qualname__}" if model is not None else None
    cached = _CACHE.load().get(tool_name) if model is not None else None
    common: dict[str, Any] = {
        "name": tool_name,
        "title": title,
        "description": inspect.getdoc(fn),
        "annotations": annotations,
    }
    if cached is not None and cached.get("model") == model_id and isinstance(cached.get("schema"), dict):
        server.add_tool(fn, structured_output=False, **common)
        tool = _registered(server, tool_name)
        meta = getattr(tool, "fn_metadata", None)
        if meta is not None and hasattr(meta, "output_model") and hasattr(meta, "output_schema"):
            meta.output_model = model
            meta.output_schema = cached["schema"]
            meta.wrap_output = False
            _slim_inputs(tool)
            return
        server.remove_tool(tool_name)  # an SDK without these fields: derive the schema as usual
    server.add_tool(fn, structured_output=True, **common)
    tool = _registered(server, tool_name)
    _slim_inputs(tool)
    meta = getattr(tool, "fn_metadata", None)
    if (
        model is not None
        and meta is not None
        and getattr(meta, "output_model", None) is model
        and not getattr(meta, "wrap_output", True)
        and isinstance(getattr(meta, "output_schema", None), dict)
    ):
        meta.output_schema = slim_schema(meta.output_schema, keep_descriptions=False)
        _CACHE.tools[tool_name] = {"model": model_id, "schema": meta.output_schema}
        _CACHE.dirty = True


def _slim_inputs(tool: Any) -> None:
    """The input schema without pydantic's generated titles ("Pid" for pid): the descriptions say it."""
    if tool is not None and isinstance(getattr(tool, "parameters", None), dict):
        tool.parameters = slim_schema(tool.parameters, keep_descriptions=True)


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")


def slim_schema(schema: dict[str, Any], *, keep_descriptions: bool) -> dict[str, Any]:
    """A JSON schema that validates the same documents, without what only humans read.

    Every tool's output schema carries the definitions of its models; ``tools/list`` sends
    them all at every session start. Titles are generated from field names and say nothing;
    the field descriptions of an output schema are for people (a model reads the answer, and
    SKILL.md explains it), so they go too, except the top-level description of the answer; so do
    an output's defaults, which a validator never reads (an answer carries every field).
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" or (key in ("description", "default") and not keep_descriptions):
            continue
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _slim_sub(v, keep_descriptions) for k, v in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [_slim_sub(v, keep_descriptions) for v in value]
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = slim_schema(value, keep_descriptions=keep_descriptions)
        else:
            out[key] = value
    return _nullable(out)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``{"anyOf": [{"type": "integer"}, {"type": "null"}]}`` as ``{"type": ["integer", "null"]}``."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or not all(isinstance(o, dict) and set(o) == {"type"} for o in options):
        return schema
    types = [o["type"] for o in options]
    if not all(isinstance(t, str) for t in types):
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**rest, "type": types}


def _slim_sub(value: Any, keep_descriptions: bool) -> Any:
    return slim_schema(value, keep_descriptions=keep_descriptions) if isinstance(value, dict) else value
