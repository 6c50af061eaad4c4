"""Compare per-rank tensor fingerprints: which tensors differ on which ranks.

Pure: takes the fingerprints every rank computed and returns a
``ConsistencyReport``. Each tensor is compared within its *replica group*:
ranks that hold the same (shard of the) tensor. For a plain tensor that is
every rank; for a DTensor it is the ranks whose mesh coordinates agree on all
non-Replicate dims (``Fingerprint.shard_key``), so shards that legitimately
differ are never compared with each other.

Within a group the reference is the majority value (exact checksum, or the
float summaries within atol/rtol when a tolerance is given). Ties — two ranks
that disagree, or every rank different — are broken in favour of the group
holding the lowest rank, and marked ``tie``, because with no majority the
data cannot say which side is right.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.analysis.consistency_cause import by_design, cause_steps, find_causes, is_per_rank
from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.models.consistency import (
    ConsistencyReport,
    DivergentTensor,
    Fingerprint,
    KeyPresence,
    NonFinite,
    RankFingerprints,
    RankValue,
)
from rankscope.models.core import NextStep

NO_GRAD = "none"
"""dtype of the fingerprint of a parameter whose .grad is None on that rank."""


def _close(a: float | None, b: float | None, atol: float, rtol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def _same(a: Fingerprint, b: Fingerprint, atol: float, rtol: float) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if atol == 0 and rtol == 0:
        return a.checksum == b.checksum
    return a.checksum == b.checksum or (
        _close(a.sum, b.sum, atol, rtol)
        and _close(a.abs_max, b.abs_max, atol, rtol)
        and a.nan == b.nan
        and a.inf == b.inf
    )


def _reference(
    ranks: list[int], fps: Mapping[int, Fingerprint], atol: float, rtol: float
) -> tuple[list[int], bool]:
    """Ranks agreeing with the majority value, and whether that was a tie."""
    if atol == 0 and rtol == 0:  # exact: equality is an equivalence, count classes in one pass
        classes: dict[tuple[Any, ...], list[int]] = {}
        for r in ranks:
            fp = fps[r]
            classes.setdefault((tuple(fp.shape), fp.dtype, fp.checksum), []).append(r)
        if len(classes) == 1:
            return list(ranks), False
        sizes = sorted((len(m) for m in classes.values()), reverse=True)
        majority = max(classes.values(), key=lambda m: (len(m), -m[0]))
        return majority, sizes[0] == sizes[1]
    best: list[int] = []
    tie = False
    for r in ranks:  # ascending: on equal support the lowest rank's cluster wins
        cluster = [o for o in ranks if _same(fps[o], fps[r], atol, rtol)]
        if len(cluster) > len(best):
            best, tie = cluster, False
        elif len(cluster) == len(best) and set(cluster) != set(best):
            tie = True
    return best, tie


def _reason(ref: Fingerprint, other: Fingerprint) -> str:
    if NO_GRAD in (ref.dtype, other.dtype):
        return "no_grad"
    if ref.shape != other.shape:
        return "shape"
    if ref.dtype != other.dtype:
        return "dtype"
    if (ref.nan or ref.inf) != (other.nan or other.inf):
        return "nonfinite"
    if ref.kind == "grad":  # after the gradient sync every rank holds the same average
        return "not_averaged"
    return "values"


def _value(rank: int, fp: Fingerprint) -> RankValue:
    return RankValue(
        rank=rank,
        checksum=fp.checksum,
        shape=fp.shape,
        dtype=fp.dtype,
        sum=fp.sum,
        abs_max=fp.abs_max,
        nan=fp.nan,
        inf=fp.inf,
    )


def _ordered_names(per_rank: Mapping[int, Sequence[Fingerprint]]) -> list[str]:
    """Module order: the lowest rank's order, then names only other ranks have, in their order."""
    seen: dict[str, None] = {}
    for r in sorted(per_rank):
        for fp in per_rank[r]:
            seen.setdefault(fp.name, None)
    return list(seen)


def _run_problems(per_rank: Mapping[int, RankFingerprints], ranks: Sequence[int]) -> list[str]:
    """Files that cannot be compared as one run: other world sizes, jobs or things fingerprinted, gaps."""
    worlds = sorted({per_rank[r].world_size for r in ranks})
    job_ids = sorted({j for r in ranks if (j := per_rank[r].job_id)})
    whiches = sorted({per_rank[r].which for r in ranks})
    out: list[str] = []
    if len(worlds) > 1:
        out.append(f"ranks report different world sizes {worlds}: the files come from different runs")
    if len(job_ids) > 1:
        out.append(
            f"fingerprints come from {len(job_ids)} different jobs ({', '.join(job_ids)}): compare files of one run"
        )
    if len(whiches) > 1:
        out.append(f"ranks fingerprinted different things ({', '.join(whiches)})")
    world = worlds[-1] if worlds else None
    if world is not None and ranks and len(ranks) < world:
        missing = sorted(set(range(world)) - set(ranks))
        out.append(f"no fingerprints for ranks [{rank_ranges(missing)}] of a world of {world}")
    return out


