"""The memory shell: read live ranks, snapshot files and placement reports.

``inspect_memory`` answers "what fills memory, on which rank": for a live job
it reads nvidia-smi (with a timeout) and /proc of every rank and its children;
for snapshot files it unpickles them with a loader that refuses every class
(snapshots are plain dicts, lists, ints and strings) and hands them to
``rankscope.analysis.memory``. ``memory_budget`` turns a placement report into
per-rank bytes for several sharding plans.

Snapshots are read with torch's own ``torch/cuda/_memory_viz.py`` helpers
(``_block_extra`` for old and new block layouts, ``_frame_filter`` for
unwinder noise) when torch is installed; that file needs only the standard
library, so it is loaded on its own without ``import torch``. Without torch,
the equivalent fallbacks in the analysis module are used (no TorchMissing): a
snapshot copied off a cluster can be read on any laptop.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import json
import logging
import os
import pickle
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rankscope.analysis import memory as am
from rankscope.analysis.memory.keeper import split_frame
from rankscope.analysis.redact import Redactor
from rankscope.capabilities.discovery import find_job
from rankscope.errors import InvalidInput, RankscopeError, SnapshotUnreadable
from rankscope.models.core import Job, NextStep, RankError, RankProcess
from rankscope.models.memory import BudgetInput, BudgetReport, MemoryReport, RankMemory, SnapshotSummary
from rankscope.models.placements import PlacementReport, PlacementsReport
from rankscope.options import check_pid
from rankscope.runtime import procfs, subproc
from rankscope.runtime.proctree import children_map, descendants

log = logging.getLogger("rankscope.capabilities.memory")

NVIDIA_SMI_TIMEOUT = 10.0
SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pk")
MAX_TOP = 200
"""The most allocation sites listed per snapshot: more would not fit any answer's bound."""

MAX_SNAPSHOTS = 256


