"""`rankscope triage`: one verdict for a dead job from what it left, in any mix.

A folder is enough: each file is sorted by its first bytes into logs (and error.json), flight-recorder
dumps, saved stacks and CUDA memory snapshots; each kind goes to its own analysis (``analysis.triage.logs``,
``analysis.recorder.flight``, the saved-stacks shell, ``analysis.memory.diagnose``) and
``analysis.triage.postmortem`` decides which answer leads. Files are read in fixed-size
binary chunks; only lines that contain one of the rule engine's literal needles
are decoded and passed on, so memory stays bounded and gigabyte logs stream at
the speed of ``bytes.find``. Binary input is recognised and skipped with a
reason instead of producing garbage findings.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from rankscope.analysis.triage.logs import SHELL_NEEDLES, LogScanner, conclude
from rankscope.analysis.triage.postmortem import PostMortem, combine
from rankscope.analysis.triage.silent import call_lines, read_silent, silent_site, with_silent
from rankscope.capabilities.watch_folder import is_watch_folder
from rankscope.errors import InvalidInput, NothingToRead
from rankscope.models.core import Finding
from rankscope.models.logs import FailureRecord, LogSource, SilentRanks, SourceKind, TriageReport

if TYPE_CHECKING:
    from rankscope.models.core import StacksReport
    from rankscope.models.flight import FlightReport
from rankscope.analysis.redact import Redactor

CHUNK = 4 * 1024 * 1024
MAX_LINE = 1024 * 1024
"""A 'line' longer than this is cut: minified JSON blobs or binary data must not grow the buffer without bound."""
MAX_FED_LINE = 64 * 1024
"""Only this much of a matching line is decoded and matched: rules never need more, regexes stay linear."""
MAX_FILES = 5000
MAX_ERROR_JSON = 16 * 1024 * 1024
_SHORTER: tuple[str, ...] = (
    "rror",  # every *Error class name, "NCCL error in", "CUDA error:", "unhandled cuda error", "bus error", ...
    "atchdog",
    "NCCL work",
    "operation to complete",
    "by peer",
    "_STATUS_",
    "ddress already in use",
    "      :",
    "terminated with ",
    "out of memory",
    "mismatch between collectives",
    "most recent call",  # a Python traceback's header, and faulthandler's
)
"""Substrings of several needles each: one bytes.find pass instead of several (throughput is passes x size)."""


def prefilter_needles(needles: tuple[str, ...] = SHELL_NEEDLES) -> tuple[str, ...]:
    """The fewest literals such that every needle contains one of them (so no interesting line is skipped)."""
    chosen = [*_SHORTER, *(n for n in needles if not any(s in n for s in _SHORTER))]
    return tuple(n for n in chosen if not any(m != n and m in n for m in chosen))


PREFILTER: tuple[str, ...] = prefilter_needles()
_NEEDLE_BYTES = tuple(n.encode() for n in PREFILTER)
_RANK_IN_NAME = re.compile(r"rank[-_ ]?(\d+)", re.IGNORECASE)
_TORCHRUN_LAYOUT = re.compile(r"attempt_\d+/(\d+)/(?:stdout\.log|stderr\.log|error\.json)$")


def rank_hint(path: str) -> int | None:
    """The rank a file belongs to, from its name: rank3.log, x-rank-3.txt, torchrun's attempt_0/3/stdout.log."""
    norm = path.replace(os.sep, "/")
    m = _TORCHRUN_LAYOUT.search(norm)
    if m:
        return int(m.group(1))
    m = _RANK_IN_NAME.search(Path(norm).name)
    return int(m.group(1)) if m else None


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if b"\x00" in head:
        return True
    text_like = sum(1 for b in head if b in (9, 10, 13) or 32 <= b < 127 or b >= 128)
    return text_like / len(head) < 0.85


def _scan_body(body: bytes, line_base: int, scanner: LogScanner, source: str, hint: int | None) -> None:
    """Feed the lines of ``body`` (whole lines) that contain a needle, in order."""
    starts: set[int] = set()
    for needle in _NEEDLE_BYTES:
        i = body.find(needle)
        while i >= 0:
            ls = body.rfind(b"\n", 0, i) + 1
            starts.add(ls)
            le = body.find(b"\n", i)
            if le < 0:
                break
            i = body.find(needle, le)
    if not starts:
        return
    prev, line_no = 0, line_base
    for ls in sorted(starts):
        line_no += body.count(b"\n", prev, ls)
        prev = ls
        le = body.find(b"\n", ls)
        raw = body[ls : min(le if le >= 0 else len(body), ls + MAX_FED_LINE)]
        scanner.feed(raw.decode("utf-8", "replace").rstrip("\r"), line_no + 1, source, hint)