@dataclass
class _Tally:
    """What the per-tensor comparison found, accumulated over the tensors."""

    divergent: list[DivergentTensor] = field(default_factory=list)
    nonfinite: list[NonFinite] = field(default_factory=list)
    missing_keys: list[KeyPresence] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    compared: int = 0
    single: int = 0


def _compare_tensor(
    name: str,
    ranks: Sequence[int],
    by_rank: Mapping[int, Mapping[str, Fingerprint]],
    tally: _Tally,
    atol: float,
    rtol: float,
) -> None:
    """One tensor across the ranks: presence, non-finite values, and divergence within each replica group."""
    holders = [r for r in ranks if name in by_rank[r]]
    if len(holders) < len(ranks):
        tally.missing_keys.append(
            KeyPresence(name=name, present_on=holders, missing_on=[r for r in ranks if r not in holders])
        )
    fps = {r: by_rank[r][name] for r in holders}
    tally.nonfinite.extend(
        NonFinite(name=name, rank=r, nan=fps[r].nan, inf=fps[r].inf)
        for r in holders
        if fps[r].nan or fps[r].inf
    )
    if any(fp.partial for fp in fps.values()):
        tally.partial.append(name)
    groups: dict[str | None, list[int]] = {}
    for r in holders:
        groups.setdefault(fps[r].shard_key, []).append(r)
    if len(holders) > 1 and all(len(m) < 2 for m in groups.values()):
        tally.single += 1
    for key, members in groups.items():
        if len(members) < 2:
            continue
        tally.compared += 1
        ref, tie = _reference(members, fps, atol, rtol)
        odd = [r for r in members if r not in ref]
        if not odd:
            continue
        ref_fp = fps[ref[0]]
        tally.divergent.append(
            DivergentTensor(
                name=name,
                ranks=odd,
                reference_ranks=ref,
                tie=tie,
                reason=_reason(ref_fp, fps[odd[0]]),
                replica_group=members,
                shard_key=key,
                values=[_value(ref[0], ref_fp)] + [_value(r, fps[r]) for r in odd],
            )
        )


def compare_fingerprints(
    per_rank: Mapping[int, RankFingerprints],
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    problems: Sequence[str] = (),
    file_times: Mapping[str, Mapping[int, float]] | None = None,
) -> ConsistencyReport:
    """Compare the fingerprints of every rank; the same input gives the same report on every rank.

    ``file_times``: for saved files, each name pattern's (``rank{R}.pt``) modification time per
    rank, so that a file much older than the others' is named among the causes.
    """
    ranks = sorted(per_rank)
    by_rank: dict[int, dict[str, Fingerprint]] = {
        r: {fp.name: fp for fp in per_rank[r].fingerprints} for r in ranks
    }
    names = _ordered_names({r: per_rank[r].fingerprints for r in ranks})
    worlds = sorted({per_rank[r].world_size for r in ranks})
    whiches = sorted({per_rank[r].which for r in ranks})
    all_problems = [*problems, *_run_problems(per_rank, ranks)]
    tally = _Tally()
    for name in names:
        _compare_tensor(name, ranks, by_rank, tally, atol, rtol)
    own = [d.name for d in tally.divergent if by_design(d)]
    tally.divergent = [d for d in tally.divergent if not by_design(d)]
    consistent = not tally.divergent and not tally.missing_keys and not tally.nonfinite and not all_problems
    report = ConsistencyReport(
        consistent=consistent,
        world_size=worlds[-1] if worlds else None,
        ranks=ranks,
        which=whiches[0] if len(whiches) == 1 else None,
        job_ids=sorted({j for r in ranks if (j := per_rank[r].job_id)}),
        tensors=len(names),
        compared=tally.compared - len(own),
        sharded_not_compared=tally.single,
        divergent=tally.divergent,
        first_divergent=tally.divergent[0].name if tally.divergent else None,
        nonfinite=tally.nonfinite,
        missing_keys=tally.missing_keys,
        partial=tally.partial,
        per_rank=own,
        problems=all_problems,
        notes=list(dict.fromkeys(n for r in ranks for n in per_rank[r].notes)),
        consistent_modules=_consistent_modules(names, tally.divergent),
    )
    report.summary = summarize(report)
    causes = find_causes(report, per_rank, file_times)
    report.causes = [c.text for c in causes]
    first = cause_steps(causes)
    generic = ("#missing-broadcast", "#read-the-report")  # said better by a cause about a file
    report.next_steps = [
        *first,
        *(s for s in next_steps(report) if not (first and (s.skill_section or "").endswith(generic))),
    ]
    return report


def _consistent_modules(names: Sequence[str], divergent: Sequence[DivergentTensor]) -> list[str]:
    """The top-level modules none of whose tensors differ, in module order: what can be ruled out."""
    odd = {d.name.split(".", 1)[0] for d in divergent}
    return [m for m in dict.fromkeys(n.split(".", 1)[0] for n in names) if m not in odd]


