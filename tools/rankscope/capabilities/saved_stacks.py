"""``rankscope stacks --from PATH``: the hang analysis on stacks saved to files.

Many incidents arrive after the job is gone: py-spy dumps a hang detector saved for every
rank, or a log with every rank's faulthandler traceback. This shell reads the files (a
folder holds one file per rank; a torchrun log holds all ranks under ``[rankN]:``), hands
their text to the pure parsers (:mod:`rankscope.analysis.hang.stack_files`) and the result to
the same analysis as a live capture. A file that cannot be read or parsed is reported on
its own and the rest is still analysed; nothing is guessed from a file that was not read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rankscope.analysis.hang import stack_files as sf
from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS
from rankscope.analysis.hang.stacks import analyze
from rankscope.analysis.startup import startup_verdict
from rankscope.capabilities.files import expand_paths
from rankscope.capabilities.stacks import source_lines
from rankscope.errors import InvalidInput
from rankscope.models.core import Backend, Job, RankError, RankProcess, RankStack, StacksReport, ThreadStack
from rankscope.runtime.pyspy import parse_dump

MAX_FILE_BYTES = 64 * 1024 * 1024
"""A stacks file or log larger than this is not read (a log that size is read with triage_logs)."""
MAX_FILES = 4096

_FIX_FORMAT = (
    "Pass py-spy dump output (text or --json), faulthandler output, or a torchrun log whose lines carry "
    "[rankN]: prefixes."
)
_FIX_RANK = (
    "Name the file after its rank (rank3.txt, stacks_rank_3.json) or keep torchrun's [rankN]: prefixes."
)


def _expand(paths: list[str]) -> list[Path]:
    files = expand_paths(
        paths, lambda child: not child.name.startswith("."), "Pass the saved stack files or their folder."
    )
    if not files:
        raise InvalidInput(
            f"no files under {', '.join(paths)}", "Pass the saved stack files or their folder."
        )
    if len(files) > MAX_FILES:
        raise InvalidInput(
            f"{len(files)} files under {', '.join(paths)}: more than {MAX_FILES}",
            "Pass the folder of one incident's stacks, not a whole log tree.",
        )
    return files


def _error(path: Path, kind: str, message: str, fix: str, rank: int | None = None) -> RankError:
    return RankError(rank=rank, kind=kind, message=f"{path}: {message}", fix=fix)


def _parse(text: str) -> list[tuple[int | None, list[ThreadStack]]]:
    kind = sf.sniff(text)
    if kind == "pyspy_json":
        return [(pid, parse_dump(raw, pid or 0)) for pid, raw in sf.pyspy_json(json.loads(text))]
    if kind == "pyspy_text":
        return sf.pyspy_text(text)
    if kind == "faulthandler":
        return [(None, sf.faulthandler(text))]
    raise ValueError("not py-spy output (text or JSON) nor a faulthandler traceback")


def _read_file(path: Path) -> tuple[list[tuple[int, int | None, list[ThreadStack]]], list[RankError]]:
    """(rank, pid, threads) for each rank the file holds, and what went wrong."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return [], [
                _error(path, "too_large", f"larger than {MAX_FILE_BYTES} bytes", "Cut it to the dumps.")
            ]
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return [], [_error(path, "unreadable_file", str(exc), "Check the path and its permissions.")]
    per_rank = sf.split_by_prefix(text)
    chunks = list(per_rank.items()) if per_rank else [(sf.rank_from_name(os.fspath(path)), text)]
    found: list[tuple[int, int | None, list[ThreadStack]]] = []
    errors: list[RankError] = []
    for rank, chunk in chunks:
        try:
            parsed = _parse(chunk)
        except ValueError as exc:
            if per_rank and sf.sniff(chunk) == "unknown":
                continue  # a rank that logged no stack: nothing to report for it
            errors.append(_error(path, "unknown_format", str(exc), _FIX_FORMAT, rank))
            continue
        if rank is None:
            errors.append(_error(path, "no_rank", "cannot tell which rank this file is for", _FIX_RANK))
            continue
        found.extend((rank, pid, threads) for pid, threads in parsed[:1])
    if per_rank and not found and not errors:
        errors.append(_error(path, "unknown_format", "no rank's lines hold a stack dump", _FIX_FORMAT))
    return found, errors


def stacks_from_files(paths: list[str], *, backend: Backend | None = None) -> StacksReport:
    """Analyse saved stacks into the same report and verdict as a live capture.

    ``backend``: ``nccl`` or ``gloo`` when known (the files rarely say; native frames do),
    None to infer it from the frames.
    """
    stacks: dict[int, RankStack] = {}
    errors: list[RankError] = []
    notes: list[str] = []
    for path in _expand(paths):
        found, errs = _read_file(path)
        errors.extend(errs)
        for rank, pid, threads in found:
            if rank in stacks:
                notes.append(f"two stacks for rank {rank}: kept the first, ignored the one in {path}")
                continue
            stacks[rank] = RankStack(rank=rank, pid=pid or 0, host="saved", state="unknown", threads=threads)
    ranks = sorted(stacks)
    gaps = sorted(set(range(ranks[-1] + 1)) - set(ranks)) if ranks else []
    if gaps:
        notes.append(f"no stack saved for ranks {gaps}: the world size is not known from the files")
    job = Job(
        job_id=f"saved:{os.path.commonpath([os.path.abspath(p) for p in paths])}",
        hosts=["saved"],
        ranks=[RankProcess(rank=r, pid=stacks[r].pid, host="saved") for r in ranks],
        notes=[f"stacks read from {len(ranks)} saved rank(s); the job is not inspected", *notes],
        backend=backend,
        backend_evidence=["given (--backend)"] if backend else [],
    )
    listed = [stacks[r] for r in ranks]
    report = analyze(job, listed, errors, source=source_lines(listed))
    if report.verdict.kind in PROGRESS_KINDS:
        return report
    started = startup_verdict(report.job, [], listed, remote=False)
    # every saved rank waits before its first collective: a start-up, whatever the hang rules
    # would make of ranks that stand in init_process_group and in their first collective's setup
    return report if started is None else report.model_copy(update={"verdict": started[0]})


__all__ = ["stacks_from_files"]
