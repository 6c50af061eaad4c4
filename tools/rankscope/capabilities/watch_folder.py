"""The watch folder on disk: written by `rankscope watch`, read by triage and the MCP tools.

Both sides go through these few functions, so the layout of :mod:`rankscope.models.watch` is
written and read in one place. Every write is redacted, owner-only (folders 0700, files 0600)
and atomic (a temporary file renamed over the old one), so a reader never sees half a manifest,
and a watcher killed mid-incident leaves an incident whose manifest says ``complete=false``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from rankscope.analysis.redact import redact_model, redact_text
from rankscope.errors import InvalidInput, NothingToRead
from rankscope.models.look import HostLook
from rankscope.models.watch import (
    INCIDENT_FILE,
    INCIDENTS_DIR,
    LOOK_PREFIX,
    WATCH_FILE,
    IncidentManifest,
    IncidentView,
    WatchManifest,
    WatchView,
)

M = TypeVar("M", bound=BaseModel)

DIR_MODE = 0o700
FILE_MODE = 0o600


def utc_now() -> str:
    """The time as the folder writes it: UTC ISO, seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def parse_utc(text: str) -> datetime:
    """A time the folder wrote, back as an aware datetime."""
    return datetime.fromisoformat(text)


def seconds_between(start: str, end: str) -> float:
    """Seconds from ``start`` to ``end`` (both as the folder writes times)."""
    return (parse_utc(end) - parse_utc(start)).total_seconds()


def make_dir(path: Path) -> Path:
    """A folder readable by its owner only (made if missing, its mode set if not)."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def write_text(path: Path, text: str) -> int:
    """``text`` redacted into ``path`` (0600, atomic); the bytes written."""
    data = redact_text(text).encode("utf-8")
    return write_bytes(path, data)


def write_bytes(path: Path, data: bytes) -> int:
    """``data`` into ``path`` as is (0600, atomic): the caller has redacted it. The bytes written."""
    make_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(data)


def write_model(path: Path, model: BaseModel) -> int:
    """A model, redacted as an answer is, as JSON into ``path`` (0600, atomic); the bytes written."""
    return write_bytes(path, redact_model(model).model_dump_json(indent=1).encode("utf-8"))


def read_model(path: Path, model: type[M]) -> M:
    """A model written by :func:`write_model`; a clear error if missing or not this model."""
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise NothingToRead(
            f"{path}: no such file", fix="Point at a folder a `rankscope watch --out DIR` wrote."
        ) from exc
    except (OSError, ValueError, ValidationError) as exc:
        raise InvalidInput(
            f"{path}: not a readable {model.__name__} ({str(exc).splitlines()[0]})",
            fix="Point at a folder a `rankscope watch --out DIR` wrote; a file cut short by a full disk cannot be read.",
        ) from exc


def write_watch(folder: Path, manifest: WatchManifest) -> None:
    """``DIR/watch.json``, rewritten whole on every change."""
    make_dir(folder)
    write_model(folder / WATCH_FILE, manifest)


def read_watch(folder: Path) -> WatchManifest:
    """``DIR/watch.json`` back; NothingToRead if ``folder`` is no watch folder."""
    if not (folder / WATCH_FILE).is_file():
        raise NothingToRead(
            f"{folder}: no {WATCH_FILE} here, so no watch wrote this folder",
            fix="Pass the folder given to `rankscope watch --out DIR` (it holds watch.json and incidents/).",
        )
    return read_model(folder / WATCH_FILE, WatchManifest)


def is_watch_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a watch manifest (what triage checks before reading it as one)."""
    return (folder / WATCH_FILE).is_file()


def incidents_dir(folder: Path) -> Path:
    return folder / INCIDENTS_DIR


def incident_name(number: int, when: str) -> str:
    """``001-20261128T030012Z``: numbered in order, then the suspected stall's UTC time."""
    stamp = parse_utc(when).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{number:03d}-{stamp}"


def new_incident(folder: Path, manifest: IncidentManifest) -> Path:
    """An incident folder with its manifest written first (``complete`` false)."""
    make_dir(folder)
    make_dir(incidents_dir(folder))
    path = make_dir(incidents_dir(folder) / manifest.name)
    write_incident(path, manifest)
    return path


def write_incident(path: Path, manifest: IncidentManifest) -> None:
    """An incident's manifest, rewritten after each piece and last with ``complete`` true."""
    write_model(path / INCIDENT_FILE, manifest)


def read_incident(path: Path) -> IncidentManifest:
    return read_model(path / INCIDENT_FILE, IncidentManifest)


def look_file(host: str) -> str:
    """The file name of one host's look (host names hold no path separators once cleaned)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"
    return f"{LOOK_PREFIX}{safe}.json"


def write_look(path: Path, look: HostLook) -> int:
    """One host's look into an incident folder; the bytes written."""
    return write_model(path / look_file(look.host), look)


def read_looks(path: Path) -> list[HostLook]:
    """Every host's look of an incident, in host order; a look cut short is skipped."""
    looks: list[HostLook] = []
    for file in sorted(path.glob(f"{LOOK_PREFIX}*.json")):
        try:
            looks.append(HostLook.model_validate_json(file.read_text(encoding="utf-8")))
        except (OSError, ValueError, ValidationError):
            continue
    return looks


def incident_paths(folder: Path) -> list[Path]:
    """The incident folders under ``folder``, oldest (lowest number) first."""
    root = incidents_dir(folder)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / INCIDENT_FILE).is_file())


def prune_incidents(folder: Path, keep: int) -> list[str]:
    """Remove the oldest incidents beyond ``keep``; the names removed."""
    paths = incident_paths(folder)
    gone = paths[: max(0, len(paths) - keep)]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in gone]


def folder_bytes(path: Path) -> int:
    """Bytes held by the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def read_view(folder: Path, *, alive: bool = False) -> WatchView:
    """The watch and each incident's manifest, read back (what MCP read_watch answers)."""
    watch = read_watch(folder)
    notes: list[str] = []
    incidents: list[IncidentView] = []
    for path in incident_paths(folder):
        try:
            manifest = read_incident(path)
        except InvalidInput as exc:
            notes.append(exc.message)
            continue
        looks = sorted(f.name for f in path.glob(f"{LOOK_PREFIX}*.json"))
        incidents.append(IncidentView(manifest=manifest, looks=looks))
    return WatchView(dir=str(folder), watch=watch, watcher_alive=alive, incidents=incidents, notes=notes)


__all__ = [
    "folder_bytes",
    "incident_name",
    "incident_paths",
    "is_watch_folder",
    "look_file",
    "make_dir",
    "new_incident",
    "parse_utc",
    "prune_incidents",
    "read_incident",
    "read_looks",
    "read_model",
    "read_view",
    "read_watch",
    "seconds_between",
    "utc_now",
    "write_bytes",
    "write_incident",
    "write_look",
    "write_model",
    "write_text",
    "write_watch",
]
