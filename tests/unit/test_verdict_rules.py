"""Each hang rule on hand-built facts (tests/verdict_builders.py): it fires where it should, with
its kind, suspects and confidence, and declines on the nearest case it must leave to another
rule. Tests are named ``test_<rule>_...``; the last test checks that every rule of the tables
has one. The words are in analysis/hang/verdict_texts.py; these tests read them only where a rule
chooses between them.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from rankscope.analysis.hang import verdict_mismatch, verdict_nccl, verdict_rules
from rankscope.analysis.hang.verdict import decide, verdict
from rankscope.analysis.hang.verdict_facts import Ruling
from rankscope.analysis.hang.verdict_rules import (
    GLOO_RULES,
    LAST_RULE,
    NCCL_RULES,
    Rule,
    rule_all_in_same,
    rule_counters,
    rule_divergent,
    rule_for,
    rule_missing,
    rule_no_collective,
    rule_nothing_captured,
    rule_stopped,
    tie_all_in_same,
    tie_cannot_tell,
    tie_lone_collective,
    tie_mismatched,
    tie_no_collective,
)
from rankscope.analysis.hang.verdict_texts import SAY, STEPS, Step
from rankscope.analysis.recorder.flight import NATIVE_STACK_STEP
from rankscope.models.core import (
    Frame,
    GroupLocals,
    NextStep,
    RankError,
    RankStack,
    ThreadStack,
    Verdict,
    WaitKind,
)
from rankscope.models.flight import FlightReport, FrMismatch
from rankscope.models.ras import RasFinding
from tests.verdict_builders import JOB_FILE, counters, facts_of, rank, ranks, source

rule_flight_recorder = verdict_nccl.rule_flight_recorder
rule_ras = verdict_nccl.rule_ras
rule_nccl_rank_elsewhere = verdict_nccl.rule_nccl_rank_elsewhere
rule_nccl_library_call = verdict_nccl.rule_nccl_library_call
rule_gpu_idle = verdict_nccl.rule_gpu_idle
rule_nccl_lone_collective = verdict_nccl.rule_nccl_lone_collective
rule_nccl_cannot_tell = verdict_nccl.rule_nccl_cannot_tell
rule_mismatched = verdict_mismatch.rule_mismatched


def shape(ruling: Ruling | None) -> tuple[str, list[int], str] | None:
    """What a rule decided: kind, suspects, confidence."""
    return None if ruling is None else (ruling.kind, ruling.suspects, ruling.confidence)


def keys(ruling: Ruling) -> list[str]:
    """The ruling's own next steps, by key."""
    return [s.key for s in ruling.steps if isinstance(s, Step)]


def lone_barrier(*, unsure: bool = False) -> list[RankStack]:
    """NCCL: rank 0 inside a barrier no one else is in, ranks 1-3 past it, waiting for the GPU."""
    past: WaitKind = "maybe_gpu" if unsure else "gpu"
    return [rank(0, "barrier", line=30), *(rank(r, line=12, wait=past) for r in (1, 2, 3))]


def even_split() -> list[RankStack]:
    """Ranks 0-1 in an all_reduce at line 10, ranks 2-3 in a barrier at line 20."""
    return [
        rank(0, "all_reduce"),
        rank(1, "all_reduce"),
        rank(2, "barrier", line=20),
        rank(3, "barrier", line=20),
    ]


# -- rules of both tables ------------------------------------------------------------------------


def test_rule_nothing_captured_names_no_one_and_counts_the_capture_errors() -> None:
    error = RankError(rank=0, pid=100, kind="ptrace_denied", message="no")
    f = facts_of(ranks(2, stack=False), errors=[error])
    ruling = rule_nothing_captured(f)
    assert shape(ruling) == ("inconclusive", [], "low")
    assert ruling is not None and ruling.summary.endswith("(1 capture error(s): ptrace_denied)")
    assert keys(ruling) == ["fix_capture", "job_alive", "logs_if_dead"]
    assert rule_nothing_captured(facts_of([rank(0), rank(1, stack=False)])) is None


def test_rule_counters_decides_on_a_clear_split_only() -> None:
    stacks = ranks(4, "all_reduce")
    ruling = rule_counters(facts_of(counters(stacks, {0: 10, 1: 10, 2: 3, 3: 10})))
    assert shape(ruling) == ("divergent_ranks", [2], "high")
    weak = counters(stacks, {0: 10, 1: 10, 2: 3, 3: 10}, name="tokens")  # not a known counter
    assert rule_counters(facts_of(weak)) is None


