"""``analyze_flight_recorder``: read per-rank flight-recorder dumps safely, then analyse them.

Dumps come from NCCL's watchdog (``TORCH_FR_DUMP_TEMP_FILE=<prefix>`` writes
``<prefix><rank>``), from ``torch._C._distributed_c10d._dump_fr_trace``
(``rankscope.probe.enable_flight_recorder``) or from the JSON variants. Pickle
is read with an Unpickler that refuses every class: the real dumps hold only
dicts, lists, tuples, strings and numbers, so a file that needs a class is not
a dump, and loading it must not run its code. torchfrtrace's own loader calls
``pickle.load`` unrestricted, which is why it is not used for reading.

torchfrtrace's ``Op.match`` (from the installed torch) is used, when torch is
importable, to add its own MatchState for the mismatching pair.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any, Literal

from rankscope.analysis.recorder.flight import LoadedDump, Matcher, analyze
from rankscope.capabilities.files import expand_paths
from rankscope.errors import InvalidInput
from rankscope.models.core import RankError, StacksReport
from rankscope.models.flight import FlightReport

MAX_DUMP_BYTES = 1 << 30
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$")
_SKIP = re.compile(r"(^\.|\.tmp\d*$|\.txt$|\.log$|\.md$)")


class _PlainUnpickler(pickle.Unpickler):
    """Loads only builtin containers and scalars; any class reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a flight-recorder dump holds no classes"
        )


def _rank_from_name(path: Path) -> int | None:
    m = _RANK_SUFFIX.search(path.name)
    return int(m.group(1)) if m else None


def _expand(paths: list[str]) -> list[Path]:
    return expand_paths(
        paths,
        lambda child: not _SKIP.search(child.name),
        "Pass the directory the dumps were written to (TORCH_FR_DUMP_TEMP_FILE's directory, or the "
        "dump_dir given to enable_flight_recorder), or the dump files themselves.",
    )


def _load(path: Path) -> tuple[Literal["pickle", "json"], dict[str, Any]]:
    size = path.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise ValueError(f"{size} bytes is larger than any flight-recorder dump ({MAX_DUMP_BYTES} bytes)")
    raw = path.read_bytes()
    if not raw:
        raise ValueError("empty file")
    fmt: Literal["pickle", "json"]
    if raw[:1] == b"\x80":
        fmt = "pickle"
        data = _PlainUnpickler(io.BytesIO(raw)).load()
    elif raw.lstrip()[:1] == b"{":
        fmt = "json"
        data = json.loads(raw)
    else:
        raise ValueError("neither a pickle nor a JSON flight-recorder dump")
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        raise ValueError("not a flight-recorder dump (no 'entries' list)")
    if "entries" not in data and "pg_config" not in data:
        raise ValueError("not a flight-recorder dump (no 'entries' or 'pg_config')")
    return fmt, data


def read_dumps(paths: list[str]) -> tuple[list[LoadedDump], list[RankError]]:
    """Read every dump it can; each unreadable file becomes a RankError, the rest still count."""
    dumps: list[LoadedDump] = []
    errors: list[RankError] = []
    files = _expand(paths)
    for path in files:
        rank = _rank_from_name(path)
        if rank is None:
            errors.append(
                RankError(
                    kind="bad_name",
                    message=f"{path}: cannot tell the rank from the file name",
                    fix="Name dumps <prefix><rank> as TORCH_FR_DUMP_TEMP_FILE does (e.g. fr_trace_rank_3).",
                )
            )
            continue
        try:
            fmt, data = _load(path)
        except (
            OSError,
            ValueError,
            EOFError,
            pickle.UnpicklingError,
            IndexError,
            TypeError,
            KeyError,
        ) as exc:
            errors.append(
                RankError(
                    rank=rank,
                    kind="corrupt_dump",
                    message=f"{path}: {exc}",
                    fix=(
                        "The file is truncated or not a flight-recorder dump (the rank may have died while writing "
                        "it); the other ranks are analysed without it. Dump again if the job is still alive."
                    ),
                )
            )
            continue
        dumps.append(LoadedDump(path=str(path), rank=rank, format=fmt, data=data))
    if not files:
        raise InvalidInput(
            f"no dump files under {', '.join(paths)}",
            "`rankscope fr DIR` with the folder TORCH_FR_DUMP_TEMP_FILE or enable_flight_recorder's dump_dir names; "
            "a rank writes its dump on timeout (NCCL, TORCH_NCCL_DUMP_ON_TIMEOUT=1) or on SIGUSR1 "
            "(enable_flight_recorder); a dead job's folder: `rankscope triage DIR`.",
        )
    return dumps, errors


def torchfrtrace_matcher() -> Matcher | None:
    """torchfrtrace's ``Op(...).match`` from the installed torch, or None when it is not there."""
    try:
        from torch.distributed.flight_recorder.components.types import Op
    except Exception:
        return None

    def match(a: dict[str, Any], b: dict[str, Any], ranks: list[int], pg_name: str) -> str | None:
        try:
            memberships = {pg_name: set(ranks)}
            info = Op(a, memberships, pg_name).match(Op(b, memberships, pg_name))
        except Exception:
            return None  # ops or layouts it does not know
        culprit = f": {info.culprit}" if info.culprit else ""
        return f"{info.state.name}{culprit}"

    return match


def _load_stacks(path: str) -> StacksReport:
    try:
        return StacksReport.model_validate_json(Path(path).read_text())
    except OSError as exc:
        raise InvalidInput(
            f"cannot read {path}: {exc}", "Pass a file written by `rankscope stacks --json > FILE`."
        ) from exc
    except ValueError as exc:
        raise InvalidInput(
            f"{path} is not a rankscope stacks report: {str(exc).splitlines()[0]}",
            "Pass a file written by `rankscope stacks --json > FILE`.",
        ) from exc


def analyze_flight_recorder(
    paths: list[str], *, stacks_report: str | None = None, use_torchfrtrace: bool = True
) -> FlightReport:
    """Read the dumps under ``paths`` (files or directories) and say where the ranks first disagree."""
    if not paths:
        raise InvalidInput("no dump paths given", "Pass a directory of dumps or the dump files.")
    stacks = _load_stacks(stacks_report) if stacks_report else None
    dumps, errors = read_dumps([os.fspath(p) for p in paths])
    matcher = torchfrtrace_matcher() if use_torchfrtrace else None
    return analyze(dumps, errors, stacks=stacks, matcher=matcher)
