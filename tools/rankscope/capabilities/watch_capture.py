"""One incident of a watch: what a live call would use, written piece by piece as it arrives.

The capture is the live call's own (:func:`rankscope.capabilities.stacks.capture`: the window, every
rank's stacks, the recorder asked where the job opened a channel, the source lines the frames need,
the counters and busy workers), kept as the ``HostLook`` a host of a multi-host call emits, so that
triage judges it later exactly as a live call would have judged it then. Then the environment, GPU
state and the tails of the job's output files. The manifest is written first (``complete`` false),
after each piece, and last with ``complete`` true: a watcher killed mid-incident leaves a folder that
says it is incomplete. Every piece is redacted; the incident's bytes are bounded.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from rankscope.capabilities import watch_folder as wf
from rankscope.capabilities.discovery import this_host
from rankscope.errors import RankscopeError
from rankscope.models.core import Job
from rankscope.models.look import HostLook
from rankscope.models.watch import IncidentManifest, IncidentPiece
from rankscope.options import DumpOptions
from rankscope.runtime import procfs, subproc

log = logging.getLogger("rankscope.capabilities.watch_capture")

LOG_TAIL_BYTES = 64 * 1024
"""Bytes of each output file's end kept in an incident."""

GPU_TIMEOUT = 10.0


def tail(file: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``file``, from a line start (empty when unreadable)."""
    try:
        with open(file, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read(limit)
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return text.partition("\n")[2] if size > limit else text


def log_name(file: str) -> str:
    """A flat, readable name for one output file's tail: its last three path parts."""
    parts = [p for p in Path(file).parts if p not in ("/", "")][-3:]
    return "_".join("".join(c if c.isalnum() or c in "-_." else "_" for c in p) for p in parts) or "output"


class Incident:
    """An incident folder being written: its manifest kept in step with the pieces on disk."""

    def __init__(self, folder: Path, manifest: IncidentManifest, max_bytes: int) -> None:
        self.manifest = manifest
        self.max_bytes = max_bytes
        self.path = wf.new_incident(folder, manifest)
        self.used = wf.folder_bytes(self.path)

    def save(self, **update: object) -> None:
        """The manifest with ``update``, rewritten."""
        self.manifest = self.manifest.model_copy(update=update)
        wf.write_incident(self.path, self.manifest)

    def piece(self, name: str, write: Callable[[int], tuple[str | None, int, str | None]]) -> bool:
        """Write one piece (``write`` gets the bytes left, returns file, bytes written, note), then
        the manifest. A piece that fails or finds no room is noted, never fatal."""
        left = self.max_bytes - self.used
        try:
            file, size, note = write(left) if left > 0 else (None, 0, "no room left (max bytes per incident)")
            ok = file is not None
        except (OSError, RankscopeError, ValueError) as exc:
            file, size, note, ok = None, 0, f"{type(exc).__name__}: {exc}"[:300], False
        self.used += size
        cut = note is not None and "room" in note
        entry = IncidentPiece(name=name, file=file, captured_at=wf.utc_now(), ok=ok, bytes=size, note=note)
        self.save(pieces=[*self.manifest.pieces, entry], truncated=self.manifest.truncated or cut)
        return ok


def write_look(incident: Incident, look: HostLook) -> None:
    def write(left: int) -> tuple[str | None, int, str | None]:
        size = wf.write_look(incident.path, look)
        note = "over the incident's byte budget, kept whole (the stacks come first)" if size > left else None
        return wf.look_file(look.host), size, note

    incident.piece("look", write)


def capture_look(job: Job, options: DumpOptions, exe: str) -> HostLook:
    """This host's capture of ``job``, as a live call takes it (stacks first)."""
    from rankscope.capabilities.stacks import capture  # the capture's shell loads only at a stall

    return capture(job, options, None, exe)


def write_env(incident: Incident, pid: int) -> None:
    from rankscope.capabilities.envinfo import collect_env

    def write(left: int) -> tuple[str | None, int, str | None]:
        report = collect_env(pid, include_torch=False)
        text = report.model_dump_json(indent=1)
        if len(text) > left:
            return None, 0, f"no room left for {len(text)} bytes"
        return "env.json", wf.write_model(incident.path / "env.json", report), None

    incident.piece("env", write)


def write_gpu(incident: Incident) -> None:
    """``nvidia-smi``'s view when the host has it; nothing (and no piece) otherwise."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return

    def write(left: int) -> tuple[str | None, int, str | None]:
        out = subproc.run([exe], GPU_TIMEOUT)
        if out.timed_out or out.rc != 0:
            return None, 0, f"nvidia-smi gave nothing (rc {out.rc}, timed out {out.timed_out})"
        return "gpu.txt", wf.write_text(incident.path / "gpu.txt", out.stdout[:left]), None

    incident.piece("gpu", write)


def write_logs(incident: Incident, files: list[str], name: str = "logs") -> None:
    """The tails of the job's output files under ``logs/`` (``name``: the piece, e.g. logs at the end)."""

    def write(left: int) -> tuple[str | None, int, str | None]:
        size, kept = 0, 0
        suffix = "" if name == "logs" else f".{name}"
        for file in files:
            text = tail(file)[: max(0, left - size)]
            if not text:
                continue
            size += wf.write_text(incident.path / "logs" / f"{log_name(file)}{suffix}.log", text)
            kept += 1
        note = None if kept == len(files) else f"{kept} of {len(files)} output file(s) kept"
        return ("logs" if kept else None), size, note if files else "no output file found"

    incident.piece(name, write)


def capture_pieces(incident: Incident, job: Job, options: DumpOptions, exe: str, files: list[str]) -> None:
    """Stacks first (what decides), then the environment, GPU state, the output's tails."""
    look = None
    try:
        with procfs.reading_once():
            look = capture_look(job, options, exe)
    except RankscopeError as exc:
        why = exc.render()[:300]
        incident.piece("look", lambda _left: (None, 0, why))
    if look is not None:
        write_look(incident, look)
    if job.ranks:
        write_env(incident, job.ranks[0].pid)
    write_gpu(incident)
    write_logs(incident, files)


def recorder_dumps(ranks: dict[int, dict[str, str]], since_epoch: float) -> list[str]:
    """The recorder dumps the watchdog wrote for these ranks (rank -> environment) since the attempt
    began (``TORCH_NCCL_DUMP_ON_TIMEOUT``, on by default under NCCL): read after the ranks are gone."""
    from rankscope.capabilities.recorder.pickup import START_SLACK_S, dump_path

    found: list[str] = []
    for rank, env in sorted(ranks.items()):
        path = dump_path(rank, env)
        try:
            if path.is_file() and path.stat().st_mtime >= since_epoch - START_SLACK_S:
                found.append(str(path))
        except OSError:
            continue
    return found


def write_recorder(incident: Incident, dumps: list[str]) -> None:
    """The recorder dumps, analysed (a FlightReport, redacted), under ``fr/``: what the watchdog
    dumped when it ended the stall the incident captured."""
    from rankscope.capabilities.recorder.flight import analyze_flight_recorder

    def write(left: int) -> tuple[str | None, int, str | None]:
        report = analyze_flight_recorder(dumps)
        text = report.model_dump_json()
        if len(text) > left:
            return None, 0, f"no room left for {len(text)} bytes"
        return "fr/flight.json", wf.write_model(incident.path / "fr" / "flight.json", report), None

    incident.piece("recorder_at_end", write)


def host_name() -> str:
    return this_host()


__all__ = [
    "Incident",
    "capture_look",
    "host_name",
    "log_name",
    "tail",
    "write_env",
    "write_gpu",
    "write_logs",
    "write_look",
]
