"""`rankscope repro`: list, render, pick from a diagnosis, and verify minimal repros."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.errors import InvalidInput

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
            emit(api.list_templates(), args.json, full=args.full, brief=args.brief)
            return 0
        verify = action == "verify" or bool(args.verify)
        out = args.path if action == "verify" else args.out
        api.check_repro_call(
            verify=verify, out=out, nproc=args.nproc, hang_timeout=args.hang_timeout, timeout=args.timeout
        )
        if action == "verify":
            result = api.verify_repro(
                args.path, **_verify_kwargs(args.nproc, args.hang_timeout, args.timeout, None)
            )
            emit(result, args.json, full=args.full, brief=args.brief)
            return 0 if result.ok else EXIT_NOT_REPRODUCED
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
            for line in api.render_answer(rendered) or ():
                sys.stderr.write(f"# {line}\n")
            return 0
        emit(rendered, args.json, full=args.full, brief=args.brief)
        return 0 if rendered.verify is None or rendered.verify.ok else EXIT_NOT_REPRODUCED


def _verify_kwargs(
    nproc: int | None, hang_timeout: float, timeout: float, world: int | None
) -> dict[str, Any]:
    """The run's arguments (checked by ``api.check_repro_call``): ``nproc``, else the world size the
    repro was rendered for (None: the template's own)."""
    n = nproc if nproc is not None else world
    return {"nproc": n, "hang_timeout": hang_timeout, "timeout": timeout}


COMMANDS = [ReproCommand]