def _scan_stream(fh: BinaryIO, scanner: LogScanner, src: LogSource) -> None:
    rest = b""
    lines = 0
    first = True
    while True:
        chunk = fh.read(CHUNK)
        if not chunk:
            break
        src.bytes += len(chunk)
        if first:
            first = False
            # logrotate's copytruncate leaves a NUL-filled hole at the start of a live log: look past it
            if _looks_binary(chunk.lstrip(b"\x00")[:8192]):
                src.skipped = "binary data (not a text log); skipped"
                return
        buf = rest + chunk if rest else chunk
        cut = buf.rfind(b"\n")
        if cut < 0:
            rest = buf if len(buf) <= MAX_LINE else b""
            if not rest:
                _scan_body(buf[:MAX_LINE] + b"\n", lines, scanner, src.path, src.rank_hint)
                lines += 1
            continue
        body, rest = buf[: cut + 1], buf[cut + 1 :]
        _scan_body(body, lines, scanner, src.path, src.rank_hint)
        lines += body.count(b"\n")
    if rest:
        _scan_body(rest + b"\n", lines, scanner, src.path, src.rank_hint)
        lines += 1
    src.lines = lines


def _scan_error_json(path: Path, scanner: LogScanner, src: LogSource, redactor: Redactor) -> bool:
    """A torchelastic error file: {"message": {"message": ..., "extraInfo": {"py_callstack": ...}}} or {"message": str}."""
    try:
        if path.stat().st_size > MAX_ERROR_JSON:
            return False
        raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or "message" not in data:
        return False
    src.kind = "error_json"
    src.bytes = len(raw)
    msg = data["message"]
    text = ""
    stack = ""
    if isinstance(msg, dict):
        text = str(msg.get("message", ""))
        extra = msg.get("extraInfo") or {}
        if isinstance(extra, dict):
            stack = str(extra.get("py_callstack", ""))
    else:
        text = str(msg)
    n = 0
    for n, line in enumerate([*text.splitlines(), *stack.splitlines()], start=1):
        scanner.feed(line, n, src.path, src.rank_hint)
    src.lines = n
    scanner.add_failure(
        FailureRecord(
            rank=src.rank_hint,
            local_rank=src.rank_hint,
            error_file=src.path,
            message=redactor.text(text.strip().splitlines()[-1] if text.strip() else "")[:600],
        ),
        src.path,
    )
    return True


def _expand(paths: list[str]) -> Iterator[str]:
    """The files to read: those named, and every file under a named folder (hidden ones aside)."""
    count = 0
    for p in paths:
        if p == "-":
            yield p
            continue
        path = Path(p)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if name.startswith(".") or _SKIPPED_NAME.search(name):
                        continue
                    count += 1
                    if count > MAX_FILES:
                        raise InvalidInput(
                            f"{p} holds more than {MAX_FILES} files.",
                            fix="Pass the job's own log directory (or a few files), not a whole tree.",
                        )
                    yield str(Path(root, name))
        elif path.exists():
            yield p
        else:
            raise InvalidInput(
                f"{p}: no such file or directory.",
                fix="Pass existing log files or folders (`ls` the job's log folder first); or the log text itself "
                "(CLI: '-' reads stdin; MCP: text=...).",
            )


_SKIPPED_NAME = re.compile(
    r"\.(gz|zst|bz2|xz|zip|tar|so|pt|pth|safetensors|bin|npy|npz|png|jpg|py|pickle\.tmp\d*)$"
)
_PYSPY_TEXT = re.compile(rb"^Process \d+: ", re.MULTILINE)
_SNAPSHOT_HEAD = re.compile(
    rb"^\x80[\x02-\x05](?:\x95.{8})?}(?:\x94|q\x00)?\(?(?:X\x08\x00\x00\x00|\x8c\x08)segments", re.S
)


