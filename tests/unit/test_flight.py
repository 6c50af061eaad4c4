"""Flight recorder: real gloo hangs dumped through the probe, NCCL-layout dumps, bad files.

The pure tests; the ones that start processes are in tests/integration/test_flight.py.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import anyio
import pytest

from rankscope import api
from rankscope.analysis.recorder.flight import LoadedDump, analyze
from rankscope.capabilities.recorder.flight import analyze_flight_recorder
from rankscope.cli import main as cli_main
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, StacksReport, Verdict
from rankscope.models.flight import FlightReport
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "flight"
GPU_STUCK = DATA_ROOT / "postmortem" / "gpu_stuck" / "fr"


def _stacks_report(kind: str, suspects: list[int]) -> StacksReport:
    return StacksReport(
        job=Job(job_id="j", world_size=4),
        verdict=Verdict(kind=kind, suspect_ranks=suspects, summary=f"live: {kind}"),  # type: ignore[arg-type]
    )


def _event(
    seq: int, op: str = "nccl:all_reduce", state: str = "completed", **kw: object
) -> dict[str, object]:
    e: dict[str, object] = {
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": op,
        "input_sizes": [[8]],
        "output_sizes": [[8]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "state": state,
        "retired": state == "completed",
        "is_p2p": False,
        "time_created_ns": seq,
        "frames": [{"name": "step", "filename": "/job/train.py", "line": 10 + seq}],
    }
    e.update(kw)
    return e


def _dumps(per_rank: dict[int, list[dict[str, object]]], world: int) -> list[LoadedDump]:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))}}
    return [
        LoadedDump(
            path=f"r{r}", rank=r, format="pickle", data={"version": "2.10", "pg_config": cfg, "entries": es}
        )
        for r, es in per_rank.items()
    ]


def _p2p(
    seq: int, op: str, state: str = "scheduled", sizes: list[list[int]] | None = None
) -> dict[str, object]:
    """A send/recv as ProcessGroupNCCL records it: group ranks in the name, its own p2p_seq_id."""
    return _event(
        1,
        op=op,
        state=state,
        is_p2p=True,
        p2p_seq_id=seq,
        input_sizes=sizes or [[8]],
        output_sizes=sizes or [[8]],
        time_created_ns=100 + seq,
        frames=[{"name": "pipeline_step", "filename": "/job/pp.py", "line": 40 + seq}],
    )


def test_gloo_skip_from_captured_dumps() -> None:
    report = analyze_flight_recorder([str(DATA / "gloo_skip")])
    assert report.verdict.kind == "divergent_ranks"
    assert report.verdict.suspect_ranks == [1]
    assert "rank 1 never entered gloo:all_reduce #3" in report.verdict.summary
    progress = {p.rank: p for p in report.process_groups[0].progress}
    assert progress[0].pending_op == "gloo:all_reduce #3"
    assert progress[1].last_entered == 2 and progress[1].pending_op is None


def test_gloo_swap_uses_torchfrtrace_matcher() -> None:
    report = analyze_flight_recorder([str(DATA / "gloo_swap")])
    assert report.first_mismatch is not None
    assert report.first_mismatch.torchfrtrace is not None
    assert report.first_mismatch.torchfrtrace.startswith("COLLECTIVE_TYPE_MISMATCH")
    plain = analyze_flight_recorder([str(DATA / "gloo_swap")], use_torchfrtrace=False)
    assert plain.first_mismatch is not None and plain.first_mismatch.torchfrtrace is None
    assert plain.verdict.kind == report.verdict.kind == "mismatched_collectives"


def test_nccl_layout_dtype_mismatch_names_the_odd_rank() -> None:
    report = analyze_flight_recorder([str(DATA / "nccl_dtype")])
    assert report.world_size == 4 and report.missing_ranks == []
    assert report.verdict.kind == "mismatched_collectives"
    assert report.verdict.suspect_ranks == [2]
    m = report.first_mismatch
    assert m is not None and m.kind == "dtype_mismatch" and m.seq_id == 7
    odd = next(e for e in m.entries if e.rank == 2)
    assert odd.input_dtypes == ["BFloat16"] and odd.state == "started" and not odd.completed
    assert odd.call_site is not None and (odd.call_site.file, odd.call_site.line) == (
        "/home/alice/train.py",
        91,
    )
    assert report.dumps[0].repaired == []  # NCCL's pg_config needs no repair


def test_nccl_partial_rank_set_and_ring_buffer_window() -> None:
    report = analyze_flight_recorder([str(DATA / "nccl_partial")])
    assert report.ranks == [0, 1]
    assert report.missing_ranks == [2, 3]
    assert report.verdict.kind == "missing_ranks"
    assert report.verdict.suspect_ranks == [2, 3]
    pg = report.process_groups[0]
    assert (pg.aligned_from, pg.aligned_to) == (5, 10)  # rank 1's buffer no longer holds #3, #4


def test_json_dumps_and_single_files(tmp_path: Path) -> None:
    for r in (0, 1):
        data = pickle.loads((DATA / "gloo_skip" / f"fr_trace_rank_{r}").read_bytes())
        (tmp_path / f"trace_{r}.json").write_text(json.dumps(data))
    report = analyze_flight_recorder([str(tmp_path / "trace_0.json"), str(tmp_path / "trace_1.json")])
    assert [d.format for d in report.dumps] == ["json", "json"]
    assert report.verdict.kind == "divergent_ranks" and report.verdict.suspect_ranks == [1]


def test_corrupted_and_hostile_files_are_per_file_errors(tmp_path: Path) -> None:
    shutil.copytree(DATA / "nccl_dtype", tmp_path / "d")
    good = (tmp_path / "d" / "nccl_trace_rank_1").read_bytes()
    (tmp_path / "d" / "nccl_trace_rank_1").write_bytes(good[: len(good) // 2])  # died while writing

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (tmp_path / "d" / "nccl_trace_rank_3").write_bytes(pickle.dumps({"entries": [], "x": Boom()}))
    report = analyze_flight_recorder([str(tmp_path / "d")])
    assert not (tmp_path / "pwned").exists(), "a dump must never run code"
    assert sorted(e.rank for e in report.errors if e.rank is not None) == [1, 3]
    assert all(e.kind == "corrupt_dump" and e.fix for e in report.errors)
    assert any("refusing to load" in e.message for e in report.errors)
    assert report.ranks == [0, 2] and report.missing_ranks == [1, 3]
    # the two readable ranks still disagree on #7's dtype
    assert report.verdict.kind == "mismatched_collectives"
    assert "no readable dump for ranks 1,3" in report.verdict.evidence


def test_nothing_readable_is_inconclusive(tmp_path: Path) -> None:
    (tmp_path / "fr_trace_rank_0").write_bytes(b"garbage")
    (tmp_path / "notes").write_text("{}")
    report = analyze_flight_recorder([str(tmp_path)])
    assert report.verdict.kind == "inconclusive"
    kinds = sorted(e.kind for e in report.errors)
    assert kinds == ["bad_name", "corrupt_dump"]


def test_bad_paths_raise_with_fix(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as exc:
        analyze_flight_recorder([str(tmp_path / "nope")])
    assert "TORCH_FR_DUMP_TEMP_FILE" in exc.value.fix
    with pytest.raises(InvalidInput):
        analyze_flight_recorder([str(tmp_path)])  # empty directory
    (tmp_path / "stacks.json").write_text("{}")
    with pytest.raises(InvalidInput) as exc2:
        analyze_flight_recorder([str(DATA / "gloo_skip")], stacks_report=str(tmp_path / "stacks.json"))
    assert "rankscope stacks --json" in exc2.value.fix


def test_merge_with_live_stacks(tmp_path: Path) -> None:
    live = tmp_path / "live.json"
    live.write_text(_stacks_report("divergent_ranks", [3]).model_dump_json())
    # the recorder alone says missing ranks 2,3 ... the live stacks are more specific
    merged = analyze_flight_recorder([str(DATA / "nccl_partial")], stacks_report=str(live))
    assert merged.stacks_verdict is not None and merged.stacks_verdict.kind == "divergent_ranks"
    assert merged.verdict.kind == "missing_ranks"  # both specific: the recorder's answer stays
    live.write_text(_stacks_report("mismatched_collectives", [2]).model_dump_json())
    agree = analyze_flight_recorder([str(DATA / "nccl_dtype")], stacks_report=str(live))
    assert any("agree on rank 2" in e for e in agree.verdict.evidence)
    # the recorder saw nothing specific (all completed): the live verdict takes over
    done = tmp_path / "done"
    done.mkdir()
    for r in (0, 1):
        data = pickle.loads((DATA / "gloo_skip" / f"fr_trace_rank_{r}").read_bytes())
        data["entries"] = data["entries"][:2]
        (done / f"fr_trace_rank_{r}").write_bytes(pickle.dumps(data))
    live.write_text(_stacks_report("divergent_ranks", [1]).model_dump_json())
    taken = analyze_flight_recorder([str(done)], stacks_report=str(live))
    assert taken.verdict.kind == "divergent_ranks" and taken.verdict.suspect_ranks == [1]
    assert "from live stacks" in taken.verdict.summary


def test_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli_main(["fr", str(DATA / "nccl_dtype"), "--json"])
    assert rc == 0
    report = FlightReport.model_validate_json(buf.getvalue())
    assert report.verdict.suspect_ranks == [2]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main(["fr", str(DATA / "gloo_swap")]) == 0
    text = buf.getvalue()
    assert "Verdict: mismatched_collectives  suspects: 1" in text
    assert "recorded stack of rank 1" in text
    assert cli_main(["fr", "/nonexistent/dumps"]) == 2
    assert "Fix:" in capsys.readouterr().err


def test_api_and_mcp_tool() -> None:
    from rankscope.mcp_tools.flight import analyze_flight_recorder as tool

    assert api.analyze_flight_recorder is analyze_flight_recorder
    report = anyio.run(lambda: tool([str(DATA / "gloo_shape")]))
    assert isinstance(report, FlightReport)
    assert report.first_mismatch is not None and report.first_mismatch.kind == "size_mismatch"


def test_enable_flight_recorder_rejects_bad_buffer(tmp_path: Path) -> None:
    from rankscope.probe.flight import enable_flight_recorder

    with pytest.raises(InvalidInput):
        enable_flight_recorder(str(tmp_path), buffer_size=0)


def test_extra_collective_on_one_rank_blames_that_rank() -> None:
    done = [_event(1), _event(2)]
    per_rank = {0: [*done, _event(3, state="started")], 1: done, 2: done, 3: done}
    report = analyze(_dumps(per_rank, 4))
    assert report.verdict.kind == "divergent_ranks"
    assert report.verdict.suspect_ranks == [0]
    assert "called a collective the others did not" in report.verdict.summary


def test_everyone_waits_in_the_same_collective() -> None:
    per_rank = {r: [_event(1), _event(2, state="started")] for r in range(3)}
    report = analyze(_dumps(per_rank, 3))
    assert report.verdict.kind == "all_in_same_collective"
    assert "nccl:all_reduce #2" in report.verdict.summary


def test_all_completed_is_no_collective_and_unpaired_p2p_is_noted() -> None:
    done = _event(0, op="nccl:send 0->1", is_p2p=True, p2p_seq_id=1)
    coalesced = _event(0, op="nccl:coalesced", is_p2p=True, p2p_seq_id=2)
    per_rank = {0: [_event(1), done, coalesced], 1: [_event(1), _event(0, op="nccl:recv 1<-0", is_p2p=True)]}
    report = analyze(_dumps(per_rank, 2))
    assert report.verdict.kind == "no_collective"
    assert report.process_groups[0].p2p_mismatch is None
    assert any("nccl:coalesced" in n and "not paired" in n for n in report.notes)


def test_pipeline_ranks_that_both_receive_first_are_a_deadlock() -> None:
    per_rank = {0: [_event(1), _p2p(1, "nccl:recv 0<-1")], 1: [_event(1), _p2p(1, "nccl:recv 1<-0")]}
    report = analyze(_dumps(per_rank, 2))
    m = report.first_mismatch
    assert m is not None and m.is_p2p and m.kind == "p2p_deadlock"
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [0, 1]
    assert "0 receives from 1, 1 receives from 0" in report.verdict.summary
    progress = {p.rank: p for p in report.process_groups[0].progress}
    assert progress[0].pending_p2p == "nccl:recv 0<-1 #1" and progress[0].pending_op is None


def test_send_whose_peer_never_posts_the_recv_blames_the_peer() -> None:
    per_rank = {0: [_event(1), _p2p(1, "nccl:send 0->1")], 1: [_event(1)]}
    report = analyze(_dumps(per_rank, 2))
    m = report.first_mismatch
    assert m is not None and m.kind == "p2p_unmatched" and m.suspect_ranks == [1]
    assert report.verdict.kind == "divergent_ranks" and report.verdict.suspect_ranks == [1]
    assert report.verdict.summary.startswith(
        "rank 0 sends to rank 1 (nccl:send 0->1 #1 of group 0 at /job/pp.py:41"
    )
    assert (
        "rank 1 has no send, recv or collective pending: rank 1 never posted the matching recv"
        in m.description
    )


def test_recv_whose_peer_sends_elsewhere_names_the_wrong_peer() -> None:
    per_rank = {
        0: [_event(1), _p2p(1, "nccl:recv 0<-1")],
        1: [_event(1), _p2p(1, "nccl:send 1->2")],
        2: [_event(1), _p2p(1, "nccl:recv 2<-1")],
    }
    report = analyze(_dumps(per_rank, 3))
    m = report.first_mismatch
    assert m is not None and m.kind == "p2p_wrong_peer" and m.suspect_ranks == [1]
    assert "but rank 1 sends to rank 2" in m.description
    assert report.verdict.kind == "mismatched_collectives"


def test_p2p_pair_with_different_sizes_and_a_matched_pair() -> None:
    bad = {
        0: [_event(1), _p2p(1, "nccl:send 0->1", sizes=[[8]])],
        1: [_event(1), _p2p(1, "nccl:recv 1<-0", sizes=[[4]])],
    }
    report = analyze(_dumps(bad, 2))
    m = report.first_mismatch
    assert m is not None and m.is_p2p and m.kind == "size_mismatch" and m.suspect_ranks == [0, 1]
    assert "with sizes [[8]]" in m.description and "with sizes [[4]]" in m.description
    # the same sizes: a pair in flight, so the cause is elsewhere (the transport)
    good = {0: [_event(1), _p2p(1, "nccl:send 0->1")], 1: [_event(1), _p2p(1, "nccl:recv 1<-0")]}
    report = analyze(_dumps(good, 2))
    assert report.first_mismatch is None
    assert report.verdict.kind == "all_in_same_collective"
    assert "nccl:send 0->1 #1" in report.verdict.summary and "nccl:recv 1<-0 #1" in report.verdict.summary


def test_p2p_peers_of_a_subgroup_are_mapped_to_global_ranks() -> None:
    sub = ("5", "pp_stage")
    cfg = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
        "5": {"name": "5", "desc": "pp_stage", "ranks": "[2, 3]"},
    }
    per_rank = {
        0: [_event(1)],
        1: [_event(1)],
        2: [_event(1), {**_p2p(1, "nccl:recv 0<-1"), "process_group": sub, "pg_id": 5}],
        3: [_event(1), {**_p2p(1, "nccl:recv 1<-0"), "process_group": sub, "pg_id": 5}],
    }
    dumps = [
        LoadedDump(
            path=f"r{r}", rank=r, format="pickle", data={"version": "2.10", "pg_config": cfg, "entries": es}
        )
        for r, es in per_rank.items()
    ]
    report = analyze(dumps)
    m = report.first_mismatch
    assert m is not None and m.kind == "p2p_deadlock" and m.process_group == "5"
    assert m.suspect_ranks == [2, 3] and "2 receives from 3, 3 receives from 2" in m.description


def test_duplicate_rank_files_keep_one() -> None:
    dumps = _dumps({0: [_event(1)], 1: [_event(1)]}, 2)
    dumps.append(LoadedDump(path="r1-again", rank=1, format="json", data=dumps[1].data))
    report = analyze(dumps)
    assert report.ranks == [0, 1] and any("two dumps for rank 1" in n for n in report.notes)


def test_a_rank_stuck_in_a_recv_before_a_collective_gets_both_stories() -> None:
    # rank 1 went on to all_reduce #2 without sending; rank 0 still waits for its data
    per_rank = {0: [_event(1), _p2p(1, "nccl:recv 0<-1")], 1: [_event(1), _event(2, state="scheduled")]}
    report = analyze(_dumps(per_rank, 2))
    assert report.verdict.kind == "divergent_ranks"  # the recorder's first disagreement: all_reduce #2
    assert any(
        e.startswith("also: rank 0 receives from rank 1") and "rank 1 waits in nccl:all_reduce #2" in e
        for e in report.verdict.evidence
    )


def test_real_gpu_stuck_dumps_name_the_rank_whose_gpu_never_started_the_collective() -> None:
    """Real H200 dumps (TORCH_NCCL_ENABLE_TIMING=1): rank 0's GPU ran an endless kernel before
    all_reduce #21, so its #21 is 'scheduled' while ranks 1-3 have it 'started'."""
    r = analyze_flight_recorder([str(GPU_STUCK)], use_torchfrtrace=False)
    assert r.verdict.kind == "divergent_ranks" and r.verdict.suspect_ranks == [0]
    assert "rank 0's GPU never started nccl:all_reduce #21" in r.verdict.summary
    assert "busy with earlier work" in r.verdict.summary
    assert "rank 0: nccl:all_reduce #21 state=scheduled" in r.verdict.evidence


