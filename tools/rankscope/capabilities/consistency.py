"""``rankscope compare DIR``: compare what each rank saved, after the fact.

Accepts the per-rank fingerprint files of ``rankscope.probe.dump`` and per-rank
``torch.save``d state_dicts (the rank read from the file name, e.g.
``model_rank3.pt``, ``rank-3.pt``, ``shard_3.bin``). State dicts are loaded
with ``weights_only=True`` and fingerprinted the same way the live probe does,
then the same pure comparison runs. Files it cannot use are reported in
``problems``; mixed jobs and world sizes are reported, never crashed on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rankscope.analysis.consistency import compare_fingerprints
from rankscope.analysis.redact import redact_text
from rankscope.errors import InvalidInput, NothingToRead, TorchMissing
from rankscope.models.consistency import ConsistencyReport, RankFingerprints

_FP_FILE = re.compile(r"^fingerprints-rank(\d+)\.json$")
_SD_FILE = re.compile(r"(?:rank|shard|_|-)[_-]?(\d+)\.(?:pt|pth|bin|ckpt)$", re.IGNORECASE)
_SD_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _state_dict_fingerprints(path: Path, rank: int) -> RankFingerprints:
    try:
        import torch
    except ImportError as exc:
        raise TorchMissing(f"comparing torch.save files needs torch: {exc}") from exc
    from rankscope.probe.consistency import collect

    obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    fps, notes = collect(obj, "params")
    return RankFingerprints(rank=rank, world_size=0, which="state_dict", fingerprints=fps, notes=notes)


def compare_dir(path: str, *, atol: float = 0.0, rtol: float = 0.0) -> ConsistencyReport:
    """Compare per-rank fingerprint files and/or torch.save'd state_dicts in ``path``."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise InvalidInput(
            f"{path} is not a directory",
            fix="Pass the directory given to rankscope.probe.dump(...) or holding one torch.save file per rank.",
        )
    problems: list[str] = []
    fp_ranks: dict[int, RankFingerprints] = {}
    sd_ranks: dict[int, RankFingerprints] = {}
    for f in sorted(root.iterdir()):
        if not f.is_file():
            continue
        m = _FP_FILE.match(f.name)
        if m:
            try:
                rep = RankFingerprints.model_validate(json.loads(f.read_text()))
            except (OSError, ValueError, ValidationError) as exc:
                problems.append(f"{f.name}: not a rankscope fingerprint file ({type(exc).__name__})")
                continue
            if rep.rank != int(m.group(1)):
                problems.append(f"{f.name}: holds rank {rep.rank}, the name says {m.group(1)}")
            fp_ranks[rep.rank] = rep
            continue
        if f.suffix.lower() in _SD_SUFFIXES:
            m2 = _SD_FILE.search(f.name)
            if not m2:
                problems.append(
                    f"{f.name}: no rank number in the file name (expected e.g. model_rank3.pt); skipped"
                )
                continue
            rank = int(m2.group(1))
            try:
                sd_ranks[rank] = _state_dict_fingerprints(f, rank)
            except TorchMissing:
                raise
            except InvalidInput as exc:
                problems.append(f"{f.name}: {exc.message}")
            except Exception as exc:  # pickles weights_only refuses, truncated files, ...
                problems.append(
                    f"{f.name}: cannot be loaded with torch.load(weights_only=True): {type(exc).__name__}: {redact_text(str(exc))[:200]}"
                )
    if fp_ranks and sd_ranks:
        problems.append(
            "the directory mixes fingerprint files and state_dict files; compared the fingerprint files only"
        )
    per_rank = fp_ranks or sd_ranks
    if not per_rank:
        why = "; ".join(problems[:3]) or "no fingerprints-rank<R>.json and no per-rank torch.save files"
        raise NothingToRead(
            f"nothing to compare under {path}: {why}",
            fix="Write one file per rank from the job: rankscope.probe.dump(model, DIR) or "
            "torch.save(model.state_dict(), f'DIR/model_rank{rank}.pt'), then run `rankscope compare DIR` "
            "(skill/wrong-results.md#offline).",
        )
    if sd_ranks and not fp_ranks:
        for r in per_rank.values():
            r.world_size = max(per_rank) + 1
    if len(per_rank) == 1:
        problems.append(f"only rank {next(iter(per_rank))} has a file: nothing to compare it with")
    return compare_fingerprints(per_rank, atol=atol, rtol=rtol, problems=problems)
