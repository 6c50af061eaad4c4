"""Shared pieces for the MCP adapters: error translation and annotations."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from rankscope.errors import RankscopeError

log = logging.getLogger("rankscope.mcp")

F = TypeVar("F", bound=Callable[..., Any])

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
"""Inspectors: they read /proc, ptrace briefly, read files; they change nothing."""

STARTS_PROCESSES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
"""Tools that launch processes (run_all_ranks, generate_repro with verify)."""


def guard(fn: F) -> F:
    """Turn RankscopeError (and bad arguments) into ToolError carrying the fix.

    In the SDK only ToolError text reaches the model; anything else is masked
    as "Error executing tool", which leaves an agent with nothing to act on.
    """

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except RankscopeError as exc:
                raise ToolError(exc.render().replace("\n", " ")) from exc
            except ToolError:
                raise
            except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
                raise ToolError(f"{exc}. Fix: check the arguments and paths you passed.") from exc

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RankscopeError as exc:
            raise ToolError(exc.render().replace("\n", " ")) from exc
        except ToolError:
            raise
        except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ToolError(f"{exc}. Fix: check the arguments and paths you passed.") from exc

    return wrapper  # type: ignore[return-value]
