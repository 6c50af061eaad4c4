"""`rankscope compare DIR`: which tensors differ between the files each rank saved."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from rankscope.commands.base import Command, add_json_flag, emit, render_next_steps
from rankscope.models.probe import ConsistencyReport

MAX_LISTED = 20


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def render_consistency(report: ConsistencyReport) -> Iterator[str]:
    yield ("CONSISTENT: " if report.consistent else "INCONSISTENT: ") + report.summary
    for d in report.divergent[:MAX_LISTED]:
        tie = " (tie: no majority)" if d.tie else ""
        where = f" [{d.shard_key}]" if d.shard_key and d.shard_key != "replicated" else ""
        yield f"  {d.name}{where}: ranks {d.ranks} differ from {d.reference_ranks}{tie} ({d.reason})"
        for v in d.values:
            diff = f" max|diff|={_fmt(v.max_abs_diff)}" if v.max_abs_diff is not None else ""
            yield f"      rank {v.rank}: shape={v.shape} dtype={v.dtype} sum={_fmt(v.sum)} absmax={_fmt(v.abs_max)}{diff}"
    if len(report.divergent) > MAX_LISTED:
        yield f"  ... {len(report.divergent) - MAX_LISTED} more divergent tensors (--json lists all)"
    for n in report.nonfinite[:MAX_LISTED]:
        yield f"  NaN/Inf: {n.name} on rank {n.rank} (nan={n.nan}, inf={n.inf})"
    for k in report.missing_keys[:MAX_LISTED]:
        yield f"  only on ranks {k.present_on}: {k.name} (missing on {k.missing_on})"
    for name in report.partial[:MAX_LISTED]:
        yield f"  Partial (unreduced) DTensor: {name}"
    for p in report.problems:
        yield f"problem: {p}"
    yield from render_next_steps(report.next_steps)


class CompareCommand(Command):
    name = "compare"
    help = (
        "compare per-rank fingerprint files or torch.save'd state_dicts: which tensors differ on which ranks"
    )
    description = (
        "Compare the fingerprints-rank<R>.json files written by rankscope.probe.dump(model, DIR), or one "
        "torch.save'd state_dict per rank (rank in the file name, e.g. model_rank3.pt). Reports the tensors "
        "that differ from the majority, NaN/Inf per rank, keys present on some ranks only, and files that "
        "come from different jobs. Exit status: 0 consistent, 1 differences or problems found, 2 bad input."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", metavar="DIR", help="directory with one file per rank")
        parser.add_argument(
            "--atol", type=float, default=0.0, help="absolute tolerance on sum/abs-max (default: exact bytes)"
        )
        parser.add_argument(
            "--rtol", type=float, default=0.0, help="relative tolerance on sum/abs-max (default: exact bytes)"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.api import compare_dir

        report = compare_dir(str(args.dir), atol=float(args.atol), rtol=float(args.rtol))
        emit(report, bool(args.json), render_consistency)
        return 0 if report.consistent else 1


COMMANDS = [CompareCommand]