def test_rule_divergent_names_the_ranks_in_no_collective() -> None:
    stacks = [rank(0, "all_reduce"), rank(1, "all_reduce"), rank(2, line=40)]
    ruling = rule_divergent(facts_of(stacks))
    assert shape(ruling) == ("divergent_ranks", [2], "high")
    assert ruling is not None and keys(ruling) == [
        "read_divergent_sites",
        "dump_native_locals_divergent",
        "repro_divergent",
    ]
    # a stopped rank is a suspect too, and the first step is to find out why it stopped
    stopped = rule_divergent(facts_of([*stacks[:2], rank(2, state="stopped")]))
    assert stopped is not None and shape(stopped) == ("divergent_ranks", [2], "high")
    assert keys(stopped)[0] == "resume_stuck"
    # on NCCL, less sure; with the backend unknown, a rank in C code under its own line may wait for a GPU
    assert shape(rule_divergent(facts_of(stacks, backend="nccl"))) == ("divergent_ranks", [2], "medium")
    assert shape(rule_divergent(facts_of(stacks, backend=None))) == ("divergent_ranks", [2], "medium")
    assert rule_divergent(facts_of(ranks(3, "all_reduce"))) is None


def test_rule_missing_blames_exited_ranks_not_ranks_on_another_host() -> None:
    here = ranks(3, "all_reduce")
    exited = rule_missing(facts_of(here, world_size=4, missing=[3], exited=[3]))
    assert shape(exited) == ("missing_ranks", [3], "high")
    elsewhere = rule_missing(facts_of(here, world_size=4, missing=[3]))
    assert elsewhere is not None and shape(elsewhere) == ("missing_ranks", [], "low")
    assert keys(elsewhere)[0] == "collect_other_hosts"
    # on a loopback MASTER_ADDR every rank runs here: a rank not found is a suspect
    loopback = rule_missing(facts_of(here, world_size=4, missing=[3], master_addr="127.0.0.1"))
    assert shape(loopback) == ("missing_ranks", [3], "medium")
    merged = rule_missing(facts_of(here, world_size=4, missing=[3], hosts=["a", "b"]))
    assert shape(merged) == ("missing_ranks", [3], "medium")
    assert rule_missing(facts_of(here)) is None


def test_rule_all_in_same_says_the_ranks_agree() -> None:
    gloo = rule_all_in_same(facts_of(ranks(3, "all_reduce")))
    assert shape(gloo) == ("all_in_same_collective", [], "low")
    assert gloo is not None and "recorder_not_completed" not in keys(gloo)  # no NCCL recorder on gloo
    # on NCCL one line is not one collective: the CPU side cannot tell
    assert shape(rule_all_in_same(facts_of(ranks(3, "all_reduce"), backend="nccl"))) == (
        "inconclusive",
        [],
        "low",
    )
    # every rank in a recv: no one sends; a cycle of known peers is sure
    recv = rule_all_in_same(facts_of(ranks(2, "recv")))
    assert shape(recv) == ("all_in_same_collective", [], "medium")
    ring = [rank(r, "recv", peer=(r - 1) % 3) for r in range(3)]
    assert shape(rule_all_in_same(facts_of(ring))) == ("all_in_same_collective", [], "high")
    assert rule_all_in_same(facts_of([*ranks(2, "all_reduce"), rank(2, line=40)])) is None


def test_rule_stopped_when_no_rank_runs() -> None:
    ruling = rule_stopped(facts_of(ranks(2, state="stopped")))
    assert shape(ruling) == ("no_collective", [0, 1], "high")
    assert rule_stopped(facts_of([rank(0, state="stopped"), rank(1)])) is None


def test_rule_no_collective_is_the_last_word_of_both_tables() -> None:
    f = facts_of(ranks(2, line=40))
    assert shape(rule_no_collective(f)) == ("no_collective", [], "low")
    assert LAST_RULE is rule_no_collective
    assert all(rule(f) is None for rule in GLOO_RULES)
    assert shape(rule_for(f)) == ("no_collective", [], "low")


# -- NCCL rules ----------------------------------------------------------------------------------


