"""``rankscope mcp``: the MCP server (stdio, no network port).

Tools are registered by the adapter modules in ``rankscope.mcp_tools``; each
exposes ``register(server)``. Logging goes to stderr only: stdout carries the
protocol.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import AsyncIterator
from io import TextIOWrapper
from typing import Any, cast

import anyio
import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, InputRequiredResult
from pydantic import ValidationError

from rankscope import __version__, api
from rankscope.mcp_tools._common import argument_error, save_schema_cache
from rankscope.models.install import McpConfig

# Adapter modules under rankscope.mcp_tools, registered in this order.
TOOL_MODULES: tuple[str, ...] = (
    "jobs",  # list_jobs, dump_stacks
    "run",  # run_all_ranks
    "watch",  # start_watch, list_watches, read_watch
    "env",  # collect_env
    "logs",  # triage_logs
    "consistency",  # check_tensor_consistency, inspect_placements
    "repro",  # generate_repro
    "flight",  # analyze_flight_recorder
    "memory",  # inspect_memory
    "skill",  # resources and prompts
)

INSTRUCTIONS = (
    "rankscope diagnoses distributed PyTorch jobs (DDP, FSDP, DTensor) that hang, crash, compute "
    "different results on different ranks, or run out of memory. For a hang call dump_stacks: with no "
    "arguments it finds the only job on this host (list_jobs when several run). Its answer leads with the "
    "verdict and ends with the next tool calls, arguments included. " + api.ANSWER_BOUND + " The skill "
    "(resource rankscope://skill/SKILL.md) holds the decision table; each skill_section an answer names is "
    "the resource rankscope://skill/<playbook>.md#<section>."
)


class RankscopeServer(MCPServer):
    """The SDK's server, with arguments of the wrong type answered in one line that names the
    parameter and what it takes (the SDK passes pydantic's multi-line report and its URL)."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._tool_manager.get_tool(name)
        props = tool.parameters.get("properties", {}) if tool is not None else {}
        unknown = sorted(set(arguments) - set(props))
        if tool is not None and unknown:
            raise ToolError(
                f"Invalid arguments for {name}: {', '.join(unknown)} is not a parameter of {name}. "
                f"Fix: use {', '.join(sorted(props))}."
            )
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            schema = tool.parameters if tool is not None else {}
            raise ToolError(argument_error(name, cause, schema)) from cause

    async def serve_lines(self, lines: CheckedLines) -> None:
        """Serve MCP on stdout, reading requests from ``lines`` (stdin, each line checked first)."""
        stdin = cast("anyio.AsyncFile[str]", lines)
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):
            low = self._lowlevel_server
            await low.run(read_stream, write_stream, low.create_initialization_options())


class CheckedLines:
    """stdin's lines, each checked as a JSON-RPC message before the server reads it.

    The SDK drops a line that is not one without a word and exits 0 at the end of the input, so a
    client that writes the wrong thing (a shell's ``echo``, a log line, a second protocol) learns
    nothing. Each such line is answered on stderr with the JSON-RPC error it is (-32700 parse
    error, -32600 invalid request) and counted, and ``rankscope mcp`` exits 2 when any was seen.
    """

    def __init__(self, lines: anyio.AsyncFile[str]) -> None:
        self._lines = lines
        self.bad = 0

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async for line in self._lines:
            if not line.strip():
                continue
            try:
                mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError as exc:
                self.bad += 1
                sys.stderr.write(json.dumps(rejection(line, exc)) + "\n")
                sys.stderr.flush()
                continue
            yield line


def rejection(line: str, exc: ValueError) -> dict[str, Any]:
    """The JSON-RPC error a line that is no message gets: what it was, and what to send instead."""
    try:
        json.loads(line)
    except ValueError:
        code, kind = -32700, "Parse error: the line is not JSON"
    else:
        code, kind = -32600, "Invalid request: JSON, but not a JSON-RPC 2.0 message"
    shown = line.strip()[:80]
    message = (
        f"{kind} ({shown!r}). rankscope mcp speaks MCP over stdio, one JSON-RPC message per line: "
        "register it with an MCP client (`rankscope mcp-config --client ...`); from a shell, use the CLI "
        "(`rankscope --help`)."
    )
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


def build_server() -> RankscopeServer:
    server = RankscopeServer(name="rankscope", version=__version__, instructions=INSTRUCTIONS)
    for name in TOOL_MODULES:
        importlib.import_module(f"rankscope.mcp_tools.{name}").register(server)
    save_schema_cache()  # output schemas derived on this start, for the next one
    return server


def prepare_server() -> str | None:
    """Build the server once, so that its output-schema cache exists before the first real start.

    Registration (``rankscope mcp-config``) is the step that always comes before a client's first
    ``rankscope mcp``; doing the one-off schema work then keeps that first start as fast as the
    later ones. It lives with the server, in the face, because building the server imports every
    tool adapter and through them the façade, which the registration itself
    (``capabilities/install.py``) sits below. Returns why it could not be prepared, or None.
    """
    try:
        build_server()
    except Exception as exc:  # the registration text is still right; the first start just pays more
        return f"{type(exc).__name__}: {exc}"
    return None


def with_server_prepared(cfg: McpConfig) -> McpConfig:
    """``cfg`` once the server was built here (:func:`prepare_server`), with a note when it could
    not be: a failure never stops the registration, whose text is still right."""
    problem = prepare_server()
    if problem is None:
        return cfg
    note = f"The server could not be prepared ahead of its first start ({problem}); run `rankscope mcp` once to see why."
    return cfg.model_copy(update={"notes": [*cfg.notes, note]})


def serve() -> int:
    """Serve until stdin ends: 0, or 2 when a line was no JSON-RPC message (each one logged)."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="rankscope-mcp: %(levelname)s %(message)s"
    )
    server = build_server()
    text = TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    lines = CheckedLines(anyio.wrap_file(text))
    anyio.run(server.serve_lines, lines)
    return 2 if lines.bad else 0
