"""`rankscope placements PATH`: what is sharded, how, and whether the pieces fit together."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.models.probe import PlacementsReport

MAX_LISTED = 40


def render_placements(report: PlacementsReport) -> Iterator[str]:
    yield report.summary
    for t in report.tensors[:MAX_LISTED]:
        how = ",".join(t.placements) if t.placements else f"{len(t.chunks)} chunks"
        yield f"  {t.layout:<8} {t.fqn} {t.global_shape} {t.dtype or ''} ({how})"
    if len(report.tensors) > MAX_LISTED:
        yield f"  ... {len(report.tensors) - MAX_LISTED} more tensors (--json lists all, with chunks)"
    for f in report.files:
        if report.source == "dcp":
            yield f"  file {f.file}: {f.bytes} bytes"
        else:
            yield f"  {f.file}: ~{f.bytes} bytes of parameters on that rank"
    if report.coverage is not None:
        c = report.coverage
        yield (
            f"coverage: {c.sharded_share:.0%} sharded, {c.replicated_share:.0%} replicated, {c.plain_share:.0%} plain; "
            f"per rank ~{c.est_param_bytes_per_rank} B params, {c.est_grad_bytes_per_rank} B grads, "
            f"{c.est_adam_state_bytes_per_rank} B Adam state"
        )
        for w in c.warnings:
            yield f"warning: {w}"
    for p in report.problems:
        yield f"problem: {p}"


class PlacementsCommand(Command):
    name = "placements"
    help = "show how a DCP checkpoint or saved placement reports shard each tensor; find gaps and overlaps"
    description = (
        "Read a torch.distributed.checkpoint directory (.metadata: global size, chunk offsets/sizes and storage "
        "file per tensor) or the placements-rank<R>.json files written by rankscope.probe.dump(model, DIR, "
        "kind='placements'). Reports sharded vs whole tensors, bytes per file, and chunks that overlap or leave gaps. "
        "Exit status: 0 no problems, 1 problems found, 2 bad input."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "path", metavar="PATH", help="DCP checkpoint directory, or placement report file/directory"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.api import inspect_placements

        report = inspect_placements(str(args.path))
        emit(report, bool(args.json), render_placements)
        return 1 if report.problems else 0


COMMANDS = [PlacementsCommand]
