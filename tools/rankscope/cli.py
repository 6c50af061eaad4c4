"""The ``rankscope`` command line: ``main(argv) -> int``.

Each subcommand lives in ``rankscope.commands.<module>`` as a ``Command``
subclass. The CLI only parses, calls the library through the command, and
turns ``RankscopeError`` into a message with its fix and its exit code.

Exit codes: one table, ``errors.EXIT_CODES``, printed under every --help: 0 answered; 1 the
answer is a failure (a crash, tensors that differ); 2 no answer: bad input or nothing to read
(every ``RankscopeError``); 3 hung; 130 interrupted. ``rankscope run`` passes on the job's own
exit code (see commands/run.py).

Start-up is part of every answer (``rankscope stacks`` is often a few py-spy
dumps of 10 ms each), so the CLI imports only the module of the subcommand it
runs: :data:`COMMANDS` maps command names to modules without importing
them, and the full parser (every module) is built only for ``--help``, a
missing or unknown command.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rankscope import __version__
from rankscope.errors import RankscopeError, exit_codes_text

if TYPE_CHECKING:  # argparse and the command base load only when a parser is built (not for `mcp`)
    import argparse

    from rankscope.commands.base import Command

COMMANDS: dict[str, str] = {
    "ps": "ps",
    "stacks": "stacks",
    "run": "run",
    "watch": "watch",
    "env": "env",
    "triage": "triage",
    "compare": "compare",
    "placements": "placements",
    "repro": "repro",
    "fr": "fr",
    "memory": "memory",
    "mcp": "mcp",
    "mcp-config": "mcp",
    "install-skill": "install",
    "skill": "skill",
}
"""The one command registry, in --help order: command name -> the module under
``rankscope.commands`` whose ``COMMANDS`` defines it, so one command loads one module
(tests/unit/test_cli_table.py checks every module's ``COMMANDS`` against it)."""

COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))
"""The modules of :data:`COMMANDS`, each once, in --help order (derived, never edited)."""

_GLOBAL_FLAGS = frozenset({"-v", "--verbose"})


def _load_commands(modules: Sequence[str] = COMMAND_MODULES) -> list[Command]:
    commands: list[Command] = []
    for mod_name in modules:
        mod = importlib.import_module(f"rankscope.commands.{mod_name}")
        for cls in getattr(mod, "COMMANDS", ()):
            commands.append(cls())
    return commands


def _formatter() -> type[argparse.HelpFormatter]:
    """argparse's formatter, which keeps the exit-code table's lines as they are written."""
    import argparse

    class Formatter(argparse.HelpFormatter):
        def _fill_text(self, text: str, width: int, indent: str) -> str:
            if text.startswith("exit codes:"):
                return "".join(indent + line for line in text.splitlines(keepends=True))
            return super()._fill_text(text, width, indent)

    return Formatter


def nearest(word: str, names: Sequence[str]) -> str | None:
    """The name closest to a mistyped ``word``, when one is close enough to be what was meant."""
    import difflib

    found = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def _parser_class() -> type[argparse.ArgumentParser]:
    """argparse's parser, which names the nearest choice of a mistyped one (a command, a subcommand,
    a choice of a flag): argparse lists the choices (before Python 3.14) but not the one meant."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def _check_value(self, action: argparse.Action, value: object) -> None:
            choices = action.choices
            if choices is not None and value not in choices and isinstance(value, str):
                near = nearest(value, [str(c) for c in choices])
                if near is not None:
                    listed = ", ".join(repr(str(c)) for c in choices)
                    raise argparse.ArgumentError(
                        action, f"invalid choice: {value!r}; did you mean {near!r}? (choose from {listed})"
                    )
            super()._check_value(action, value)

    return Parser


def _parser_of(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)parser the words reached: ``stacks --windw`` is a mistake of ``stacks``, whose usage
    and flags are the ones to show, not the top level's."""
    import argparse

    current = parser
    for word in words:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            current = subs[0].choices[word]
    return current


def _refuse_unknown(parser: argparse.ArgumentParser, words: Sequence[str], extra: Sequence[str]) -> None:
    """Exit 2 with the usage of the command the unknown arguments were given to, and the flag
    nearest to each mistyped one (``--windw`` -> ``--window``)."""
    command = _parser_of(parser, words)
    flags = [s for a in command._actions for s in a.option_strings if s.startswith("--")]
    near = [
        found
        for word in extra
        if word.startswith("-") and (found := nearest(word.split("=", 1)[0], flags)) is not None
    ]
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The parser and the command table: every command, or just ``only`` (a command name)."""
    formatter, epilog = _formatter(), exit_codes_text()
    parser = _parser_class()(
        prog="rankscope",
        description="Debug distributed PyTorch jobs from the outside: which rank, which line, what to do.",
        epilog=epilog,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    table: dict[str, Command] = {}
    modules = (COMMANDS[only],) if only is not None else COMMAND_MODULES
    for cmd in _load_commands(modules):
        if only is not None and cmd.name != only:
            continue
        p = sub.add_parser(
            cmd.name,
            help=cmd.help,
            description=cmd.description or cmd.help,
            epilog=epilog,
            formatter_class=formatter,
        )
        cmd.add_arguments(p)
        table[cmd.name] = cmd
    return parser, table


def _invoked_command(words: Sequence[str]) -> str | None:
    """The subcommand named on the command line, when the words are global flags then a known command."""
    for word in words:
        if word in _GLOBAL_FLAGS:
            continue
        return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = list(argv) if argv is not None else sys.argv[1:]
    if words == ["mcp"]:
        # Fast path for agent harnesses: start the server without building a
        # parser, so start-up stays lean and one broken command module
        # cannot take the MCP server down.
        from rankscope.mcp_server import serve

        return serve()
    parser, table = build_parser(_invoked_command(words))
    args, extra = parser.parse_known_args(words)
    if extra:
        _refuse_unknown(parser, words, extra)
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