def _recorder(suspects: list[int], *, mismatch: bool) -> FlightReport:
    first = (
        FrMismatch(process_group="0", seq_id=7, kind="not_entered", suspect_ranks=suspects, description="-")
        if mismatch
        else None
    )
    steps = [
        NextStep(action="Open the call site.", skill_section="skill/x.md"),
        NATIVE_STACK_STEP.model_copy(),
    ]
    said = Verdict(
        kind="divergent_ranks", suspect_ranks=suspects, summary="rank 2 never entered #7", next_steps=steps
    )
    return FlightReport(verdict=said, first_mismatch=first)


def test_rule_flight_recorder_decides_on_nccl_and_its_native_step_keeps_native_frames() -> None:
    gpu = ranks(4, wait="gpu")
    ruling = rule_flight_recorder(facts_of(gpu, backend="nccl", flight=_recorder([2], mismatch=True)))
    assert shape(ruling) == ("mismatched_collectives", [2], "high")
    assert ruling is not None
    steps = verdict(ruling).next_steps
    assert steps[0].args is None and steps[1].args == {"native": True, "full_ranks": [2]}
    no_mismatch = rule_flight_recorder(facts_of(gpu, backend="nccl", flight=_recorder([2], mismatch=False)))
    assert shape(no_mismatch) == ("divergent_ranks", [2], "high")
    # on gloo the CPU positions decide; a recorder that names no one decides nothing
    assert (
        rule_flight_recorder(facts_of(ranks(4, "all_reduce"), flight=_recorder([2], mismatch=True))) is None
    )
    assert rule_flight_recorder(facts_of(gpu, backend="nccl", flight=_recorder([], mismatch=False))) is None


def test_rule_ras_decides_on_nccl_by_launch_counts() -> None:
    gpu = ranks(4, wait="gpu")
    behind = RasFinding(
        kind="off_count", suspect_ranks=[3], confidence="high", summary="NCCL RAS: rank 3 behind"
    )
    assert shape(rule_ras(facts_of(gpu, backend="nccl", ras=behind))) == ("divergent_ranks", [3], "high")
    lost = behind.model_copy(update={"kind": "lost"})
    assert shape(rule_ras(facts_of(gpu, backend="nccl", ras=lost))) == ("missing_ranks", [3], "high")
    agree = RasFinding(kind="agree", summary="NCCL RAS: every rank launched 12", progressing=False)
    assert shape(rule_ras(facts_of(gpu, backend="nccl", ras=agree))) == (
        "all_in_same_collective",
        [],
        "medium",
    )
    moving = agree.model_copy(update={"progressing": True})
    assert rule_ras(facts_of(gpu, backend="nccl", ras=moving)) is None
    assert rule_ras(facts_of(ranks(4, "all_reduce"), ras=behind)) is None


def test_rule_nccl_rank_elsewhere_names_the_rank_that_waits_for_neither() -> None:
    stacks = [*ranks(3, wait="gpu"), rank(3, line=50)]
    stacks[0] = stacks[0].model_copy(
        update={"wait_evidence": "native frame cudaStreamSynchronize (a GPU sync)"}
    )
    ruling = rule_nccl_rank_elsewhere(facts_of(stacks, backend="nccl"))
    assert shape(ruling) == ("divergent_ranks", [3], "high")
    inferred = [s.model_copy(update={"wait_evidence": "inferred: `loss.item()` ..."}) for s in stacks[:3]]
    assert shape(rule_nccl_rank_elsewhere(facts_of([*inferred, stacks[3]], backend="nccl"))) == (
        "divergent_ranks",
        [3],
        "medium",
    )
    assert rule_nccl_rank_elsewhere(facts_of(ranks(4, wait="gpu"), backend="nccl")) is None