def kind_of(path: Path) -> SourceKind:
    """What a file a dead job left is, from its first bytes: a log, an error.json, a flight-recorder
    dump (pickle, or JSON with pg_config), py-spy output, or a saved rankscope answer."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8192)
    except OSError:
        return "file"  # the log reader says why it could not be read
    lead = head.lstrip()[:1]
    if head[:1] == b"\x80":  # a pickle: a recorder dump starts with its "version" key, a checkpoint does not
        if _SNAPSHOT_HEAD.search(head[:64]):  # _dump_snapshot's dict starts with its "segments" key
            return "memory_snapshot"
        return "flight_dump" if b"version" in head[:256] or b"pg_config" in head else "file"
    if lead == b"{":
        if b'"pg_config"' in head or (b'"entries"' in head and b'"version"' in head):
            return "flight_dump"
        if path.name == "error.json" or b'"message"' in head[:200]:
            return "error_json"
        return "answer"
    if lead == b"[" and path.suffix == ".json":
        return "saved_stacks"  # py-spy dump --json
    if _PYSPY_TEXT.match(head.lstrip()):
        return "saved_stacks"
    return "file"


def _read_logs(
    files: list[str], text: str | None, scanner: LogScanner, redactor: Redactor
) -> list[LogSource]:
    """Scan the logs, error files and stdin; every source read, with why it was skipped if it was."""
    sources: list[LogSource] = []
    if text is not None:
        src = LogSource(path="<text>", kind="text")
        _scan_stream(io.BytesIO(text.encode("utf-8", "replace")), scanner, src)
        sources.append(src)
    for p in files:
        if p == "-":
            src = LogSource(path="-", kind="stdin")
            _scan_stream(sys.stdin.buffer, scanner, src)
            sources.append(src)
            continue
        src = LogSource(path=p, kind="file", rank_hint=rank_hint(p))
        sources.append(src)
        if src.rank_hint is not None:
            scanner.seen_ranks.add(src.rank_hint)
        fp = Path(p)
        if not fp.is_file():
            src.skipped = "not a regular file"
            continue
        if fp.suffix == ".json" and _scan_error_json(fp, scanner, src, redactor):
            continue
        try:
            with open(fp, "rb") as fh:
                _scan_stream(fh, scanner, src)
        except OSError as exc:
            src.skipped = f"unreadable: {exc.strerror or exc}"
    return sources


def _read_flight(files: list[str], sources: list[LogSource]) -> FlightReport | None:
    """The recorder's own analysis of the dumps among the files (None when there are none)."""
    if not files:
        return None
    from rankscope.analysis.recorder.flight import analyze
    from rankscope.capabilities.recorder.flight import read_dumps

    dumps, errors = read_dumps(files)
    read = {d.path: d.rank for d in dumps}
    for p in files:
        src = LogSource(path=p, kind="flight_dump", rank_hint=read.get(p), bytes=_size(p))
        if p not in read:
            src.skipped = next((e.message for e in errors if e.message.startswith(p)), "not a readable dump")
        sources.append(src)
    return analyze(dumps, errors) if dumps else None


def _read_stacks(files: list[str], sources: list[LogSource]) -> StacksReport | None:
    """The hang analysis of saved stacks among the files (None when there are none or none parse)."""
    if not files:
        return None
    from rankscope.capabilities.saved_stacks import stacks_from_files

    logged = {s.path for s in sources if s.kind == "file"}
    # a log read as a log that holds no stack dump is no skipped file: saying so again costs bytes
    try:
        report = stacks_from_files(files)
    except InvalidInput as exc:
        sources.extend(
            LogSource(path=p, kind="saved_stacks", skipped=exc.message) for p in files if p not in logged
        )
        return None
    for p in files:
        err = next((e.message for e in report.errors if e.message.startswith(p)), None)
        if err is not None and p in logged:
            continue
        sources.append(
            LogSource(path=p, kind="saved_stacks", rank_hint=rank_hint(p), bytes=_size(p), skipped=err)
        )
    return report if report.job.ranks else None


