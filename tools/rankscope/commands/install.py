"""`rankscope install-skill`: put SKILL.md, its playbooks and repro templates where agents load skills."""

from __future__ import annotations

import argparse
from typing import Literal, cast

from rankscope.commands.base import Command, add_json_flag, emit


class InstallSkillCommand(Command):
    name = "install-skill"
    help = "install SKILL.md, skill/ and repro_templates/ for Claude Code and other Agent Skills harnesses"
    description = (
        "Copy the rankscope skill into .claude/skills/rankscope/ (default, --project), "
        "~/.claude/skills/rankscope/ (--user) or DIR. Re-running is safe: unchanged files are left alone and "
        "files rankscope installed are updated; if you edited an installed file, nothing is changed (exit 2, "
        "the message lists the files) until you move your edits elsewhere or pass --force to overwrite them."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            "--project",
            action="store_const",
            const="project",
            dest="target",
            help="./.claude/skills/rankscope (the default)",
        )
        where.add_argument(
            "--user", action="store_const", const="user", dest="target", help="~/.claude/skills/rankscope"
        )
        where.add_argument(
            "--dir",
            metavar="DIR",
            help="this folder (name it 'rankscope': harnesses match it to the skill name)",
        )
        parser.add_argument(
            "--force", action="store_true", help="overwrite files you edited in the installed copy"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.api import install_skill

        target = cast(Literal["project", "user"] | None, args.target)
        report = install_skill(target=target, dir=args.dir, force=bool(args.force))
        emit(report, bool(args.json), full=args.full, brief=args.brief)
        return 0


COMMANDS = [InstallSkillCommand]