# ----------------------------------------------------------------- snapshots


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles only builtin containers and scalars: any global (class, function) is refused.

    A pickle can run arbitrary code through ``find_class``/``REDUCE``; a
    memory snapshot never needs either, so nothing is resolved.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: memory snapshots hold only plain data"
        )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building or walking a snapshot.

    A snapshot is millions of small acyclic dicts and lists; with the collector
    on, unpickling one triggers repeated full collections over everything
    loaded so far (3-4x slower). Nothing in it can form a cycle, so nothing is
    lost by pausing; the previous state is restored.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one snapshot pickle with the restricted unpickler."""
    p = Path(path)
    try:
        with open(p, "rb") as fh, gc_paused():
            data = _PlainUnpickler(io.BufferedReader(fh, buffer_size=1 << 20)).load()
    except FileNotFoundError as exc:
        raise InvalidInput(
            f"no such snapshot file: {p}",
            fix="Pass a snapshot file that exists, or its folder: `rankscope memory DIR`, DIR being where "
            "rankscope.probe.record_oom_snapshots(DIR) or torch.cuda.memory._dump_snapshot(path) wrote them.",
        ) from exc
    except pickle.UnpicklingError as exc:
        raise SnapshotUnreadable(f"{p}: {exc}") from exc
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError) as exc:
        raise SnapshotUnreadable(f"{p} is not a readable pickle ({type(exc).__name__}: {exc})") from exc
    if isinstance(data, list):  # torch.cuda.memory_snapshot() (segments only) pickled directly
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        raise SnapshotUnreadable(f"{p} is a pickle but not a memory snapshot (no 'segments' key)")
    return data


def snapshot_files(paths: list[str]) -> list[tuple[Path, int | None]]:
    """Expand files and directories into (file, rank-from-name), sorted by rank."""
    out: list[tuple[Path, int | None]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in SNAPSHOT_SUFFIXES)
            if not found:
                raise InvalidInput(
                    f"{p} holds no snapshot files ({', '.join(SNAPSHOT_SUFFIXES)})",
                    fix="Point at the directory rankscope.probe.record_oom_snapshots(dir) wrote, or at the files.",
                )
            out.extend((f, am.rank_from_filename(f.name, loose=True)) for f in found)
        elif p.is_file():
            out.append((p, am.rank_from_filename(p.name)))
        else:
            raise InvalidInput(
                f"no such file or folder: {p} (a memory snapshot or its folder)",
                fix="Pass a snapshot file that exists, or its folder: `rankscope memory DIR`, DIR being where "
                "rankscope.probe.record_oom_snapshots(DIR) or torch.cuda.memory._dump_snapshot(path) wrote them.",
            )
    if len(out) > MAX_SNAPSHOTS:
        raise InvalidInput(
            f"{len(out)} snapshot files given", fix=f"Pass at most {MAX_SNAPSHOTS} (pick a few ranks)."
        )
    return sorted(out, key=lambda t: (t[1] is None, t[1] if t[1] is not None else 0, str(t[0])))


def _torch_helpers() -> tuple[am.BlockExtra | None, am.FrameFilter | None]:
    """torch's own snapshot helpers from ``torch/cuda/_memory_viz.py``, or (None, None) for the fallbacks.

    That file imports only the standard library, so it is loaded on its own
    from torch's install directory: reading a snapshot then costs
    milliseconds instead of a full ``import torch`` (seconds, hundreds of MB).
    """
    mod = sys.modules.get("torch.cuda._memory_viz")
    if mod is None:
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
        if origin is None:
            return None, None
        path = Path(origin).parent / "cuda" / "_memory_viz.py"
        try:
            file_spec = importlib.util.spec_from_file_location("rankscope._torch_memory_viz", path)
            if file_spec is None or file_spec.loader is None:
                return None, None
            mod = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(mod)
        except (
            Exception
        ) as exc:  # a torch build whose file moved or changed: the fallbacks read the same data
            log.info("cannot load %s (%s); using rankscope's own snapshot reader", path, exc)
            return None, None
    block_extra: Callable[..., Any] | None = getattr(mod, "_block_extra", None)
    frame_filter: Callable[..., Any] | None = getattr(mod, "_frame_filter", None)
    return block_extra, frame_filter


def _redact_summary(s: SnapshotSummary, red: Redactor) -> SnapshotSummary:
    for site in s.top_sites:
        site.site = red.text(site.site)
        site.stack = [red.text(x) for x in site.stack]
        site.script = red.text(site.script) if site.script else site.script
    for leak in s.leak_suspects:
        leak.site = red.text(leak.site)
        leak.script = red.text(leak.script) if leak.script else leak.script
    for oom in s.ooms:
        oom.site = red.text(oom.site) if oom.site else oom.site
    if s.allocator_settings:
        s.allocator_settings = red.text(s.allocator_settings)
    s.source = red.text(s.source)
    return s


def read_snapshots(
    files: list[tuple[Path, int | None]], *, top: int = 10, raise_lone: bool = True
) -> tuple[list[SnapshotSummary], list[RankError]]:
    """Each file's summary (redacted), and an error for each file that is not a readable snapshot.

    A lone file's error is raised (``raise_lone``): there is nothing else to answer with.
    """
    block_extra, frame_filter = _torch_helpers()
    red = Redactor()
    summaries: list[SnapshotSummary] = []
    errors: list[RankError] = []
    for path, rank in files:
        # The collector stays paused from loading to freeing: once re-enabled,
        # its next young collection would walk every container of the
        # just-loaded snapshot (they are all still in generation 0), and the
        # older ones again later, for nothing (seconds on a 500 MB file).
        with gc_paused():
            try:
                data = load_snapshot(path)
            except RankscopeError as exc:
                if raise_lone and len(files) == 1:
                    raise
                errors.append(RankError(rank=rank, kind="failed", message=exc.message, fix=exc.fix))
                continue
            summary = am.analyze_snapshot(
                data, str(path), rank, top=top, block_extra=block_extra, frame_filter=frame_filter
            )
            del data
        summaries.append(_redact_summary(summary, red))
    return summaries, errors


MAX_SOURCES = 8
"""The most source files read for one answer: the scripts its leaks' places name."""
MAX_SOURCE_BYTES = 1 << 20


