"""The cause a comparison of per-rank tensors can see, in one line that names the rank.

A list of divergent tensors says *what* differs; an agent needs *why*, first. Most wrong results
across ranks that leave files behind have one of a few shapes, each visible in the fingerprints
alone: one rank's step counter behind the others' (it resumed from, or saved, an older state);
a file of another job, world size or model (other keys, shapes or dtypes); keys only some ranks
have (a model built differently per rank); NaN/Inf on one rank; one rank whose every tensor
differs while the others agree; and, from the files' times, one rank's file written long before
the others'. Tensors in which every rank differs from every other (an RNG state, a data position)
are per-rank by nature and never name a rank. Pure: fingerprints and file times in, lines out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.consistency import ConsistencyReport, DivergentTensor, RankFingerprints
from rankscope.models.core import NextStep

CauseKind = Literal[
    "other_job",
    "other_model",
    "step",
    "keys",
    "nonfinite",
    "every_tensor",
    "stale_file",
    "values",
    "per_rank",
]

_STEP_NAME = re.compile(
    r"^(?:global_|current_|num_|n_|total_|train_|trained_|opt_|optimizer_|update_|last_|_)?"
    r"(step|steps|step_count|iter|iters|iteration|iterations|epoch|epochs|updates|batches_tracked)$",
    re.IGNORECASE,
)
_OPTIM_STEP = re.compile(r"(?:^|\.)state\.\d+\.step$")
STALE_MIN_S = 60.0
"""A rank's file is older than the others' only when the gap is at least this long, and ten times
the spread of the others' own times (ranks that save together save within seconds)."""
MAX_NAMES = 3


@dataclass(frozen=True)
class Cause:
    """One cause: what kind, which ranks it names, and the line that says it."""

    kind: CauseKind
    ranks: tuple[int, ...]
    text: str
    short: str = ""
    """What the cause adds to another one about the same ranks (a stale file: its name and age)."""


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{int(x)}" if x == int(x) and abs(x) < 1e15 else f"{x:.6g}"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


def _verb(ranks: Sequence[int], one: str, many: str) -> str:
    return one if len(ranks) == 1 else many


def _count(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:.6g}"


def _who(ranks: Sequence[int]) -> str:
    """``rank 3's``, ``ranks 2-3'``."""
    return ranks_phrase(ranks) + ("'s" if len(ranks) == 1 else "'")


def is_per_rank(d: DivergentTensor) -> bool:
    """Every rank of the group holds its own value: no majority, one rank per value."""
    return d.tie and len(d.reference_ranks) == 1 and len(d.replica_group) == len(d.ranks) + 1


_RNG_NAME = re.compile(r"(?:^|[._])(?:rng|random|generator)s?(?:$|[._])", re.IGNORECASE)
_RNG_DTYPES = ("uint8", "int64", "py:int")


def by_design(d: DivergentTensor) -> bool:
    """A random generator's state (integers, named rng, random or generator) that every rank holds its own
    value of: per rank by design, so never a difference (a float tensor is never taken for one)."""
    return is_per_rank(d) and bool(_RNG_NAME.search(d.name)) and all(v.dtype in _RNG_DTYPES for v in d.values)


def _step_cause(d: DivergentTensor) -> Cause | None:
    """A step counter (optimizer step, epoch, iteration) behind or ahead on the odd ranks."""
    leaf = d.name.rsplit(".", 1)[-1]
    if d.reason != "values" or not _STEP_NAME.match(leaf) or is_per_rank(d):
        return None
    ref, odd = d.values[0], d.values[1:]
    if ref.sum is None or any(v.shape not in ([], [1]) or v.sum is None for v in d.values):
        return None
    gaps = [ref.sum - (v.sum or 0.0) for v in odd]
    low = leaf.lower()  # an LR scheduler's last_epoch counts its step() calls, most often steps
    unit = "epochs" if "epoch" in low and low != "last_epoch" else "iterations" if "iter" in low else "steps"
    what = "optimizer state" if _OPTIM_STEP.search(d.name) else f"saved {leaf}"
    if all(g > 0 for g in gaps):
        how = f"is {_count(max(gaps))} {unit} behind"
    elif all(g < 0 for g in gaps):
        how = f"is {_count(-min(gaps))} {unit} ahead of"
    else:
        how = "differs from"
    odd_vals = "/".join(dict.fromkeys(_num(v.sum) for v in odd))
    tie = "; no majority" if d.tie else ""
    return Cause(
        "step",
        tuple(d.ranks),
        f"{_who(d.ranks)} {what} {how} the others' "
        f"({d.name} {odd_vals} vs {_num(ref.sum)} on {ranks_phrase(d.reference_ranks)}{tie})",
    )


