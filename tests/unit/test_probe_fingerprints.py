"""Pure comparison of per-rank fingerprints (rankscope.analysis.consistency).

The fixtures are real fingerprint files written by ``rankscope.probe.dump``
in tests/programs/probe_divergence.py (3 ranks, rank 2 seeded differently).
"""

from __future__ import annotations

import json
import re

from rankscope.analysis.consistency import compare_fingerprints
from rankscope.models.consistency import Fingerprint, RankFingerprints
from tests.paths import DATA as DATA_ROOT
from tests.paths import ROOT

DATA = DATA_ROOT / "probe"


def captured() -> dict[int, RankFingerprints]:
    out = {}
    for f in sorted((DATA / "nobcast").glob("fingerprints-rank*.json")):
        rep = RankFingerprints.model_validate(json.loads(f.read_text()))
        out[rep.rank] = rep
    return out


def with_fps(rank: int, fps: list[Fingerprint], world: int = 2, job: str = "job-a") -> RankFingerprints:
    return RankFingerprints(rank=rank, world_size=world, job_id=job, fingerprints=fps)


def test_missing_broadcast_flags_every_tensor_on_the_odd_rank() -> None:
    report = compare_fingerprints(captured())
    assert not report.consistent
    assert [d.name for d in report.divergent] == ["0.weight", "0.bias", "2.weight", "2.bias"]  # module order
    assert all(d.ranks == [2] and d.reference_ranks == [0, 1] and not d.tie for d in report.divergent)
    assert report.first_divergent == "0.weight"
    assert report.compared == 4
    assert report.next_steps[0].skill_section == "skill/wrong-results.md#missing-broadcast"


def test_identical_ranks_are_consistent() -> None:
    ranks = captured()
    ranks[2] = ranks[0].model_copy(update={"rank": 2})
    report = compare_fingerprints(ranks)
    assert report.consistent and report.divergent == [] and report.compared == 4
    assert "identical" in report.summary


def test_two_ranks_disagreeing_is_a_tie_resolved_towards_the_lowest_rank() -> None:
    ranks = captured()
    report = compare_fingerprints({0: ranks[0], 2: ranks[2].model_copy(update={"rank": 2})})
    assert all(d.tie and d.reference_ranks == [0] and d.ranks == [2] for d in report.divergent)


def test_tolerance_compares_float_summaries() -> None:
    base = captured()[0].fingerprints[0]
    near = base.model_copy(update={"checksum": "x" * 32, "sum": (base.sum or 0) + 1e-7})
    far = base.model_copy(update={"checksum": "y" * 32, "sum": (base.sum or 0) + 1.0})
    exact = compare_fingerprints({0: with_fps(0, [base]), 1: with_fps(1, [near])})
    loose = compare_fingerprints({0: with_fps(0, [base]), 1: with_fps(1, [near])}, atol=1e-5)
    still = compare_fingerprints({0: with_fps(0, [base]), 1: with_fps(1, [far])}, atol=1e-5)
    assert not exact.consistent and loose.consistent and not still.consistent


def test_dtensor_shards_are_compared_only_within_their_replica_group() -> None:
    base = captured()[0].fingerprints[0]

    def shard(tp: int, checksum: str) -> Fingerprint:
        return base.model_copy(
            update={
                "checksum": checksum,
                "dtensor": True,
                "placements": ["Replicate()", "Shard(dim=0)"],
                "shard_key": f"tp={tp}",
            }
        )

    # mesh (dp=2, tp=2): ranks 0,2 hold tp=0 and 1,3 hold tp=1; rank 3's copy is corrupted.
    ranks = {
        0: with_fps(0, [shard(0, "a" * 32)], world=4),
        1: with_fps(1, [shard(1, "b" * 32)], world=4),
        2: with_fps(2, [shard(0, "a" * 32)], world=4),
        3: with_fps(3, [shard(1, "c" * 32)], world=4),
    }
    report = compare_fingerprints(ranks)
    assert len(report.divergent) == 1
    d = report.divergent[0]
    assert d.replica_group == [1, 3] and d.ranks == [3] and d.reference_ranks == [1] and d.shard_key == "tp=1"