def _source_file(name: str, roots: list[Path]) -> Path | None:
    """The file a frame names: on this host as named, else the longest tail of its path found under
    one of ``roots`` (a dead job's folder holds its code beside the snapshots: train.py for
    /workspace/lm/train.py)."""
    path = Path(name)
    if path.is_absolute() and path.is_file():
        return path
    parts = [p for p in path.parts if p not in ("/", "")]
    for root in roots:
        for k in range(len(parts)):
            candidate = root.joinpath(*parts[k:])
            if candidate.is_file():
                return candidate
    return None


def job_sources(summaries: list[SnapshotSummary], near: list[Path]) -> dict[str, str]:
    """The text of the job's files that the snapshots' places name (script lines, their callers, sites
    in the script itself), by the path the frames give, for the leak's answer to quote the
    statements that keep its tensors. Read where the frames say, else beside the snapshot files
    (``near``) or one folder up; a file not found, too large or not text is left out."""
    wanted: list[str] = []
    for s in summaries:
        places: list[tuple[str, str | None]] = [
            *((t.site, t.script) for t in s.top_sites),
            *((t.site, t.script) for t in s.leak_suspects),
        ]
        for site, script in places:
            for text in (script or site).split(" <- "):
                frame = split_frame(text)
                if frame is not None and frame[0] not in wanted:
                    wanted.append(frame[0])
    roots = list(dict.fromkeys([*near, *(p.parent for p in near)]))
    out: dict[str, str] = {}
    for name in wanted[:MAX_SOURCES]:
        found = _source_file(name, roots)
        try:
            if found is not None and found.stat().st_size <= MAX_SOURCE_BYTES:
                out[name] = found.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def analyze_snapshot_files(paths: list[str], *, top: int = 10) -> MemoryReport:
    """Snapshot files (or directories of per-rank files) to a bounded report, its one memory finding first."""
    files = snapshot_files(paths)
    summaries, errors = read_snapshots(files, top=top)
    lead = am.diagnose(summaries, job_sources(summaries, list(dict.fromkeys(p.parent for p, _ in files))))
    findings = [lead] if lead is not None else []
    findings.extend(f for s in summaries for f in am.snapshot_findings(s))
    findings.extend(am.compare_snapshots(summaries))
    next_steps = [
        NextStep(
            action="Read the OOM playbook for what each finding means and its fix.",
            skill_section="skill/oom.md",
        ),
        NextStep(
            action="Check whether the sharding plan can fit at all.",
            tool="memory_budget",
            skill_section="skill/oom.md#budget",
        ),
    ]
    truncated = any(s.other_sites for s in summaries)
    return MemoryReport(
        mode="snapshots",
        snapshots=summaries,
        findings=findings,
        next_steps=next_steps,
        errors=errors,
        truncated=truncated,
        hint=f"Showing the top {top} allocation sites per snapshot; pass a larger top to see more."
        if truncated
        else None,
    )


# ---------------------------------------------------------------------- live


def _find_job(pid: int | None) -> Job:
    """The job around ``pid`` (a rank, its launcher or a rank's child; None: the only job here)."""
    return find_job(pid)


