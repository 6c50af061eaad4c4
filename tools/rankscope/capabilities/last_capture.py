"""The last stacks capture, kept so that a second look shows more of the same answer.

A bounded stacks answer leaves per-rank stacks out and names the call that brings them back
(``--last --show-rank N``, ``dump_stacks(last=true, full_ranks=[N])``). Capturing again would be
a different answer: the job moved, or one rank alone was captured and the suspect vanished. So
every live capture is kept here (redacted, mode 0600), and ``last`` re-reads it instead of
attaching again. A capture of only some ranks is kept as the last capture, and the last capture
of every rank stays apart, so a partial answer can still name the suspects the whole job had.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from rankscope.analysis.ranges import ranks_phrase
from rankscope.analysis.redact import redact_model
from rankscope.errors import NothingToRead
from rankscope.models.core import StacksReport

log = logging.getLogger(__name__)

LAST = "stacks-last.json"
"""The last capture, whole or partial: what ``--last`` (MCP ``last=true``) re-reads."""

LAST_WHOLE = "stacks-last-all-ranks.json"
"""The last capture of every rank of a job: the suspects a partial capture keeps in view."""


def cache_dir() -> Path:
    """``$RANKSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/rankscope``, else ``~/.cache/rankscope``."""
    explicit = os.environ.get("RANKSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rankscope"


def save_capture(report: StacksReport, *, partial: bool) -> None:
    """Keep ``report`` as the last capture (and, when every rank was captured, as the last whole
    one). A cache that cannot be written costs only the second look, never the answer."""
    text = redact_model(report).model_dump_json()
    for name in (LAST,) if partial else (LAST, LAST_WHOLE):
        try:
            _write(cache_dir() / name, text)
        except OSError as exc:
            log.warning("could not keep the capture in %s: %s", cache_dir(), exc)
            return


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".stacks-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(name: str) -> StacksReport | None:
    path = cache_dir() / name
    try:
        return StacksReport.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError):
        return None


def last_capture() -> StacksReport:
    """The last capture this user's rankscope made on this host, as it was answered."""
    report = _read(LAST)
    if report is None:
        raise NothingToRead(
            f"no earlier stacks capture to show again (none kept in {cache_dir() / LAST})",
            fix="Run `rankscope stacks` (MCP: dump_stacks) first; --last (last=true) then shows more of that capture.",
        )
    return report


def with_whole_suspects(report: StacksReport, ranks: list[int]) -> StacksReport:
    """A capture of ``ranks`` alone, saying so in its verdict, with the suspects the last capture of
    every rank of the same job named: a verdict on some ranks cannot see a rank that diverged
    outside them. Said first (``only_ranks``, the summary's opening), before what those ranks show:
    "the ranks agree" of one rank is no news about the job."""
    covered = f"this verdict covers only {ranks_phrase(ranks)} (captured alone)"
    whole = _read(LAST_WHOLE)
    if whole is not None and whole.job.job_id == report.job.job_id and whole.verdict.suspect_ranks:
        suspects = ", ".join(map(str, whole.verdict.suspect_ranks))
        covered += (
            f"; the last capture of every rank said {whole.verdict.kind}, suspects: rank(s) {suspects} "
            "(leave out --only-rank, MCP ranks, to capture them all again)"
        )
    else:
        covered += "; capture every rank (leave out --only-rank, MCP ranks) for the job's verdict"
    summary = f"{covered}. {ranks_phrase(ranks).capitalize()} alone: {report.verdict.summary}"
    verdict = report.verdict.model_copy(update={"summary": summary})
    return report.model_copy(update={"verdict": verdict, "only_ranks": sorted(set(ranks))})


__all__ = ["cache_dir", "last_capture", "save_capture", "with_whole_suspects"]