def test_without_timing_every_pending_entry_is_scheduled_and_no_gpu_is_blamed(tmp_path: Path) -> None:
    for rank in range(4):
        data = pickle.loads((GPU_STUCK / f"s3_rank_{rank}").read_bytes())
        for e in data["entries"]:
            if e["state"] == "started":
                e["state"] = "scheduled"
        (tmp_path / f"s3_rank_{rank}").write_bytes(pickle.dumps(data))
    r = analyze_flight_recorder([str(tmp_path)], use_torchfrtrace=False)
    assert r.verdict.kind == "all_in_same_collective" and r.verdict.suspect_ranks == []


def test_a_skipped_step_is_told_as_counts_per_op_and_shape() -> None:
    """Rank 1 skipped one step of 4 all_reduces, so its final barrier meets the others' all_reduce."""
    r = analyze_flight_recorder([str(DATA / "nccl_skip_step")], use_torchfrtrace=False)
    assert r.verdict.kind == "mismatched_collectives" and r.verdict.suspect_ranks == [1]
    story = r.verdict.evidence[-1]
    assert story.startswith("rank 1 recorded 4 fewer nccl:all_reduce (")
    assert "in=[[65536]]" in story and "in=[[1]]" in story
    assert "one step's worth (the recorded pattern repeats every 4 collectives)" in story
    assert story in r.verdict.summary
