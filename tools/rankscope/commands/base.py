"""The Command base class and output helpers shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TextIO, TypeVar

from pydantic import BaseModel

from rankscope import api
from rankscope.render.next_steps import (
    render_next_steps as render_next_steps,  # one renderer for every command
)

if TYPE_CHECKING:
    pass


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
    parser.add_argument(
        "--full", action="store_true", help="with --json or --brief: the whole answer, past the 8 KB bound"
    )


M = TypeVar("M", bound=BaseModel)


def emit(
    model: M,
    as_json: bool,
    render: Callable[[M], Iterable[str]] | None = None,
    out: TextIO | None = None,
    full: bool = False,
    brief: bool = False,
) -> None:
    """Print a model as JSON or through a line renderer typed on that model; the only printing layer.

    Every answer passes :func:`redact_model` here: whatever leaves by the CLI is redacted. JSON is
    the MCP tool's structured content (compact, bounded, ``left_out`` saying what was cut) unless
    ``full`` asks for the whole model; ``brief`` is the MCP tool's text block, the same answer in
    the fewest bytes, for an agent working through a shell.
    """
    out = out or sys.stdout
    model = api.redact_model(model)
    if brief:
        out.write(api.shape_answer(model, full=full)[0])
        out.write("\n")
        return
    if full and (as_json or render is None):
        out.write(model.model_dump_json(indent=2))
        out.write("\n")
        return
    if as_json or render is None:
        out.write(json.dumps(api.shape_answer(model)[1], separators=(",", ":"), ensure_ascii=False))
        out.write("\n")
        return
    for line in render(model):
        out.write(line)
        out.write("\n")


def print_json(data: object, out: TextIO | None = None) -> None:
    (out or sys.stdout).write(json.dumps(data, indent=2) + "\n")