def _run_causes(per_rank: Mapping[int, RankFingerprints]) -> list[Cause]:
    """Ranks whose file names another job or world size than the majority's."""
    out: list[Cause] = []
    facts: list[tuple[str, dict[int, str]]] = [
        ("job", {r: fp.job_id for r, fp in per_rank.items() if fp.job_id}),
        ("world size", {r: str(fp.world_size) for r, fp in per_rank.items() if fp.world_size}),
    ]
    for label, by_rank in facts:
        groups: dict[str, list[int]] = {}
        for r in sorted(by_rank):
            groups.setdefault(by_rank[r], []).append(r)
        if len(groups) < 2:
            continue
        major, major_ranks = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
        out.extend(
            Cause(
                "other_job",
                tuple(ranks),
                f"{_who(ranks)} file comes from another run: {label} {v} (vs {major} on {ranks_phrase(major_ranks)})",
            )
            for v, ranks in groups.items()
            if v != major
        )
    return out[:2]


_META_NAME = re.compile(
    r"(?:^|[._])(?:seed|run_?id|run_?name|job_?id|exp_?name|experiment(?:_?name)?|uuid|git(?:_?sha)?|sha|commit|"
    r"version|config|args|hparams|hyper_?parameters|timestamp|created(?:_at)?|date|wandb(?:_?id)?)(?:$|[._])",
    re.IGNORECASE,
)


def _meta_causes(divergent: Sequence[DivergentTensor]) -> list[Cause]:
    """A run's own facts saved beside the state (seed, run id, config, git sha) that differ on some ranks."""
    out: list[Cause] = []
    seen: set[tuple[int, ...]] = set()
    for d in divergent:
        scalar = all(v.shape in ([], [1]) for v in d.values)
        if not scalar or is_per_rank(d) or not _META_NAME.search(d.name) or tuple(d.ranks) in seen:
            continue
        seen.add(tuple(d.ranks))
        ref, odd = d.values[0], d.values[1:]
        values = f" ({'/'.join(_num(v.sum) for v in odd)} vs {_num(ref.sum)})" if ref.sum is not None else ""
        out.append(
            Cause(
                "other_job",
                tuple(d.ranks),
                f"{_who(d.ranks)} file comes from another run: its {d.name} differs from "
                f"{_who(d.reference_ranks)}{values}",
            )
        )
    return out


def _model_causes(divergent: Sequence[DivergentTensor]) -> list[Cause]:
    """Tensors whose shape or dtype differs on some ranks: another model's file."""
    by_odd: dict[tuple[int, ...], list[DivergentTensor]] = {}
    for d in divergent:
        if d.reason in ("shape", "dtype") and not is_per_rank(d):
            by_odd.setdefault(tuple(d.ranks), []).append(d)
    out = []
    for odd, ds in by_odd.items():
        first = ds[0]
        ref, bad = first.values[0], first.values[1]
        what = f"{bad.shape} vs {ref.shape}" if first.reason == "shape" else f"{bad.dtype} vs {ref.dtype}"
        out.append(
            Cause(
                "other_model",
                odd,
                f"{_who(odd)} file holds another model: {len(ds)} tensor(s) of other shape or dtype "
                f"({first.name} {what} on {ranks_phrase(first.reference_ranks)})",
            )
        )
    return out