def test_rule_nccl_library_call_names_the_rank_alone_inside_a_collective_library_call() -> None:
    """Rank 0's CPU waits inside ZeRO's consolidate_state_dict (at a GPU wait, no c10d frame); the others
    went on and wait for the GPU: rank 0 made the call alone. High with the rank condition above it."""
    zero = "/venv/lib/python3.11/site-packages/torch/distributed/optim/zero_redundancy_optimizer.py"
    frames = [
        Frame(function="_broadcast_object", file=zero, line=112),
        Frame(function="ZeroRedundancyOptimizer.consolidate_state_dict", file=zero, line=564),
        Frame(function="main", file=JOB_FILE, line=21),
    ]
    inside = rank(0, line=21)
    inside = inside.model_copy(update={"threads": [ThreadStack(thread_id=1, is_main=True, frames=frames)]})
    stacks = [inside, *(rank(r, line=12, wait="gpu") for r in (1, 2, 3))]
    lines = source({20: "    if rank == 0:", 21: "        optim.consolidate_state_dict(to=0)"})
    ruling = rule_nccl_library_call(facts_of(stacks, backend="nccl", lines=lines))
    assert shape(ruling) == ("mismatched_collectives", [0], "high")
    assert ruling is not None and ruling.summary.startswith(
        "rank 0 alone called ZeroRedundancyOptimizer.consolidate_state_dict (train.py:21: "
    )
    assert shape(rule_nccl_library_call(facts_of(stacks, backend="nccl"))) == (
        "mismatched_collectives",
        [0],
        "medium",
    )
    on_gloo = [inside, *(rank(r, "all_reduce", line=12) for r in (1, 2, 3))]
    assert (
        rule_nccl_library_call(facts_of(on_gloo, backend="gloo", lines=lines)) is None
    )  # the gloo rules decide
    assert rule_nccl_library_call(facts_of(ranks(4, wait="gpu"), backend="nccl")) is None


def test_rule_gpu_idle_names_the_idle_gpus() -> None:
    stacks = [rank(r, line=12, gpu_util=0 if r == 3 else 100) for r in range(4)]
    assert shape(rule_gpu_idle(facts_of(stacks, backend="nccl"))) == ("divergent_ranks", [3], "medium")
    assert rule_gpu_idle(facts_of(stacks)) is None  # gloo: no GPU to spin
    even = [s.model_copy(update={"gpu_util": 0 if s.rank in (2, 3) else 100}) for s in stacks]
    assert rule_gpu_idle(facts_of(even, backend="nccl")) is None


def test_rule_nccl_lone_collective_names_the_few_in_a_collective_the_others_ran_past() -> None:
    ruling = rule_nccl_lone_collective(facts_of(lone_barrier(), backend="nccl"))
    assert shape(ruling) == ("mismatched_collectives", [0], "medium")
    unsure = rule_nccl_lone_collective(facts_of(lone_barrier(unsure=True), backend="nccl"))
    assert shape(unsure) == ("mismatched_collectives", [0], "low")
    half = [
        rank(0, "barrier"),
        rank(1, "barrier"),
        rank(2, line=12, wait="gpu"),
        rank(3, line=12, wait="gpu"),
    ]
    assert rule_nccl_lone_collective(facts_of(half, backend="nccl")) is None  # no majority ran past


def test_rule_nccl_cannot_tell_when_every_cpu_waits_for_the_gpu() -> None:
    ruling = rule_nccl_cannot_tell(facts_of(ranks(4, wait="gpu"), backend="nccl"))
    assert shape(ruling) == ("inconclusive", [], "low")
    assert ruling is not None and keys(ruling) == [
        "recorder_howto",
        "dump_locals_counters",
        "logs_watchdog_seq",
        "ask_ras",
    ]
    own = rule_nccl_cannot_tell(
        facts_of(ranks(4, wait="gpu"), backend="nccl", recorder="dump at /d/fr_<rank>")
    )
    assert own is not None and keys(own)[0] == "recorder_of_job"
    assert rule_nccl_cannot_tell(facts_of([*ranks(3, wait="gpu"), rank(3, line=50)], backend="nccl")) is None


# -- the mismatched-collectives rule -------------------------------------------------------------


def test_rule_mismatched_names_the_minority() -> None:
    stacks = [rank(0, "all_reduce"), rank(1, "all_reduce"), rank(2, "barrier", line=20)]
    ruling = rule_mismatched(facts_of(stacks))
    assert shape(ruling) == ("mismatched_collectives", [2], "high")
    assert ruling is not None and keys(ruling) == ["open_mismatch_site", "repro_mismatch"]
    on_nccl = rule_mismatched(facts_of(stacks, backend="nccl"))
    assert on_nccl is not None and "recorder_mismatch_seq" in keys(on_nccl)
    assert rule_mismatched(facts_of(ranks(3, "all_reduce"))) is None


def test_rule_mismatched_even_split_names_everyone_unless_a_rank_condition_decides() -> None:
    assert shape(rule_mismatched(facts_of(even_split()))) == ("mismatched_collectives", [0, 1, 2, 3], "low")
    guarded = source(
        {10: "    dist.all_reduce(t)", 18: "if rank >= 2:", 19: "    x = 1", 20: "    dist.barrier()"}
    )
    assert shape(rule_mismatched(facts_of(even_split(), lines=guarded))) == (
        "mismatched_collectives",
        [2, 3],
        "medium",
    )


