"""The CLI loads only the module of the command it runs, and its static command table is complete."""

from __future__ import annotations

import importlib
import subprocess
import sys

from rankscope.cli import COMMAND_MODULES, COMMANDS, build_parser


def test_command_table_matches_every_modules_commands() -> None:
    defined = {
        cls.name: mod
        for mod in COMMAND_MODULES
        for cls in importlib.import_module(f"rankscope.commands.{mod}").COMMANDS
    }
    assert defined == COMMANDS
    _, table = build_parser()
    assert set(table) == set(COMMANDS)


def test_one_command_parser_knows_only_that_command() -> None:
    parser, table = build_parser("mcp-config")
    assert list(table) == ["mcp-config"]
    args = parser.parse_args(["-v", "mcp-config", "--client", "cursor"])
    assert args.command == "mcp-config" and args.verbose


def test_one_registry_one_spelling_per_command() -> None:
    from rankscope.cli import COMMAND_MODULES

    assert COMMAND_MODULES == tuple(dict.fromkeys(COMMANDS.values()))
    assert "memory-budget" not in COMMANDS  # `rankscope memory budget` is the one spelling


def test_running_a_command_imports_no_other_command_module() -> None:
    code = (
        "import sys\n"
        "from rankscope.cli import main\n"
        "try:\n"
        "    main(['-v', 'stacks', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('rankscope.commands.') and m != 'rankscope.commands.base'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['rankscope.commands.stacks']"
    assert "--via {ssh,srun,kubectl,debug-server}" in out.stdout


def test_help_and_unknown_commands_still_list_every_command() -> None:
    for argv in (["--help"], ["no-such-command"]):
        out = subprocess.run(
            [sys.executable, "-m", "rankscope", *argv], capture_output=True, text=True, timeout=60, cwd="/"
        )
        text = out.stdout + out.stderr
        for name in COMMANDS:
            assert name in text, (argv, name)