def _read_memory(files: list[str], sources: list[LogSource]) -> Finding | None:
    """The memory finding of the CUDA snapshots among the files: which rank, which site, how much, the pattern.

    Each file is read with the snapshot reader that refuses any pickle that would run code; one that
    cannot be read is listed with why, and the others still count.
    """
    if not files:
        return None
    from rankscope.analysis.memory import diagnose, rank_from_filename
    from rankscope.capabilities.memory import job_sources, read_snapshots

    named = [(Path(p), _snapshot_rank(p, rank_from_filename(Path(p).name))) for p in files]
    summaries, errors = read_snapshots(named, raise_lone=False)
    for path, rank in named:  # the reader's errors name the file (the summaries hold it redacted)
        why = next((e.message for e in errors if str(path) in e.message), None)
        sources.append(
            LogSource(
                path=str(path), kind="memory_snapshot", rank_hint=rank, bytes=_size(str(path)), skipped=why
            )
        )
    return diagnose(summaries, job_sources(summaries, list(dict.fromkeys(p.parent for p, _ in named))))


_RANK_DIR = re.compile(r"attempt_\d+/(\d+)/[^/]+$")


def _snapshot_rank(path: str, from_name: int | None) -> int | None:
    """A snapshot's rank: from its name (snapshot-rank3.pickle), else torchrun's per-rank folder."""
    if from_name is not None:
        return from_name
    m = _RANK_DIR.search(path.replace(os.sep, "/"))
    return int(m.group(1)) if m else None


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def _sorted_files(paths: list[str]) -> dict[SourceKind, list[str]]:
    """The files under ``paths`` by what they are (stdin is a log)."""
    kinds: dict[SourceKind, list[str]] = {}
    for p in _expand(list(paths)):
        if p in paths and p.endswith(".py"):  # a script named beside the logs: read for its code, not scanned
            kinds.setdefault("source", []).append(p)
            continue
        kind: SourceKind = "file" if p == "-" else kind_of(Path(p))
        kinds.setdefault("file" if kind == "error_json" else kind, []).append(p)
    return kinds


def triage_logs(
    paths: list[str], *, text: str | None = None, max_findings: int = 50, read_code: bool = True
) -> TriageReport:
    """One verdict for a failed job from what it left (MCP ``triage_logs``, CLI ``rankscope triage``):
    logs, torchrun's log folder, error.json, flight-recorder dumps and saved stacks, in any mix.
    ``read_code``: read the code the tracebacks name, on this host or among the scripts given, for
    the calls a silent rank passes; False keeps to what the job left (a record that does not change
    with the host's files)."""
    if not paths and text is None:
        raise InvalidInput(
            "No logs given.",
            fix="Pass log files or folders of per-rank logs, or the log text itself (CLI: '-' reads stdin; MCP: text=...).",
        )
    if max_findings < 1:
        raise InvalidInput(
            f"max_findings must be at least 1, not {max_findings}.", fix="Pass a positive number."
        )
    watched = [p for p in paths if is_watch_folder(Path(p))]
    if watched:
        return _from_watch(watched, paths, max_findings)
    redactor = Redactor()
    scanner = LogScanner(redact=redactor.text)
    started = time.monotonic()
    files = _sorted_files(paths)
    if text is None and not any(files.values()):
        raise NothingToRead(
            f"nothing to read under {', '.join(paths)}: no log, error.json, recorder dump or saved stacks",
            fix="Point at the folder the job's output went to (`rankscope triage LOG_DIR`: torchrun --log-dir, "
            "the scheduler's output files), or pass the log text (CLI: '-' reads stdin; MCP: text=...).",
        )
    sources = _read_logs(files.get("file", []), text, scanner, redactor)
    sources.extend(LogSource(path=p, kind="answer", skipped=_ANSWER) for p in files.get("answer", []))
    sources.extend(LogSource(path=p, kind="source", bytes=_size(p)) for p in files.get("source", []))
    flight = _read_flight(files.get("flight_dump", []), sources)
    stack_files = [*files.get("saved_stacks", []), *sorted(scanner.stack_sources - {"-", "<text>"})]
    stacks = _read_stacks(stack_files, sources)
    memory = _read_memory(files.get("memory_snapshot", []), sources)
    findings = scanner.findings()
    failures = scanner.failures()
    conc = conclude(findings, failures, scanner.seen_ranks, scanner.world_size)
    post = combine(
        conc,
        findings,
        flight.verdict if flight else None,
        stacks.verdict if stacks else None,
        stacks.groups if stacks else None,
        memory,
    )
    silent = _silent(findings, post, files.get("source", []), scanner.collective_sites) if read_code else None
    if silent is not None and (silent.calls or silent.note):
        post = with_silent(post, silent)
    if memory is not None and post.decided_by == "memory_snapshots":
        _defer_to_memory(findings, memory)
        findings.insert(0, memory)
    elif memory is not None:
        findings.append(memory)
    report = _report(sources, findings, failures, scanner, post, flight, stacks, max_findings, started)
    if silent is None or not silent.calls:
        return report
    return report.model_copy(update={"blocking_calls": call_lines(silent)})


