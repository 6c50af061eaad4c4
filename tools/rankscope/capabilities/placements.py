"""``rankscope placements PATH``: what is sharded and how, from files a job left behind.

Reads either a torch.distributed.checkpoint directory (its ``.metadata``: per
FQN the global size and every chunk's offsets, sizes and storage file) or the
placement reports ``rankscope.probe.dump(model, dir, kind="placements")``
wrote (one file or the directory of ``placements-rank<R>.json``). The
tiling/overlap checks are pure (``rankscope.analysis.placements``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rankscope.analysis.placements import tiling_problems
from rankscope.analysis.redact import redact_text
from rankscope.errors import InvalidInput, TorchMissing
from rankscope.models.placements import Chunk, FileBytes, PlacementReport, PlacementsReport, StoredTensor

_RANK_FILE = re.compile(r"placements-rank(\d+)\.json$")


def inspect_placements(path: str) -> PlacementsReport:
    """Describe the layout of a DCP checkpoint or of saved placement reports."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InvalidInput(
            f"{path} does not exist",
            fix="Pass a torch.distributed.checkpoint directory or a placements-rank<R>.json file/dir.",
        )
    if p.is_dir() and (p / ".metadata").is_file():
        return _from_dcp(p)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if _RANK_FILE.search(f.name))
    if not files:
        raise InvalidInput(
            f"{path} holds neither a DCP checkpoint (.metadata) nor placements-rank<R>.json files",
            fix="`rankscope placements DIR` with the checkpoint directory passed to torch.distributed.checkpoint.save, "
            "or the directory given to rankscope.probe.dump(model, dir, kind='placements').",
        )
    return _from_reports(p, files)


def _from_dcp(path: Path) -> PlacementsReport:
    try:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    except ImportError as exc:
        raise TorchMissing(f"reading a DCP checkpoint needs torch.distributed.checkpoint: {exc}") from exc
    try:
        md = FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # a truncated or foreign .metadata: report, don't crash
        raise InvalidInput(
            f"cannot read {path / '.metadata'}: {type(exc).__name__}: {redact_text(str(exc))[:300]}",
            fix="Check the checkpoint finished writing (rank 0 writes .metadata last) and was written by torch.distributed.checkpoint.",
        ) from exc
    where: dict[tuple[str, tuple[int, ...]], Any] = {}
    for idx, info in (md.storage_data or {}).items():
        where[(idx.fqn, tuple(int(o) for o in (idx.offset or ())))] = info
    tensors: list[StoredTensor] = []
    objects: list[str] = []
    problems: list[str] = []
    file_bytes: dict[str, int] = defaultdict(int)
    for fqn, meta in md.state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            objects.append(fqn)
            info = where.get((fqn, ()))
            if info is not None:
                file_bytes[info.relative_path] += int(info.length)
            continue
        shape = [int(s) for s in meta.size]
        chunks: list[Chunk] = []
        for c in meta.chunks:
            offsets = [int(o) for o in c.offsets]
            info = where.get((fqn, tuple(offsets)))
            if info is not None:
                file_bytes[info.relative_path] += int(info.length)
            chunks.append(
                Chunk(
                    offsets=offsets,
                    sizes=[int(s) for s in c.sizes],
                    file=info.relative_path if info is not None else None,
                    bytes=int(info.length) if info is not None else None,
                )
            )
        whole = len(chunks) == 1 and chunks[0].sizes == shape and not any(chunks[0].offsets)
        dtype = str(meta.properties.dtype).removeprefix("torch.") if meta.properties is not None else None
        tensors.append(
            StoredTensor(
                fqn=fqn,
                layout="whole" if whole else "sharded",
                global_shape=shape,
                dtype=dtype,
                chunks=chunks,
            )
        )
        problems += tiling_problems(fqn, shape, chunks)
        problems += [f"{fqn}: chunk at {c.offsets} has no storage entry" for c in chunks if c.file is None]
    for name in sorted(file_bytes):
        if not (path / name).is_file():
            problems.append(f"storage file {name} is referenced by .metadata but missing")
    report = PlacementsReport(
        path=str(path),
        source="dcp",
        tensors=tensors,
        objects=objects,
        files=[FileBytes(file=n, bytes=b) for n, b in sorted(file_bytes.items())],
        sharded=sum(t.layout == "sharded" for t in tensors),
        whole=sum(t.layout == "whole" for t in tensors),
        problems=problems,
    )
    report.summary = _summary(report)
    return report