def test_rule_mismatched_under_a_condition_gives_the_fix_with_its_lines() -> None:
    """A rank condition above the minority's collective dictates the fix; the step quotes it and both
    lines, so the agent need not open the file. A data condition asks for agreement instead."""
    stacks = [rank(0, "all_reduce"), rank(1, "all_reduce"), rank(2, "barrier", line=20)]
    by_rank = source({10: "    dist.all_reduce(t)", 19: "if rank == 2:  # save", 20: "    dist.barrier()"})
    ruling = rule_mismatched(facts_of(stacks, lines=by_rank))
    assert ruling is not None and keys(ruling) == ["fix_rank_guard", "repro_mismatch"]
    fields = ruling.steps[0].fields  # type: ignore[union-attr]
    assert fields["cond"] == "rank == 2" and fields["op"] == "barrier"
    assert fields["site"].endswith(":20") and fields["guard_at"].endswith(":19")
    by_data = source({10: "    dist.all_reduce(t)", 19: "if torch.isfinite(loss):", 20: "    dist.barrier()"})
    on_data = rule_mismatched(facts_of(stacks, lines=by_data))
    assert on_data is not None and keys(on_data)[0] == "fix_data_guard"
    # a condition above the majority's call does not dictate a fix for the minority
    majority = source(
        {9: "if rank < 2:", 10: "    dist.all_reduce(t)", 12: "def save():", 20: "    dist.barrier()"}
    )
    plain = rule_mismatched(facts_of(stacks, lines=majority))
    assert plain is not None and keys(plain)[0] == "open_mismatch_site"


def test_rule_mismatched_on_a_subgroup_names_the_member_that_went_on() -> None:
    base = [rank(0, "all_reduce", subgroup=False), rank(1, "all_reduce", subgroup=False)]
    waiting = rank(2, "barrier", line=20, subgroup=True)
    unnamed = rule_mismatched(facts_of([*base, waiting]))
    assert unnamed is not None and shape(unnamed) == ("mismatched_collectives", [], "low")
    assert keys(unnamed)[0] == "find_group_members"
    members = GroupLocals(ranks=[1, 2], ranks_from="train.py:main:pair")
    named = rule_mismatched(facts_of([*base, waiting.model_copy(update={"group_locals": members})]))
    assert named is not None and shape(named) == ("mismatched_collectives", [1], "medium")
    assert keys(named)[0] == "open_group_loop"
    # the recorder names the member that never entered the group's collective; dumps that did not
    # come name no one (here the rank left waiting would be blamed: it is live, its stack is here)
    recorded = rule_mismatched(facts_of([*base, waiting], flight=_recorder([1], mismatch=True)))
    assert recorded is not None and shape(recorded) == ("mismatched_collectives", [1], "medium")
    no_dump = _recorder([2], mismatch=False).model_copy(
        update={"verdict": Verdict(kind="missing_ranks", suspect_ranks=[2], summary="rank 2 left no dump")}
    )
    assert shape(rule_mismatched(facts_of([*base, waiting], flight=no_dump))) == shape(unnamed)


# -- tie-breaks ----------------------------------------------------------------------------------


def test_tie_lone_collective_lets_weak_counters_decide_an_unsure_lone_collective() -> None:
    stacks = counters(lone_barrier(unsure=True), {0: 4, 1: 4, 2: 9, 3: 4}, name="tokens")
    ruling = tie_lone_collective(facts_of(stacks, backend="nccl"))
    assert shape(ruling) == ("mismatched_collectives", [2], "medium")
    assert ruling is not None and "; the progress counters decide: progress counters differ" in ruling.summary
    sure = counters(lone_barrier(), {0: 4, 1: 4, 2: 9, 3: 4}, name="tokens")
    assert tie_lone_collective(facts_of(sure, backend="nccl")) is None  # medium: no tie to break
    assert tie_lone_collective(facts_of(lone_barrier(unsure=True), backend="nccl")) is None  # no counters


def test_tie_mismatched_lets_weak_counters_decide_an_even_split() -> None:
    stacks = counters(even_split(), {0: 5, 1: 5, 2: 5, 3: 1}, name="tokens")
    ruling = tie_mismatched(facts_of(stacks))
    assert shape(ruling) == ("mismatched_collectives", [3], "medium")
    assert ruling is not None and "; the progress counters decide: " in ruling.summary
    majority = [rank(0, "all_reduce"), rank(1, "all_reduce"), rank(2, "barrier", line=20)]
    assert tie_mismatched(facts_of(counters(majority, {0: 5, 1: 5, 2: 1}, name="tokens"))) is None
    assert tie_mismatched(facts_of(even_split())) is None


