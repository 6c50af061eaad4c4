"""`rankscope repro`: list, render, pick from a diagnosis, and verify minimal repros."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.errors import InvalidInput
from rankscope.render.repro import _render_verify, render_list, render_repro_text

EXIT_NOT_REPRODUCED = 1
"""`--verify` exit status when the answer is not the expected one (not reproduced / not clean)."""


def parse_sets(items: list[str]) -> dict[str, str | int | float | bool]:
    """``--set key=value`` pairs; the template's parameter model converts and bounds the values."""
    out: dict[str, str | int | float | bool] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--set {item!r} is not key=value.", fix="Write it like --set world_size=4.")
        out[key.strip()] = value.strip()
    return out


def _add_verify_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc", type=int, default=None, metavar="N", help="ranks to run it on (default: its world_size)"
    )
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=15.0,
        metavar="S",
        help="seconds of silence that count as a hang (default 15)",
    )
    p.add_argument(
        "--timeout", type=float, default=120.0, metavar="S", help="limit for the whole run (default 120)"
    )


def _add_render_options(p: argparse.ArgumentParser, set_help: str) -> None:
    """Options shared by `render` and `from-report`: both render a template, optionally write and verify it."""
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    p.add_argument("--fixed", action="store_true", help="render the corrected code instead of the bug")
    p.add_argument("--out", metavar="PATH", help="write the script here (without it, print the script)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out when it exists (refused otherwise)"
    )
    p.add_argument("--verify", action="store_true", help="run it and check the symptom (needs --out)")
    _add_verify_options(p)
    add_json_flag(p)


class ReproCommand(Command):
    name = "repro"
    help = (
        "generate a minimal repro of a failure class (from a template or a diagnosis) and prove it reproduces"
    )
    description = (
        "Minimal repros from tested templates: `list` them, `render` one by name (--set key=value, --fixed for the "
        "corrected code), pick one `from-report` (a `rankscope stacks --json` or `rankscope triage --json` report), "
        "and `verify` that it shows its declared symptom under `rankscope run` (or, fixed, runs clean). "
        "A rendered script runs under `torchrun --nproc_per_node=N repro.py` and as `python repro.py`. "
        "Exit status: 0, 1 when --verify does not get the expected answer, 2 bad arguments."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="repro_command", metavar="ACTION")
        p_list = sub.add_parser("list", help="list the templates, their symptoms and parameters")
        add_json_flag(p_list)
        p_render = sub.add_parser("render", help="render a template by name")
        p_render.add_argument("template", metavar="NAME", help="template name (`rankscope repro list`)")
        _add_render_options(p_render, set_help="a parameter value (repeatable)")
        p_from = sub.add_parser(
            "from-report", help="pick and fill a template from a stacks/triage/run JSON report"
        )
        p_from.add_argument("report", metavar="REPORT.json")
        _add_render_options(p_from, set_help="override a parameter read from the report (repeatable)")
        p_verify = sub.add_parser("verify", help="run a rendered repro and check its declared symptom")
        p_verify.add_argument("path", metavar="PATH")
        _add_verify_options(p_verify)
        add_json_flag(p_verify)
        self._parser = parser

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        action = args.repro_command
        if action is None:
            self._parser.print_help(sys.stderr)
            return 2
        if action == "list":
            from rankscope.analysis.bound import brief_templates

            listed = api.list_templates()
            emit(
                listed if args.full or not (args.json or args.brief) else brief_templates(listed),
                args.json,
                render_list,
                full=args.full,
                brief=args.brief,
            )
            return 0
        if action == "verify":
            result = api.verify_repro(
                args.path, **_verify_kwargs(args.nproc, args.hang_timeout, args.timeout, None)
            )
            emit(result, args.json, _render_verify, full=args.full, brief=args.brief)
            return 0 if result.ok else EXIT_NOT_REPRODUCED
        if args.verify and not args.out:
            raise InvalidInput(
                "--verify needs --out: the script must exist on disk to run.", fix="Add --out repro.py."
            )
        if action == "render":
            rendered = api.render_repro(
                args.template, parse_sets(args.sets), fixed=args.fixed, out=args.out, overwrite=args.overwrite
            )
        else:
            rendered = api.repro_from_report(
                args.report,
                out=args.out,
                fixed=args.fixed,
                params=parse_sets(args.sets),
                overwrite=args.overwrite,
            )
        if args.verify and rendered.path:
            world = rendered.params.get("world_size")
            kwargs = _verify_kwargs(
                args.nproc, args.hang_timeout, args.timeout, world if isinstance(world, int) else None
            )
            rendered = rendered.model_copy(update={"verify": api.verify_repro(rendered.path, **kwargs)})
        if not args.out and not args.json:
            sys.stdout.write(rendered.script)
            for line in render_repro_text(rendered):
                sys.stderr.write(f"# {line}\n")
            return 0
        emit(rendered, args.json, render_repro_text, full=args.full, brief=args.brief)
        return 0 if rendered.verify is None or rendered.verify.ok else EXIT_NOT_REPRODUCED


def _verify_kwargs(
    nproc: int | None, hang_timeout: float, timeout: float, world: int | None
) -> dict[str, Any]:
    n = nproc if nproc is not None else world  # None: the world size the repro was rendered for
    if (n is not None and n < 1) or hang_timeout <= 0 or timeout <= 0:
        raise InvalidInput(
            f"--nproc, --hang-timeout and --timeout must be positive (got {n}, {hang_timeout}, {timeout}).",
            fix="For example: --nproc 2 --hang-timeout 15 --timeout 120.",
        )
    return {"nproc": n, "hang_timeout": hang_timeout, "timeout": timeout}


COMMANDS = [ReproCommand]