def test_shards_held_by_one_rank_each_are_not_compared() -> None:
    base = captured()[0].fingerprints[0]
    ranks = {
        r: with_fps(
            r, [base.model_copy(update={"checksum": str(r) * 32, "dtensor": True, "shard_key": f"dp={r}"})]
        )
        for r in (0, 1)
    }
    report = compare_fingerprints(ranks)
    assert report.consistent and report.compared == 0 and report.sharded_not_compared == 1
    assert "shards held by one rank" in report.summary


def test_partial_placements_are_flagged() -> None:
    base = (
        captured()[0]
        .fingerprints[0]
        .model_copy(update={"dtensor": True, "partial": True, "shard_key": "tp=0"})
    )
    report = compare_fingerprints({0: with_fps(0, [base]), 1: with_fps(1, [base])})
    assert report.partial == ["0.weight"]
    assert any("dtensor-partial" in (s.skill_section or "") for s in report.next_steps)


def test_nonfinite_keys_and_missing_grads() -> None:
    ok = Fingerprint(name="w", shape=[2], dtype="float32", numel=2, checksum="a" * 32, sum=2.0, abs_max=1.0)
    nan = ok.model_copy(update={"checksum": "n" * 32, "sum": float("nan"), "nan": 1})
    nograd = Fingerprint(name="g", kind="grad", shape=[], dtype="none", checksum="grad-is-None")
    grad = Fingerprint(
        name="g", kind="grad", shape=[2], dtype="float32", numel=2, checksum="g" * 32, sum=0.0, abs_max=0.0
    )
    extra = ok.model_copy(update={"name": "only0"})
    ranks = {
        0: with_fps(0, [ok, grad, extra], world=3),
        1: with_fps(1, [nan, nograd], world=3),
        2: with_fps(2, [ok, grad], world=3),
    }
    report = compare_fingerprints(ranks)
    by_name = {d.name: d for d in report.divergent}
    assert by_name["w"].ranks == [1] and by_name["w"].reason == "nonfinite"
    assert by_name["g"].ranks == [1] and by_name["g"].reason == "no_grad"
    assert [(n.name, n.rank, n.nan) for n in report.nonfinite] == [("w", 1, 1)]
    assert [(k.name, k.present_on, k.missing_on) for k in report.missing_keys] == [("only0", [0], [1, 2])]
    sections = [s.skill_section for s in report.next_steps]
    assert (
        "skill/wrong-results.md#nan-on-one-rank" in sections
        and "skill/wrong-results.md#unused-parameters" in sections
    )


def test_files_from_two_jobs_and_world_sizes_are_problems() -> None:
    ranks = captured()
    ranks[1] = ranks[1].model_copy(update={"job_id": "127.0.0.1:1", "world_size": 4})
    report = compare_fingerprints(ranks)
    assert not report.consistent
    assert any("different jobs" in p for p in report.problems)
    assert any("different world sizes" in p for p in report.problems)
    assert any("no fingerprints for ranks [3]" in p for p in report.problems)


def test_same_input_same_report() -> None:
    a = compare_fingerprints(captured()).model_dump_json()
    b = compare_fingerprints(dict(reversed(list(captured().items())))).model_dump_json()
    assert a == b


def test_every_emitted_skill_section_resolves_to_a_heading() -> None:
    root = ROOT
    playbook = (root / "skill" / "wrong-results.md").read_text(encoding="utf-8")
    have = {
        re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        for m in re.finditer(r"^#{1,6}\s+(.*)$", playbook, flags=re.MULTILINE)
    }
    emitted: set[str] = set()
    for module in ("analysis/consistency.py", "capabilities/consistency.py"):
        source = (root / "tools" / "rankscope" / module).read_text()
        emitted |= set(re.findall(r"(?:wrong-results\.md|\{pb\})#([a-z-]+)", source))
    assert {"missing-broadcast", "batchnorm", "nan-on-one-rank", "offline"} <= emitted
    assert emitted <= have, f"sections emitted but missing from skill/wrong-results.md: {emitted - have}"
