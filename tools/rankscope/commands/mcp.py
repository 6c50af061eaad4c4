"""`rankscope mcp` (the stdio MCP server) and `rankscope mcp-config` (how to register it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import cast

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.models.install import McpClient

CLIENTS: tuple[str, ...] = ("claude-code", "claude-desktop", "cursor", "vscode")


class McpCommand(Command):
    name = "mcp"
    help = "run the MCP server on stdin/stdout (for Claude Code, Claude Desktop, Cursor, VS Code)"
    description = (
        "Serve rankscope's tools, the skill (as resources) and the diagnosis procedures (as prompts) over MCP "
        "on stdin/stdout. Logs go to stderr. Register it with `rankscope mcp-config --client ...`."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.mcp_server import serve

        return serve()


class McpConfigCommand(Command):
    name = "mcp-config"
    help = "print the exact MCP registration for a client"
    description = (
        "Print how to register `rankscope mcp` with an MCP client, with absolute paths to this rankscope: "
        "the `claude mcp add` command line, or the JSON snippet (VS Code: top-level key `servers`; "
        "Claude Desktop and Cursor: `mcpServers`)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--client", required=True, choices=CLIENTS, help="the MCP client to register with"
        )
        parser.add_argument(
            "--ssh",
            metavar="HOST",
            help="the client runs elsewhere (a laptop): start the server on HOST, the GPU host, over ssh",
        )
        parser.add_argument(
            "--remote-cmd",
            metavar="PATH",
            help="rankscope's path on the ssh host (default: `rankscope` on its PATH)",
        )
        add_json_flag(parser, brief=False)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        client = cast(McpClient, args.client)
        cfg = api.mcp_config(client, ssh=args.ssh, remote_cmd=args.remote_cmd)
        if args.ssh is None:  # the server starts on this host: build it now, so its first start is fast
            from rankscope.mcp_server import with_server_prepared

            cfg = with_server_prepared(cfg)
        if args.json:
            emit(cfg, True)
            return 0
        # only the snippet on stdout, so `rankscope mcp-config --client cursor > mcp.json` works;
        # the command line for Claude Code and the notes go to stderr
        snippet = json.dumps(cfg.snippet, indent=2)
        for line in api.render_answer(cfg) or ():
            if line != snippet:
                print(line, file=sys.stderr)
        print(snippet)
        return 0


COMMANDS = [McpCommand, McpConfigCommand]
