"""`rankscope skill [REF] [--json]`: one section of the skill, the one an answer's skill_section names."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class SkillCommand(Command):
    name = "skill"
    help = "print one section of the skill (e.g. hangs#progress-counters); no argument: the index of sections"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "ref",
            nargs="?",
            default="",
            metavar="REF",
            help="a section as answers name it: hangs#progress-counters, skill/hangs.md#progress-counters; "
            "a playbook (hangs) for its sections; SKILL for SKILL.md",
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        emit(api.read_skill(args.ref), bool(args.json), full=args.full, brief=args.brief)
        return 0


COMMANDS = [SkillCommand]