def _key_causes(report: ConsistencyReport) -> list[Cause]:
    """Keys only some ranks have, by the ranks in the minority; most of the keys: another model."""
    groups: dict[tuple[tuple[int, ...], bool], list[str]] = {}
    for k in report.missing_keys:
        has = len(k.present_on) < len(k.missing_on)
        side = k.present_on if has else k.missing_on
        groups.setdefault((tuple(side), has), []).append(k.name)
    out = []
    for (ranks, has), names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        others = [r for r in report.ranks if r not in ranks]
        if len(names) * 2 > report.tensors:
            text = (
                f"{_who(ranks)} file holds another model: {len(names)} of {report.tensors} keys "
                f"{'only there' if has else 'missing there'} ({_names(names)})"
            )
            out.append(Cause("other_model", ranks, text))
            continue
        verb, their = ("has", "lack") if has else ("lacks", "have")
        if len(ranks) > 1:
            verb = verb.removesuffix("s") if has else "lack"
        out.append(
            Cause(
                "keys",
                ranks,
                f"{ranks_phrase(ranks)} {verb} {len(names)} key(s) that {ranks_phrase(others)} {their}: "
                f"{_names(names)}",
            )
        )
    return out


def _nonfinite_causes(report: ConsistencyReport) -> list[Cause]:
    by_rank: dict[int, list[str]] = {}
    for n in report.nonfinite:
        by_rank.setdefault(n.rank, []).append(n.name)
    groups: dict[tuple[str, ...], list[int]] = {}
    for r, names in by_rank.items():
        groups.setdefault(tuple(names), []).append(r)
    return [
        Cause(
            "nonfinite",
            tuple(ranks),
            f"{ranks_phrase(ranks)} {_verb(ranks, 'holds', 'hold')} NaN/Inf in {len(names)} tensor(s): {_names(list(names))}",
        )
        for names, ranks in groups.items()
    ]


def _value_causes(report: ConsistencyReport, saved: bool) -> list[Cause]:
    """Ranks that differ in values from a majority: in every tensor, or in some.

    Every tensor of a saved file: a file of another step or run; of a live job: other initial weights.
    """
    by_odd: dict[tuple[int, ...], list[DivergentTensor]] = {}
    per_rank_names = []
    for d in report.divergent:
        if is_per_rank(d):
            per_rank_names.append(d.name)
        elif d.reason not in ("shape", "dtype", "nonfinite"):
            by_odd.setdefault(tuple(d.ranks), []).append(d)
    comparable = report.compared - len(per_rank_names)
    out = []
    for odd, ds in sorted(by_odd.items(), key=lambda kv: -len(kv[1])):
        ref = ranks_phrase(ds[0].reference_ranks)
        tie = " (no majority: either side may be right)" if ds[0].tie else ""
        if len(ds) == comparable and comparable > 2:
            why = (
                "a file of another step or run"
                if saved
                else "never made equal (a missing broadcast?) or drifted everywhere"
            )
            out.append(
                Cause(
                    "every_tensor" if saved else "values",
                    odd,
                    f"{ranks_phrase(odd)} {_verb(odd, 'differs', 'differ')} from {ref} in every compared tensor ({len(ds)} of "
                    f"{comparable}): {why}{tie}",
                )
            )
            continue
        reason = {"not_averaged": "gradient not averaged", "no_grad": "no gradient there"}.get(
            ds[0].reason, "values"
        )
        out.append(
            Cause(
                "values",
                odd,
                f"{ranks_phrase(odd)} {_verb(odd, 'differs', 'differ')} from {ref} in {len(ds)} of {report.compared} compared tensors "
                f"(first: {ds[0].name}, {reason}){tie}",
            )
        )
    if per_rank_names:
        out.append(
            Cause(
                "per_rank",
                (),
                f"every rank holds its own value in {len(per_rank_names)} tensor(s) ({_names(per_rank_names)}): "
                "per-rank by design (RNG state, data position) or never synchronised",
            )
        )
    return out


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def stale_causes(file_times: Mapping[str, Mapping[int, float]]) -> list[Cause]:
    """Per file pattern, the minority of ranks whose file was written long before (or after) the rest.

    The ranks' times are split at their widest gap; the split counts when that gap is at least
    ``STALE_MIN_S`` and ten times the spread inside the larger side.
    """
    out = []
    for pattern, times in file_times.items():
        if len(times) < 2:
            continue
        order = sorted(times, key=lambda r: times[r])
        gaps = [(times[order[i + 1]] - times[order[i]], i) for i in range(len(order) - 1)]
        gap, at = max(gaps)
        old, new = order[: at + 1], order[at + 1 :]
        minority, majority = (old, new) if len(old) <= len(new) else (new, old)
        spread = max(times[r] for r in majority) - min(times[r] for r in majority)
        if gap < max(STALE_MIN_S, 10 * spread):
            continue
        when = "before" if minority is old else "after"
        files = ", ".join(pattern.replace("{R}", str(r)) for r in sorted(minority)[:MAX_NAMES])
        short = f"{files} was written {_duration(gap)} {when} the others'"
        out.append(
            Cause(
                "stale_file",
                tuple(sorted(minority)),
                f"{_who(sorted(minority))} {short} ({ranks_phrase(majority)}: within {_duration(spread)} "
                "of each other)",
                short,
            )
        )
    return out


