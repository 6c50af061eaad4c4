"""The Command base class and output helpers shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from pydantic import BaseModel

from rankscope import api


class Command:
    """A subcommand: declares its arguments and runs with parsed values.

    ``run`` unpacks the Namespace into plain arguments for the library call, so
    no argparse object ever reaches library code.
    """

    name: str = ""
    help: str = ""
    description: str | None = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # pragma: no cover - overridden
        pass

    def run(self, args: argparse.Namespace) -> int:  # pragma: no cover - overridden
        raise NotImplementedError


def add_json_flag(parser: argparse.ArgumentParser, *, brief: bool = True) -> None:
    """``--json`` and ``--full``, and ``--brief`` where the answer has a text form for an agent."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the answer as compact JSON, at most 8 KB like the MCP tool's (left_out names what was cut)",
    )
    if brief:
        parser.add_argument(
            "--brief",
            action="store_true",
            help="print the answer as an agent reads it over MCP: the verdict first, each fact once, at most 8 KB",
        )
    forms = "--json or --brief" if brief else "--json"
    parser.add_argument(
        "--full", action="store_true", help=f"with {forms}: the whole answer, past the 8 KB bound"
    )


def emit(
    model: BaseModel,
    as_json: bool,
    *,
    full: bool = False,
    brief: bool = False,
    out: TextIO | None = None,
    **bound_args: Any,
) -> None:
    """Print an answer, the only printing layer: as JSON, as the MCP text block, or in a person's lines.

    The answer leaves as the MCP server sends it: bounded by the façade (:func:`api.answer`, the
    registry's bound for its type, ``bound_args`` being the call's own arguments it reads) for
    ``--json`` and ``--brief`` unless ``full``, then redacted (:func:`redact_model`: whatever leaves
    by the CLI is redacted). JSON is the MCP tool's structured content (compact, bounded,
    ``left_out`` saying what was cut) unless ``full`` asks for the whole model; ``brief`` is the MCP
    tool's text block, the same answer in the fewest bytes, for an agent working through a shell; a
    person reads the registry's lines for the type (:func:`api.render_answer`), or the JSON where
    it has none.
    """
    out = out or sys.stdout
    if (as_json or brief) and not full:
        model = api.answer(model, **bound_args)
    model = api.redact_model(model)
    if brief:
        out.write(api.shape_answer(model, full=full)[0])
        out.write("\n")
        return
    lines = None if as_json else api.render_answer(model)
    if full and lines is None:
        out.write(model.model_dump_json(indent=2))
        out.write("\n")
        return
    if lines is None:
        out.write(json.dumps(api.shape_answer(model)[1], separators=(",", ":"), ensure_ascii=False))
        out.write("\n")
        return
    for line in lines:
        out.write(line)
        out.write("\n")


def print_json(data: object, out: TextIO | None = None) -> None:
    (out or sys.stdout).write(json.dumps(data, indent=2) + "\n")