def _from_reports(path: Path, files: list[Path]) -> PlacementsReport:
    problems: list[str] = []
    reports: dict[int, PlacementReport] = {}
    for f in files:
        try:
            rep = PlacementReport.model_validate(json.loads(f.read_text()))
        except (OSError, ValueError, ValidationError) as exc:
            problems.append(f"{f.name}: not a rankscope placement report ({type(exc).__name__})")
            continue
        reports[rep.rank] = rep
    if not reports:
        raise InvalidInput(
            f"no readable placement report under {path}",
            fix="Write them with rankscope.probe.dump(model, dir, kind='placements').",
        )
    jobs = sorted({r.job_id for r in reports.values() if r.job_id})
    worlds = sorted({r.world_size for r in reports.values()})
    if len(jobs) > 1:
        problems.append(f"placement reports come from {len(jobs)} different jobs ({', '.join(jobs)})")
    if len(worlds) > 1:
        problems.append(f"placement reports disagree on the world size ({worlds})")
    elif len(reports) < worlds[0] and len(files) > 1:
        problems.append(
            f"reports for {len(reports)} of {worlds[0]} ranks: missing {sorted(set(range(worlds[0])) - set(reports))}"
        )
    by_fqn: dict[str, StoredTensor] = {}
    for rank in sorted(reports):
        for t in reports[rank].tensors:
            st = by_fqn.get(t.fqn)
            if st is None:
                st = StoredTensor(
                    fqn=t.fqn,
                    layout="sharded" if t.layout == "sharded" else "whole",
                    global_shape=t.global_shape,
                    dtype=t.dtype,
                    placements=t.placements,
                )
                by_fqn[t.fqn] = st
            offsets = t.global_offset if t.global_offset is not None else [0] * len(t.local_shape)
            same = next((c for c in st.chunks if c.offsets == offsets and c.sizes == t.local_shape), None)
            if same is not None:
                same.ranks.append(rank)
            else:
                st.chunks.append(
                    Chunk(offsets=offsets, sizes=t.local_shape, bytes=t.local_bytes, ranks=[rank])
                )
    complete = len(reports) == worlds[-1]
    for st in by_fqn.values():
        if complete and st.layout == "sharded":
            problems += tiling_problems(st.fqn, st.global_shape, st.chunks, replicas_allowed=True)
    tensors = list(by_fqn.values())
    first = reports[min(reports)]
    report = PlacementsReport(
        path=str(path),
        source="placement_report",
        tensors=tensors,
        files=[
            FileBytes(file=f"placements-rank{r}.json", bytes=reports[r].coverage.est_param_bytes_per_rank)
            for r in sorted(reports)
        ],
        sharded=sum(t.layout == "sharded" for t in tensors),
        whole=sum(t.layout == "whole" for t in tensors),
        problems=problems,
        coverage=first.coverage,
    )
    report.summary = _summary(report)
    return report


def _summary(report: PlacementsReport) -> str:
    total = sum(f.bytes for f in report.files)
    what = "checkpoint" if report.source == "dcp" else "placement reports"
    text = (
        f"{what}: {report.sharded} sharded and {report.whole} whole tensors"
        + (f", {len(report.objects)} non-tensor entries" if report.objects else "")
        + f", {total} bytes over {len(report.files)} files"
    )
    if report.problems:
        text += f"; {len(report.problems)} problems, first: {report.problems[0]}"
    return text
