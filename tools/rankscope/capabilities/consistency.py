"""``rankscope compare DIR``: compare what each rank saved, after the fact.

Accepts the per-rank fingerprint files of ``rankscope.probe.dump`` and per-rank
``torch.save``d state (a state_dict, an optimizer's, or a checkpoint dict holding both), the
rank read from the file name (``model_rank3.pt``, ``rank-3.pt``, ``shard_3.bin``) or from a
per-rank folder (``rank3/optim.pt``). Several files per rank (``model_rank3.pt`` and
``optim_rank3.pt``) are compared name pattern by name pattern, their tensors named after the
pattern (``optim.state.0.step``). Files are loaded with ``weights_only=True`` and fingerprinted
the way the live probe does, then the same pure comparison runs, given each file's modification
time too (a rank whose file is much older than the others' resumed from, or saved, an older
state). Files it cannot use are reported in ``problems``; mixed jobs and world sizes are
reported, never crashed on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rankscope.analysis.consistency import compare_fingerprints
from rankscope.analysis.ranges import ranks_phrase
from rankscope.analysis.redact import redact_text
from rankscope.errors import InvalidInput, NothingToRead, TorchMissing
from rankscope.models.consistency import ConsistencyReport, Fingerprint, RankFingerprints

_FP_FILE = re.compile(r"^fingerprints-rank(\d+)\.json$")
_SD_FILE = re.compile(r"(?:rank|shard|_|-)[_-]?(\d+)\.(?:pt|pth|bin|ckpt)$", re.IGNORECASE)
_RANK_DIR = re.compile(r"^(?:rank|shard|proc)[_-]?(\d+)$", re.IGNORECASE)
_SD_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
FP_PATTERN = "fingerprints-rank{R}.json"

NOTHING_SAVED_FIX = (
    "Nothing saved yet (a live job): add one line to the training script, on every rank after the optimizer "
    "is built: `rankscope.probe.watch_consistency(model, every=50, optimizer=opt)`; rank 0 prints the first "
    "step at which the ranks differ and which tensors. Or, at the next checkpoint, save on every rank: "
    "rankscope.probe.dump(model, DIR) or torch.save({'model': model.state_dict(), 'optim': opt.state_dict()}, "
    "f'DIR/rank{rank}.pt'), then `rankscope compare DIR` (skill/wrong-results.md#offline)."
)


@dataclass
class _Found:
    """What the folder holds: per name pattern, each rank's file; and what could not be used."""

    fingerprints: dict[int, Path] = field(default_factory=dict)
    saved: dict[str, dict[int, Path]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _state_dict_fingerprints(path: Path) -> tuple[list[Fingerprint], list[str]]:
    try:
        import torch
    except ImportError as exc:
        raise TorchMissing(f"comparing torch.save files needs torch: {exc}") from exc
    from rankscope.probe.consistency import collect

    obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    return collect(obj, "params")


def _add_saved(found: _Found, f: Path) -> None:
    """One torch.save file: its rank from the file name, filed under its name pattern (``model_rank{R}.pt``)."""
    m = _SD_FILE.search(f.name)
    if m is None:
        found.problems.append(
            f"{f.name}: no rank number in the file name (expected e.g. model_rank3.pt); skipped"
        )
        return
    pattern = f.name[: m.start(1)] + "{R}" + f.name[m.end(1) :]
    found.saved.setdefault(pattern, {})[int(m.group(1))] = f


def _scan(root: Path) -> _Found:
    """Every per-rank file of ``root``, and of its per-rank folders (``rank3/``)."""
    found = _Found()
    for f in sorted(root.iterdir()):
        d = _RANK_DIR.match(f.name)
        if f.is_dir() and d:
            for g in sorted(f.iterdir()):
                if g.is_file() and g.suffix.lower() in _SD_SUFFIXES:
                    pattern = f"{f.name[: d.start(1)]}{{R}}{f.name[d.end(1) :]}/{g.name}"
                    found.saved.setdefault(pattern, {})[int(d.group(1))] = g
            continue
        if not f.is_file():
            continue
        m = _FP_FILE.match(f.name)
        if m:
            found.fingerprints[int(m.group(1))] = f
        elif f.suffix.lower() in _SD_SUFFIXES:
            _add_saved(found, f)
    return found


def _read_fingerprint_files(files: dict[int, Path], problems: list[str]) -> dict[int, RankFingerprints]:
    out: dict[int, RankFingerprints] = {}
    for rank, f in files.items():
        try:
            rep = RankFingerprints.model_validate(json.loads(f.read_text()))
        except (OSError, ValueError, ValidationError) as exc:
            problems.append(f"{f.name}: not a rankscope fingerprint file ({type(exc).__name__})")
            continue
        if rep.rank != rank:
            problems.append(f"{f.name}: holds rank {rep.rank}, the name says {rank}")
        out[rep.rank] = rep
    return out


def _prefix(pattern: str) -> str:
    """The name a pattern's tensors get when a rank has several files: ``optim_rank{R}.pt`` -> ``optim``."""
    head, _, tail = pattern.partition("{R}")
    if "/" in tail:  # rank{R}/optim.pt
        return tail.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    stem = re.sub(r"[_\-.]*(?:rank|shard)?[_\-.]*$", "", head, flags=re.IGNORECASE)
    return stem or pattern


def _read_saved(found: _Found) -> dict[int, RankFingerprints]:
    """Each rank's fingerprints over all its files; named after the file's pattern when there are several."""
    out: dict[int, RankFingerprints] = {}
    several = len(found.saved) > 1
    for pattern, files in found.saved.items():
        for rank, f in sorted(files.items()):
            try:
                fps, notes = _state_dict_fingerprints(f)
            except TorchMissing:
                raise
            except InvalidInput as exc:
                found.problems.append(f"{f.name}: {exc.message}")
                continue
            except Exception as exc:  # pickles weights_only refuses, truncated files, ...
                found.problems.append(
                    f"{f.name}: cannot be loaded with torch.load(weights_only=True): {type(exc).__name__}: "
                    f"{redact_text(str(exc))[:200]}"
                )
                continue
            if several:
                fps = [fp.model_copy(update={"name": f"{_prefix(pattern)}.{fp.name}"}) for fp in fps]
            rep = out.setdefault(rank, RankFingerprints(rank=rank, world_size=0, which="state_dict"))
            rep.fingerprints.extend(fps)
            rep.notes.extend(n for n in notes if n not in rep.notes)
    return out


def _with_rank_files(root: Path) -> list[Path]:
    """The sub-folders of ``root`` that hold per-rank files (fingerprints or torch.save'd state)."""
    out = []
    for d in sorted(root.iterdir()):
        if d.is_dir():
            found = _scan(d)
            if found.saved or found.fingerprints:
                out.append(d)
    return out


def _nothing(root: Path, path: str, problems: list[str]) -> NothingToRead:
    """No per-rank file: say where some are (sub-folders, a DCP checkpoint), or what to add to a live job."""
    below = _with_rank_files(root)
    why = "; ".join(problems[:3]) or "no fingerprints-rank<R>.json and no per-rank torch.save files"
    if below:
        names = ", ".join(str(d) for d in below[:4])
        return NothingToRead(
            f"nothing to compare under {path}: {why}; per-rank files are in its sub-folders: {names}",
            fix=f"Compare one save at a time: `rankscope compare {below[-1]}`.",
        )
    if (root / ".metadata").is_file():
        return NothingToRead(
            f"nothing to compare under {path}: it is a DCP checkpoint, whose .distcp files hold shards, "
            "not one copy per rank",
            fix=f"`rankscope placements {path}` shows how it is sharded. {NOTHING_SAVED_FIX}",
        )
    return NothingToRead(f"nothing to compare under {path}: {why}", fix=NOTHING_SAVED_FIX)


def compare_dir(path: str = ".", *, atol: float = 0.0, rtol: float = 0.0) -> ConsistencyReport:
    """Compare per-rank fingerprint files and/or torch.save'd state in ``path``."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise InvalidInput(
            f"{path} is not a directory",
            fix="Pass the directory the ranks saved to: checkpoints, optimizer states, rankscope.probe.dump(...) files.",
        )
    found = _scan(root)
    fp_ranks = _read_fingerprint_files(found.fingerprints, found.problems)
    sd_ranks = _read_saved(found) if found.saved else {}
    problems = found.problems
    if fp_ranks and sd_ranks:
        problems.append(
            "the directory mixes fingerprint files and state_dict files; compared the fingerprint files only"
        )
    per_rank = fp_ranks or sd_ranks
    if not per_rank:
        below = _with_rank_files(root)
        if len(below) == 1:  # the job's folder given, its one checkpoint folder inside: compare that
            report = compare_dir(str(below[0]), atol=atol, rtol=rtol)
            report.read = [f"{below[0].name}/{r}" for r in report.read]
            return report
        raise _nothing(root, path, problems)
    if sd_ranks and not fp_ranks:
        for r in per_rank.values():
            r.world_size = max(per_rank) + 1
    if len(per_rank) == 1:
        problems.append(f"only rank {next(iter(per_rank))} has a file: nothing to compare it with")
    files = {FP_PATTERN: found.fingerprints} if fp_ranks else found.saved
    times = {p: {r: f.stat().st_mtime for r, f in by_rank.items()} for p, by_rank in files.items()}
    report = compare_fingerprints(per_rank, atol=atol, rtol=rtol, problems=problems, file_times=times)
    report.read = [f"{p}: {ranks_phrase(sorted(by_rank))}" for p, by_rank in files.items()]
    return report
