"""``rankscope mcp``: the MCP server (stdio, no network port).

Tools are registered by the adapter modules in ``rankscope.mcp_tools``; each
exposes ``register(server)``. Logging goes to stderr only: stdout carries the
protocol.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, InputRequiredResult
from pydantic import ValidationError

from rankscope import __version__, api
from rankscope.mcp_tools._common import argument_error, save_schema_cache
from rankscope.models.install import McpConfig

# Adapter modules under rankscope.mcp_tools, registered in this order.
TOOL_MODULES: tuple[str, ...] = (
    "jobs",  # list_jobs, dump_stacks
    "run",  # run_all_ranks
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


def build_server() -> MCPServer:
    server: MCPServer = RankscopeServer(name="rankscope", version=__version__, instructions=INSTRUCTIONS)
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


def serve() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="rankscope-mcp: %(levelname)s %(message)s"
    )
    build_server().run("stdio")
