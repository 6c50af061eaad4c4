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
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

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
"""Tools that launch processes (run_all_ranks, generate_repro with verify)."""


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


def guard(fn: F) -> F:
    """Turn RankscopeError (and bad arguments, permission and lookup errors) into ToolError with the fix."""

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except ToolError:
                raise
            except _TRANSLATED as exc:
                raise tool_error(exc) from exc

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
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
    the tool answers, when to call it, what to call next).
    """
    server.add_tool(
        fn,
        name=name or fn.__name__,
        title=title,
        description=inspect.getdoc(fn),
        annotations=annotations,
        structured_output=True,
    )