MAX_SOURCE = 2 * 1024 * 1024
"""A source file larger than this is not read for the silent rank's calls (generated code, not a script)."""


def _silent(
    findings: list[Finding], post: PostMortem, scripts: list[str], stacks: dict[int, str]
) -> SilentRanks | None:
    """The silent ranks' reading, when the logs lead and their tracebacks name the collective's line:
    the file as the traceback names it, or a script given by the same name (the job ran elsewhere)."""
    if post.decided_by not in (None, "logs"):
        return None
    site = silent_site(findings, post.suspect_ranks, stacks)
    if site is None:
        return None
    name = Path(site.file).name
    for path in [site.file, *(p for p in scripts if Path(p).name == name)]:
        try:
            fp = Path(path)
            if fp.is_file() and fp.stat().st_size <= MAX_SOURCE:
                return read_silent(site, fp.read_text(errors="replace"), site.file)
        except OSError:
            continue
    note = f"its code is not on this host: pass the script too (`rankscope triage LOGS {name}`)"
    return read_silent(site, None, site.file, note)


def _from_watch(watched: list[str], paths: list[str], max_findings: int) -> TriageReport:
    """A watch folder leads with its capture; the other paths given are the job's logs beside it."""
    from rankscope.capabilities.watch_triage import triage_watch

    if len(watched) > 1:
        raise InvalidInput(
            f"{len(watched)} watch folders given ({', '.join(watched)}): one job's watch at a time.",
            fix="Pass one watch folder, with the job's log folder beside it if you have it.",
        )
    others = [p for p in paths if p not in watched]
    return triage_watch(Path(watched[0]), others, triage_logs, max_findings=max_findings)


def _defer_to_memory(findings: list[Finding], memory: Finding) -> None:
    """An OOM line's generic advice (a smaller batch, expandable_segments) gives way to what the
    snapshots found: the fix of the log's finding points at the memory finding instead."""
    for f in findings:
        if f.kind == "cuda_oom" and (not f.ranks or not memory.ranks or set(f.ranks) & set(memory.ranks)):
            f.fix = f"The memory snapshots decide this OOM: see the {memory.kind} finding and its fix."


_ANSWER = "a JSON file that is not the job's own output (a saved rankscope answer?); not read"


def _report(
    sources: list[LogSource],
    findings: list[Finding],
    failures: list[FailureRecord],
    scanner: LogScanner,
    post: PostMortem,
    flight: FlightReport | None,
    stacks: StacksReport | None,
    max_findings: int,
    started: float,
) -> TriageReport:
    kinds: dict[str, int] = {}
    for f in findings:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    dropped = max(0, len(findings) - max_findings)
    elapsed = time.monotonic() - started
    total_bytes = sum(s.bytes for s in sources)
    summary = post.summary
    if not findings and flight is None and stacks is None and sources and all(s.skipped for s in sources):
        summary = "Nothing was analysed: " + "; ".join(f"{s.path}: {s.skipped}" for s in sources)
    seen = set(scanner.seen_ranks) | (set(flight.ranks) if flight else set())
    return TriageReport(
        sources=sources,
        findings=findings[:max_findings],
        kinds=kinds,
        suspect_ranks=post.suspect_ranks,
        victim_ranks=post.victim_ranks,
        seen_ranks=sorted(seen),
        failures=failures,
        summary=summary,
        decided_by=post.decided_by,
        playbook=post.playbook,
        evidence=post.evidence,
        flight=flight.verdict if flight else None,
        stacks=stacks.verdict if stacks else None,
        next_steps=post.next_steps,
        truncated=dropped > 0,
        dropped_findings=dropped,
        stats={
            "bytes": total_bytes,
            "lines": sum(s.lines for s in sources),
            "seconds": round(elapsed, 3),
            "mb_per_s": round(total_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None,
        },
    )
