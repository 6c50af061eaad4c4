"""The ``rankscope`` command line: ``main(argv) -> int``.

Each subcommand lives in ``rankscope.commands.<module>`` as a ``Command``
subclass. The CLI only parses, calls the library through the command, and
turns ``RankscopeError`` into a message with its fix and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from rankscope import __version__
from rankscope.commands.base import Command
from rankscope.errors import RankscopeError

# module name -> Command classes it defines, in --help order.
COMMAND_MODULES: tuple[str, ...] = (
    "ps",
    "stacks",
    "run",
    "env",
    "triage",
    "compare",
    "placements",
    "repro",
    "fr",
    "memory",
    "mcp",
    "install",
)


def _load_commands() -> list[Command]:
    commands: list[Command] = []
    for mod_name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"rankscope.commands.{mod_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"rankscope.commands.{mod_name}":
                continue  # capability not built yet
            raise
        for cls in getattr(mod, "COMMANDS", ()):
            commands.append(cls())
    return commands


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = argparse.ArgumentParser(
        prog="rankscope",
        description="Debug distributed PyTorch jobs from the outside: which rank, which line, what to do.",
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    table: dict[str, Command] = {}
    for cmd in _load_commands():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description or cmd.help)
        cmd.add_arguments(p)
        table[cmd.name] = cmd
    return parser, table


def main(argv: Sequence[str] | None = None) -> int:
    words = list(argv) if argv is not None else sys.argv[1:]
    if words == ["mcp"]:
        # Fast path for agent harnesses: start the server without building the
        # whole parser, so start-up stays lean and one broken command module
        # cannot take the MCP server down.
        from rankscope.mcp_server import serve

        serve()
        return 0
    parser, table = build_parser()
    args = parser.parse_args(words)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="rankscope: %(message)s",
    )
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    cmd = table[args.command]
    try:
        return cmd.run(args)
    except RankscopeError as exc:
        sys.stderr.write(f"rankscope {args.command}: error: {exc.render()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("rankscope: interrupted\n")
        return 130
    except BrokenPipeError:
        return 1