def test_tie_cannot_tell_takes_weak_counters_as_the_only_lead_and_aims_the_calls_at_them() -> None:
    stacks = counters(ranks(4, wait="gpu"), {0: 7, 1: 7, 2: 7, 3: 2}, name="tokens")
    ruling = tie_cannot_tell(facts_of(stacks, backend="nccl"))
    assert shape(ruling) == ("divergent_ranks", [3], "low")
    assert ruling is not None and "; the only lead, weak: " in ruling.summary
    dump = next(s for s in verdict(ruling).next_steps if s.tool == "dump_stacks")
    assert dump.args == {"locals": True, "full_ranks": [3]}
    assert tie_cannot_tell(facts_of(ranks(4, wait="gpu"), backend="nccl")) is None


def test_tie_all_in_same_takes_weak_counters_as_the_only_lead() -> None:
    stacks = counters(ranks(3, "all_reduce"), {0: 7, 1: 7, 2: 2}, name="tokens")
    assert shape(tie_all_in_same(facts_of(stacks))) == ("divergent_ranks", [2], "low")
    # a send/recv deadlock is not an open answer: the counters do not override it
    recv = counters(ranks(3, "recv"), {0: 7, 1: 7, 2: 2}, name="tokens")
    assert tie_all_in_same(facts_of(recv)) is None


def test_tie_no_collective_takes_weak_counters_as_the_only_lead() -> None:
    stacks = counters(ranks(3, line=40), {0: 7, 1: 7, 2: 2}, name="tokens")
    assert shape(tie_no_collective(facts_of(stacks))) == ("divergent_ranks", [2], "low")
    assert tie_no_collective(facts_of(ranks(3, line=40))) is None


# -- the tables and the texts --------------------------------------------------------------------

TIES: dict[Rule, Rule] = {
    tie_lone_collective: rule_nccl_lone_collective,
    tie_mismatched: rule_mismatched,
    tie_cannot_tell: rule_nccl_cannot_tell,
    tie_all_in_same: rule_all_in_same,
}


def test_each_tie_break_sits_just_before_the_rule_it_breaks() -> None:
    for table in (NCCL_RULES, GLOO_RULES):
        for tie, broken in TIES.items():
            if broken in table:
                assert table.index(tie) == table.index(broken) - 1, (tie.__name__, broken.__name__)
        assert table[-1] is tie_no_collective  # it breaks the last word, which follows every table


def test_decide_gives_the_first_rule_that_matches_in_words() -> None:
    f = facts_of([rank(0, "all_reduce"), rank(1, "all_reduce"), rank(2, line=40)])
    said = decide(f)
    assert (said.kind, said.suspect_ranks, said.confidence) == ("divergent_ranks", [2], "high")
    native = next(s for s in said.next_steps if s.tool == "dump_stacks")
    assert native.args == {"native": True, "locals": True, "full_ranks": [2]}
    repro = next(s for s in said.next_steps if s.tool == "generate_repro")
    assert (
        repro.args == {"from_last_stacks": True} and repro.skill_section == "skill/hangs.md#divergent-ranks"
    )


def test_every_step_and_sentence_is_used_and_every_used_key_exists() -> None:
    """Every key of the texts is named by some rule or phrase (no text left behind), and every key
    a rule names through ``step``/``say`` is in the tables (else a KeyError at run time)."""
    named: set[str] = set()
    called: set[str] = set()
    for path in sorted(Path(inspect.getfile(verdict_rules)).parent.glob("verdict_*.py")):
        if path.name == "verdict_texts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named.add(node.value)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("step", "say") and node.args:
                if isinstance(node.args[0], ast.Constant):
                    called.add(str(node.args[0].value))
    texts = set(STEPS) | set(SAY)
    assert called <= texts, called - texts
    assert texts <= named, texts - named


def test_every_rule_of_the_tables_has_its_own_test() -> None:
    names = {n for n, obj in globals().items() if n.startswith("test_") and callable(obj)}
    for rule in {*NCCL_RULES, *GLOO_RULES, LAST_RULE}:
        assert any(n.startswith(f"test_{rule.__name__}_") for n in names), f"no test_{rule.__name__}_..."
