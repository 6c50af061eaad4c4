"""The Command base class and output helpers shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TextIO

from pydantic import BaseModel

if TYPE_CHECKING:
    from rankscope.models.core import NextStep


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


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the answer as JSON (the same model the MCP tool returns)"
    )


def emit(
    model: BaseModel,
    as_json: bool,
    render: Callable[[BaseModel], Iterable[str]] | None = None,
    out: TextIO | None = None,
) -> None:
    """Print a model as JSON or through a line renderer; the only printing layer."""
    out = out or sys.stdout
    if as_json or render is None:
        out.write(model.model_dump_json(indent=2))
        out.write("\n")
        return
    for line in render(model):
        out.write(line)
        out.write("\n")


def print_json(data: object, out: TextIO | None = None) -> None:
    (out or sys.stdout).write(json.dumps(data, indent=2) + "\n")


def render_next_steps(steps: Sequence[NextStep]) -> Iterator[str]:
    """The "Next:" block closing a human report: each action with the MCP tool and playbook section to use."""
    if not steps:
        return
    yield ""
    yield "Next:"
    for step in steps:
        extra = " ".join(
            x for x in (f"[tool {step.tool}]" if step.tool else "", step.skill_section or "") if x
        )
        yield f"  - {step.action} {extra}"