def find_causes(
    report: ConsistencyReport,
    per_rank: Mapping[int, RankFingerprints],
    file_times: Mapping[str, Mapping[int, float]] | None = None,
) -> list[Cause]:
    """The causes the report and the files' times show, most decisive first.

    A file much older than the others' joins the first cause when it names the same ranks,
    so the first line carries both: what is behind, and that its file is old. Tensors every
    rank holds its own value of come last, and only after a cause that names a rank. ``file_times`` is None for a live
    job's tensors (the probe), which have no file.
    """
    seen: set[tuple[int, ...]] = set()
    steps = []
    for d in report.divergent:  # the first step counter of each set of odd ranks, in module order
        if (c := _step_cause(d)) is not None and c.ranks not in seen:
            seen.add(c.ranks)
            steps.append(c)
    values = _value_causes(report, saved=file_times is not None)
    causes = [
        *_run_causes(per_rank),
        *_meta_causes(report.divergent),
        *_model_causes(report.divergent),
        *steps,
        *_key_causes(report),
        *_nonfinite_causes(report),
        *(c for c in values if c.kind != "per_rank"),
    ]
    stale = stale_causes(file_times or {})
    if causes and stale and causes[0].ranks == stale[0].ranks:
        head, old = causes[0], stale.pop(0)
        causes[0] = Cause(head.kind, head.ranks, f"{head.text}; {old.short}")
    if causes and causes[0].kind != "values":  # the count of differing tensors is the summary's already
        causes = [
            causes[0],
            *(c for c in causes[1:] if not (c.kind == "values" and c.ranks == causes[0].ranks)),
        ]
    named = [*causes, *stale]  # a cause that names no rank never leads the answer
    return [*named, *(c for c in values if c.kind == "per_rank")] if named else []


SECTION = "skill/wrong-results.md#one-rank-behind-or-from-another-run"


def cause_steps(causes: Sequence[Cause]) -> list[NextStep]:
    """The next call for the first cause when it is about a file: which file a rank loaded or wrote.

    The other kinds (keys, NaN, values) keep the report's own next steps.
    """
    if not causes:
        return []
    first = causes[0]
    who = ranks_phrase(first.ranks)
    if first.kind in ("step", "stale_file", "every_tensor"):
        action = (
            f"{who} resumed from (or saved) an older state than the others: find the file each rank "
            "loaded at the last resume (its path and step) and resume every rank from the same step; "
            "state that DDP keeps identical (weights, optimizer) can be saved once and loaded on every rank."
        )
    elif first.kind in ("other_job", "other_model"):
        action = (
            f"{who} file belongs to another run or model: find where the job wrote or read that rank's "
            "file (a rank-dependent path or config), and compare the files of one save only."
        )
    else:
        return []
    return [NextStep(action=action, skill_section=SECTION)]