def summarize(report: ConsistencyReport) -> str:
    """One sentence a person or an agent can act on."""
    if not report.ranks:
        return "no fingerprints to compare"
    if len(report.ranks) == 1 and report.consistent:
        return f"one rank only: {report.tensors} tensors fingerprinted, no NaN/Inf, nothing to compare across ranks"
    if report.consistent and not report.compared:
        return (
            f"nothing to compare across ranks {_ranks(report.ranks)}: the {report.sharded_not_compared} tensors are "
            "shards held by one rank each; no NaN/Inf"
        )
    partial = (
        f"; {len(report.partial)} DTensor(s) hold unreduced Partial values ({report.partial[0]})"
        if report.partial
        else ""
    )
    if report.consistent:
        return f"all {report.compared} compared tensors are identical across ranks {_ranks(report.ranks)}{partial}"
    parts: list[str] = []
    if report.divergent:
        named = [d for d in report.divergent if not is_per_rank(d)] or report.divergent
        odd = sorted({r for d in named for r in d.ranks})
        parts.append(
            f"{len(report.divergent)} of {report.compared} compared tensors differ ({_label(odd)}); "
            f"first in module order: {report.first_divergent}"
        )
        grads = sum(1 for d in report.divergent if d.reason == "not_averaged")
        if grads:
            parts.append(f"the gradients of {grads} parameters were not averaged across ranks")
    if report.nonfinite:
        bad = sorted({n.rank for n in report.nonfinite})
        parts.append(f"NaN/Inf in {len({n.name for n in report.nonfinite})} tensor(s) on {_label(bad)}")
    if report.missing_keys:
        parts.append(f"{len(report.missing_keys)} tensors present on some ranks only")
    if report.problems:
        parts.append(report.problems[0])
    return "; ".join(parts) + partial


def next_steps(report: ConsistencyReport) -> list[NextStep]:
    steps: list[NextStep] = []
    pb = "skill/wrong-results.md"
    if report.nonfinite:
        steps.append(
            NextStep(
                action="Find where the NaN/Inf first appears on the named rank: check its inputs for that step and "
                "run with torch.autograd.set_detect_anomaly(True) on a small repro.",
                skill_section=f"{pb}#nan-on-one-rank",
            )
        )
    no_grad = [d for d in report.divergent if d.reason == "no_grad"]
    if no_grad:
        d = no_grad[0]
        steps.append(
            NextStep(
                action=f"{d.name} has no gradient on {_label(d.ranks)}: the parameter was not used in forward there. "
                "Make every rank use every parameter, or wrap with DDP(find_unused_parameters=True).",
                skill_section=f"{pb}#unused-parameters",
            )
        )
    not_averaged = [d for d in report.divergent if d.reason == "not_averaged"]
    if not_averaged:
        steps.append(
            NextStep(
                action=f"The gradients of {len(not_averaged)} parameters ({not_averaged[0].name} first) were not "
                "averaged across ranks: the gradient sync does not cover them. Look for an averager or DDP/FSDP "
                "wrapper built before these parameters were unfrozen, added or replaced (its parameter list is "
                "captured once), or a no_sync() that never ends.",
                skill_section=f"{pb}#gradients-not-averaged",
            )
        )
    unexplained = [d for d in report.divergent if d.reason not in ("nonfinite", "no_grad", "not_averaged")]
    if unexplained:
        kinds = {d.name.rsplit(".", 1)[-1] for d in unexplained}
        if kinds & {"running_mean", "running_var", "num_batches_tracked"} and len(kinds) <= 3:
            steps.append(
                NextStep(
                    action="Only BatchNorm statistics differ: convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm "
                    "or keep DDP's broadcast_buffers=True.",
                    skill_section=f"{pb}#batchnorm",
                )
            )
        elif report.compared and len(report.divergent) == report.compared:
            steps.append(
                NextStep(
                    action="Every compared tensor differs: the ranks started from different weights. Seed identically "
                    "or broadcast the initial state from rank 0 before training.",
                    skill_section=f"{pb}#missing-broadcast",
                )
            )
        else:
            steps.append(
                NextStep(
                    action="Check the first divergent tensor: unused parameters on one rank, rank-dependent code paths, "
                    "or a missing all-reduce of its gradient.",
                    skill_section=f"{pb}#read-the-report",
                )
            )
    if report.partial:
        steps.append(
            NextStep(
                action="DTensors with a Partial placement hold unreduced values: call .redistribute(placements=[Replicate()]) "
                "or .full_tensor() before using them.",
                skill_section=f"{pb}#dtensor-partial",
            )
        )
    if report.missing_keys:
        steps.append(
            NextStep(
                action="Ranks hold different sets of tensors: the model was built differently per rank "
                "(rank-dependent config or code path).",
                skill_section=f"{pb}#read-the-report",
            )
        )
    return steps


def _ranks(ranks: Sequence[int]) -> str:
    """Compact rank list: 0-3,6."""
    return rank_ranges(ranks, empty="")


def _label(ranks: Sequence[int]) -> str:
    return ranks_phrase(ranks, empty="")