def _nvidia_smi() -> tuple[dict[int, list[tuple[str, int]]] | None, str | None]:
    """pid -> [(gpu, bytes)] from nvidia-smi, or (None, why not)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (
            None,
            "nvidia-smi not found: no NVIDIA driver on this host (or not on PATH); reporting host memory only.",
        )
    try:
        out = subproc.run(
            [exe, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"],
            NVIDIA_SMI_TIMEOUT,
        )
    except OSError as exc:
        return None, f"nvidia-smi could not run ({exc}); host memory only."
    if out.timed_out or out.rc is None:
        return (
            None,
            f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT:.0f}s (driver busy or hung); host memory only.",
        )
    if out.rc != 0:
        first = (out.stdout.strip() or out.stderr.strip() or f"exit {out.rc}").splitlines()[0]
        return None, f"nvidia-smi failed: {first}; reporting host memory only."
    return am.parse_nvidia_smi_apps(out.stdout), None


def _read_mem(pid: int) -> tuple[dict[str, int], dict[str, int]]:
    status = am.parse_kb_fields(procfs.text(pid, "status"))
    rollup = am.parse_kb_fields(procfs.read_text(pid, "smaps_rollup") or "")
    return status, rollup


def _rank_memory(
    rp: RankProcess, kids: dict[int, list[int]], gpu: Mapping[int, list[tuple[str, int]]] | None
) -> RankMemory:
    rm = RankMemory(rank=rp.rank, pid=rp.pid, host=rp.host)
    try:
        status, rollup = _read_mem(rp.pid)
    except OSError as exc:
        rm.error = f"cannot read /proc/{rp.pid}: {exc.strerror or exc}"
        return rm
    rm.rss_bytes = status.get("VmRSS")
    rm.peak_rss_bytes = status.get("VmHWM")
    rm.shmem_bytes = status.get("RssShmem")
    rm.swap_bytes = status.get("VmSwap")
    rm.pss_bytes = rollup.get("Pss")
    children = descendants(rp.pid, kids)
    for c in children:
        try:
            cs, cr = _read_mem(c)
        except OSError:
            continue  # a worker that just exited
        rm.children += 1
        rm.children_rss_bytes += cs.get("VmRSS", 0)
        rm.children_pss_bytes += cr.get("Pss", 0)
    if gpu is not None:
        used = 0
        seen: list[str] = []
        for p in (rp.pid, *children):
            for dev, b in gpu.get(p, []):
                used += b
                if dev and dev not in seen:
                    seen.append(dev)
        rm.gpu_used_bytes = used
        rm.gpu_indices = seen
    return rm


def inspect_live(pid: int | None) -> MemoryReport:
    """Per-rank GPU (nvidia-smi) and host (/proc) memory of the job around ``pid`` (None: the only job here)."""
    job = _find_job(pid)
    gpu, note = _nvidia_smi()
    kids = children_map()
    ranks = [
        _rank_memory(rp, kids, gpu) for rp in sorted(job.ranks, key=lambda r: (r.rank is None, r.rank or 0))
    ]
    if gpu is not None and gpu and not any(r.gpu_used_bytes for r in ranks):
        note = (
            f"nvidia-smi lists {len(gpu)} compute processes but none has a rank's pid: rankscope probably runs in "
            "another PID namespace (container) than the driver; GPU numbers per rank are unavailable."
        )
    errors = [
        RankError(
            rank=r.rank,
            pid=r.pid,
            host=r.host,
            kind="process_exited",
            message=r.error,
            fix="Re-run while the job is alive.",
        )
        for r in ranks
        if r.error
    ]
    findings = am.live_findings(ranks)
    next_steps = [
        NextStep(
            action="For CUDA detail, record snapshots in the job (rankscope.probe.record_oom_snapshots) and run inspect_memory on them.",
            tool="inspect_memory",
            skill_section="skill/oom.md#snapshots",
        )
    ]
    return MemoryReport(
        mode="live",
        job=job,
        gpu_available=gpu is not None,
        gpu_note=note,
        ranks=ranks,
        findings=findings,
        next_steps=next_steps,
        errors=errors,
    )


def inspect_memory(pid: int | None = None, paths: list[str] | None = None, *, top: int = 10) -> MemoryReport:
    """Memory per rank of a live job (``pid``; None: the only job on this host) or of snapshot files (``paths``)."""
    check_pid(pid)
    if not 1 <= top <= MAX_TOP:
        raise InvalidInput(
            f"top (--top) must be between 1 and {MAX_TOP}, got {top}.",
            fix="Pass 10 (the default), or more to list more allocation sites.",
        )
    if pid is not None and paths:
        raise InvalidInput(
            "pass either a pid or snapshot paths, not both",
            fix="`rankscope memory --pid PID` or `rankscope memory PATH...`.",
        )
    if paths:
        return analyze_snapshot_files(list(paths), top=top)
    return inspect_live(pid)


# -------------------------------------------------------------------- budget


def _load_placement(placement: Any) -> tuple[Any, str]:
    """A placement model, a dict/list, JSON text, or a path to a JSON file -> (plain data, source)."""
    if hasattr(placement, "model_dump"):
        return placement.model_dump(mode="json"), type(placement).__name__
    if isinstance(placement, (dict, list)):
        return placement, "<data>"
    if isinstance(placement, str):
        text = placement.strip()
        if text.startswith(("{", "[")):
            return json.loads(text), "<json>"
        path = Path(placement)
        if path.is_dir():
            files = sorted(path.glob("placements-rank*.json"))
            if not files:
                raise InvalidInput(
                    f"{path} holds no placements-rank*.json files",
                    fix="Write them with rankscope.probe.dump(model, dir, kind='placements') on every rank.",
                )
            try:
                return {"ranks": [json.loads(f.read_text()) for f in files]}, str(path)
            except json.JSONDecodeError as exc:
                raise InvalidInput(
                    f"a placement file in {path} is not JSON: {exc}", fix="Re-dump it."
                ) from exc
        if not path.is_file():
            raise InvalidInput(
                f"no such placement file: {placement}",
                fix="Write one with rankscope.probe.dump(model, dir, kind='placements') or "
                "`rankscope placements CHECKPOINT --json > placement.json`.",
            )
        try:
            return json.loads(path.read_text()), str(path)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                f"{path} is not JSON: {exc}",
                fix="Pass a placement report: `rankscope placements CHECKPOINT --json --full > plan.json` (or "
                "rankscope.probe.dump(model, DIR, kind='placements')), then `rankscope memory budget plan.json`.",
            ) from exc
    raise InvalidInput(
        f"cannot read a placement from {type(placement).__name__}", fix="Pass a path, JSON text or a report."
    )


def memory_budget(
    placement: PlacementReport | PlacementsReport | BudgetInput | dict[str, Any] | list[Any] | str,
    *,
    optimizer: str = "adam",
    param_dtype: str = "float32",
    grad_dtype: str | None = None,
    optim_dtype: str = "float32",
    gpu_memory: str | int | None = None,
    world_size: int | None = None,
) -> BudgetReport:
    """Per-rank bytes of a sharding plan and of DDP / per-layer FSDP / root-only FSDP."""
    data, source = _load_placement(placement)
    try:
        inp = am.budget_input_from_data(data, world_size)
    except ValueError as exc:
        raise InvalidInput(
            f"{source} is no placement report: {exc}",
            fix="Pass a placement report: `rankscope placements CHECKPOINT --json --full > plan.json` (or "
            "rankscope.probe.dump(model, DIR, kind='placements')), then `rankscope memory budget plan.json`.",
        ) from exc
    try:
        gpu = am.parse_size(gpu_memory) if gpu_memory is not None else None
        return am.compute_budget(
            inp,
            source=source,
            optimizer=optimizer,
            param_dtype=param_dtype,
            grad_dtype=grad_dtype,
            optim_dtype=optim_dtype,
            gpu_memory=gpu,
            world_size=world_size,
        )
    except ValueError as exc:
        raise InvalidInput(
            f"{exc} (budget of {source})",
            fix="`rankscope memory budget --help` lists the accepted values of each option.",
        ) from exc
