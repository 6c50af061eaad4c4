"""Log triage against fixture logs: GPU-only messages, captured gloo runs, error.json, garbage."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from rankscope.analysis.triage.logs import LogScanner, conclude, parse_size
from rankscope.capabilities.triage import rank_hint, triage_logs
from rankscope.cli import main
from rankscope.errors import InvalidInput
from tests.paths import DATA as DATA_ROOT
from tests.paths import ROOT

LOGS = DATA_ROOT / "logs"


def _by_kind(report_findings: list, kind: str) -> list:  # type: ignore[type-arg]
    return [f for f in report_findings if f.kind == kind]


def test_nccl_watchdog_timeouts_name_the_lagging_rank() -> None:
    r = triage_logs([str(LOGS / "nccl_watchdog_lagging_rank.log")])
    timeouts = {f.ranks[0]: f for f in _by_kind(r.findings, "collective_timeout")}
    assert sorted(timeouts) == [0, 1, 2, 3]
    f0 = timeouts[0]
    assert f0.facts["seq"] == 42 and f0.facts["op"] == "ALLREDUCE"
    assert (
        f0.facts["numel_in"] == 26214400
        and f0.facts["timeout_ms"] == 600000
        and f0.facts["ran_for_ms"] == 600046
    )
    assert f0.facts["last_enqueued"] == 42 and f0.facts["last_completed"] == 41
    assert f0.facts["pg_id"] == 0
    assert timeouts[2].facts["last_enqueued"] == 41
    assert f0.line_numbers[0] == 5 and "Watchdog caught" in f0.excerpt
    assert r.suspect_ranks == [2]
    assert r.victim_ranks == [0, 1, 3]
    assert any("#41" in e for e in r.evidence)
    step = f0.next_steps[0]
    assert (
        step.tool == "dump_stacks"
        and step.skill_section == "skill/communication-errors.md#collective-timeout"
    )


def test_per_rank_files_silent_rank_is_the_suspect() -> None:
    r = triage_logs([str(LOGS / "nccl_per_rank")])
    assert [s.rank_hint for s in r.sources] == [0, 1, 2, 3]
    assert sorted(x for f in _by_kind(r.findings, "collective_timeout") for x in f.ranks) == [0, 1, 2]
    assert r.suspect_ranks == [3]
    assert "reported no collective timeout" in " ".join(r.evidence)


def test_cuda_oom_facts_and_victims() -> None:
    r = triage_logs([str(LOGS / "cuda_oom.log")])
    (oom,) = _by_kind(r.findings, "cuda_oom")
    assert oom.ranks == [3]
    assert oom.facts["requested_bytes"] == 2 * 1024**3
    assert oom.facts["gpu"] == 3 and oom.facts["free"] == "1.23 GiB"
    assert (
        oom.facts["reserved_unallocated"] == "6.50 GiB" and oom.facts["allocated_by_pytorch"] == "70.12 GiB"
    )
    assert oom.next_steps[0].tool == "inspect_memory" and oom.next_steps[0].skill_section == "skill/oom.md"
    assert r.suspect_ranks == [3] and r.victim_ranks == [0, 1]
    assert r.findings[0].kind == "cuda_oom"  # causes come before victims


def test_nccl_unhandled_cuda_error() -> None:
    r = triage_logs([str(LOGS / "nccl_unhandled_cuda.log")])
    (nccl,) = [f for f in _by_kind(r.findings, "nccl_error") if f.ranks == [1]]
    assert nccl.facts["reason"] == "unhandled cuda error" and nccl.facts["nccl_version"] == "2.21.5"
    # the NCCL WARN line is attributed to rank 1 through the pid of NCCL's "comm ... rank 1" init line
    assert nccl.facts["cuda_device"] == 1
    cuda = [f for f in _by_kind(r.findings, "cuda_error") if f.ranks == [1]]
    assert cuda and cuda[0].facts["cuda_failure"] == "an illegal memory access was encountered"
    assert r.suspect_ranks == [1]


def test_xid_lines() -> None:
    r = triage_logs([str(LOGS / "dmesg_xid.txt")])
    (xid,) = _by_kind(r.findings, "gpu_xid")
    assert xid.severity == "critical" and xid.facts["xid"] == 79 and xid.facts["pci"] == "PCI:0000:3b:00"
    assert "fallen off the bus" in xid.facts["meaning"]
    assert "Xid" in r.summary


def test_torchelastic_log_dir_with_error_json() -> None:
    r = triage_logs([str(LOGS / "torchelastic")])
    kinds = {s.path.rsplit("/", 2)[-2] + "/" + Path(s.path).name: s.kind for s in r.sources}
    assert kinds["1/error.json"] == "error_json"
    (dl,) = _by_kind(r.findings, "dataloader_worker_killed")
    assert dl.ranks == [1] and dl.facts["worker_pids"] == 90121
    assert _by_kind(r.findings, "shm_exhausted")[0].ranks == [1]
    assert any(f.error_file and f.error_file.endswith("error.json") for f in r.failures)
    assert r.suspect_ranks == [1]
    assert r.seen_ranks == [0, 1]


def test_captured_gloo_runs() -> None:
    expect = {
        "timeout": ("collective_timeout", [1]),
        "exit_early": ("peer_closed", [1]),
        "sigkill": ("killed_by_signal", [1]),
        "dl_worker_kill": ("dataloader_worker_killed", [1]),
        "unused_params": ("unused_parameters", [0, 1]),
        "mismatch": ("collective_mismatch", [1, 0]),  # 2 ranks name each other: either may be odd
        "detail_4": ("collective_mismatch", [2]),  # every other rank names rank 2
        "detail_8": ("collective_mismatch", [2]),
        "detail_odd_op": ("collective_mismatch", [2]),  # its own BARRIER against the others' ALLREDUCE
        "port": ("address_in_use", []),
        "rdzv": ("rendezvous_failure", []),
    }
    for name, (kind, suspects) in expect.items():
        r = triage_logs([str(LOGS / f"torchrun_gloo_{name}.log")])
        assert kind in r.kinds, (name, r.kinds)
        assert r.suspect_ranks == suspects, (name, r.suspect_ranks, r.evidence)
    port = triage_logs([str(LOGS / "torchrun_gloo_port.log")])
    assert port.findings[0].facts["port"] == 29777 and "rendezvous_failure" not in port.kinds


DETAIL_TAIL = (
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), but Rank {other} is running collective: "
    "CollectiveFingerPrint(SequenceNumber={oseq}OpType={oop}).Collectives differ in the following aspects: "
)


def _detail(rank: int, seq: int, op: str, other: int, oseq: int, oop: str) -> str:
    """A DETAIL mismatch line as gloo writes it (ProcessGroupWrapper: no comma after a checker's sequence number)."""
    own = (
        f"SequenceNumber={seq}OpType={op})"
        if op == "BARRIER"
        else f"SequenceNumber={seq}, OpType={op}, TensorShape=[4], TensorDtypes=Float, "
    )
    return (
        f"[rank{rank}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {rank} is running "
        f"collective: CollectiveFingerPrint({own}" + DETAIL_TAIL.format(other=other, oseq=oseq, oop=oop)
    )


def test_detail_names_the_rank_whose_own_collective_differs() -> None:
    """Ranks 0, 1, 3 each name rank 2 through DETAIL's checker (sequence number 0, REDUCE) and rank 2
    names rank 0 (GATHER): the reports' own fingerprints decide (rank 2's BARRIER at 5 against the
    others' ALLREDUCE at 5), and torchrun's first observed failure (rank 0 here) does not override."""
    sc = LogScanner()
    lines = [_detail(r, 5, "ALLREDUCE", 2, 0, "REDUCE") for r in (0, 1, 3)]
    lines.append(_detail(2, 5, "BARRIER", 0, 0, "GATHER"))
    lines.append("  time      : 2026-01-01_00:00:00\n  host      : vm\n  rank      : 0 (local_rank: 0)")
    for n, line in enumerate(lines, 1):
        sc.feed(line, n, "a.log")
    c = conclude(sc.findings(), sc.failures(), sc.seen_ranks)
    assert c.suspect_ranks == [2], c.evidence
    assert any("rank 2: its own collective (BARRIER at sequence number 5) differs" in e for e in c.evidence)
    # rank 2's report alone names rank 0 only through the checker: that names no one
    alone = LogScanner()
    alone.feed(lines[3], 1, "a.log")
    assert conclude(alone.findings(), alone.failures(), alone.seen_ranks).suspect_ranks != [0]


def test_binary_and_garbage_input(tmp_path: Path) -> None:
    # a live log after logrotate's copytruncate starts with a hole of NUL bytes: still a text log
    rotated = tmp_path / "rank1.log"
    rotated.write_bytes(b"\x00" * 100_000 + (LOGS / "torchrun_gloo_sigkill.log").read_bytes())
    assert triage_logs([str(rotated)]).suspect_ranks == [1]
    r = triage_logs([str(LOGS / "garbage.bin")])
    assert r.findings == [] and r.sources[0].skipped and "binary" in r.sources[0].skipped
    assert "Nothing was analysed" in r.summary
    r = triage_logs([], text="\ufffd\ufffd random words, Signal without meaning, Failures: none\n" * 50)
    assert r.findings == [] and r.suspect_ranks == []
    r = triage_logs([], text="x" * 3_000_000)  # one huge line, no newline
    assert r.findings == []
    with pytest.raises(InvalidInput):
        triage_logs([str(LOGS / "does-not-exist.log")])
    with pytest.raises(InvalidInput):
        triage_logs([])


def test_cli_stdin_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    data = (LOGS / "torchrun_gloo_sigkill.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["triage", "-", "--json"]) == 0
    report = json.loads(out.getvalue())
    assert report["suspect_ranks"] == [1] and report["sources"][0]["path"] == "-"
    (first,) = [
        f for f in report["failures"] if f.get("first_observed")
    ]  # bounded: the first and the suspects'
    assert first["signal"] == "SIGKILL" and first["rank"] == 1
    human = io.StringIO()
    with redirect_stdout(human):
        assert main(["triage", str(LOGS / "torchrun_gloo_sigkill.log")]) == 0
    assert "Suspect ranks: 1" in human.getvalue() and "OOM killer" in human.getvalue()


def test_redaction_and_bounded_findings() -> None:
    text = "".join(
        f"[rank{i}]: RuntimeError: Connection closed by peer [10.0.0.{i}]:4242 url=https://u:pw-S3cret@h/x token=abcdef123456\n"
        for i in range(80)
    )
    r = triage_logs([], text=text, max_findings=10)
    assert len(r.findings) == 10 and r.truncated and r.dropped_findings == 70
    dumped = r.model_dump_json()
    assert "pw-S3cret" not in dumped and "abcdef123456" not in dumped


def test_prefilter_never_skips_a_line_a_rule_wants() -> None:
    from rankscope.analysis.triage.logs import SHELL_NEEDLES
    from rankscope.capabilities.triage import PREFILTER

    assert len(PREFILTER) < len(SHELL_NEEDLES)
    for needle in SHELL_NEEDLES:
        assert any(p in needle for p in PREFILTER), needle


def test_rank_hints_from_file_names() -> None:
    assert rank_hint("/logs/rank3.log") == 3
    assert rank_hint("/logs/train-rank-12.txt") == 12
    assert rank_hint("/tmp/te/run_0/attempt_1/5/stderr.log") == 5
    assert rank_hint("/logs/train.log") is None


def test_scanner_is_streaming_and_pure() -> None:
    sc = LogScanner()
    sc.feed(
        "[rank2]:[E1121 ProcessGroupNCCL.cpp:1709] [PG ID 0 PG GUID 0(default_pg) Rank 2] Timeout at NCCL work: 9, "
        "last enqueued NCCL work: 9, last completed NCCL work: 8.",
        1,
        "a.log",
    )
    sc.feed(
        "[rank0]:[E1121 ProcessGroupNCCL.cpp:1709] [PG ID 0 PG GUID 0(default_pg) Rank 0] Timeout at NCCL work: 9, "
        "last enqueued NCCL work: 10, last completed NCCL work: 8.",
        2,
        "a.log",
    )
    findings = sc.findings()
    c = conclude(findings, sc.failures(), sc.seen_ranks)
    # both issued #9, but rank 2 stopped issuing there while rank 0 went on to #10: rank 2 is behind
    assert c.suspect_ranks == [2] and c.victim_ranks == [0]
    assert any("rank 2: enqueued 1 fewer collective than rank 0" in e for e in c.evidence)
    assert parse_size("1.50 MiB") == 1572864 and parse_size("12 B") == 12 and parse_size("huge") is None


def test_every_skill_section_emitted_resolves_to_a_heading() -> None:
    import re as _re

    from rankscope.analysis.triage.log_rules import RULES, SECTIONS

    root = ROOT

    def anchors(md: str) -> set[str]:
        out = set()
        for line in md.splitlines():
            m = _re.match(r"^#{1,6}\s+(.*)$", line)
            if m:
                out.add(_re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
        return out

    sections = set(SECTIONS.values()) | {
        s.skill_section for r in RULES for s in r.next_steps if s.skill_section
    }
    env_src = (root / "tools" / "rankscope" / "analysis" / "env_checks.py").read_text()
    names = {"CE": "skill/communication-errors.md", "CR": "skill/crashes.md"}
    sections |= {f"{names[f]}#{a}" for f, a in _re.findall(r"\{_(CE|CR)\}#([a-z-]+)", env_src)}
    for section in sorted(s for s in sections if s):
        path, _, anchor = section.partition("#")
        assert (root / path).is_file(), section
        if anchor:
            assert anchor in anchors((root / path).read_text()), section


def test_spawn_and_role_prefixed_lines() -> None:
    text = (
        "[default0]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[10.1.2.3]:61233\n"
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL\n"
        "process 2 terminated with exit code 1\n"
    )
    r = triage_logs([], text=text)
    assert [f.ranks for f in r.findings if f.kind == "peer_closed"] == [[0]]
    killed = [f for f in r.findings if f.kind == "killed_by_signal"]
    assert killed[0].ranks == [1] and killed[0].facts["signal"] == "SIGKILL"
    assert any(rec.rank == 2 and rec.exitcode == 1 for rec in r.failures)
    assert r.suspect_ranks[0] == 1 and 0 in r.victim_ranks


def test_nccl_send_recv_timeouts_point_at_a_send_recv_deadlock() -> None:
    # NCCL's watchdog names p2p work OpType=RECV / SEND (format of ProcessGroupNCCL's WorkNCCL)
    text = "".join(
        f"[rank{r}]:[E1122 03:06:29.163000 1338{r} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum=12, OpType=RECV, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for "
        f"60001{r} milliseconds before timing out.\n"
        for r in (0, 1)
    )
    r = triage_logs([], text=text)
    assert r.summary.startswith("Point-to-point ops timed out (RECV on ranks 0-1)")
    assert "send/recv ordering deadlock" in r.summary
    assert r.next_steps[0].skill_section == "skill/hangs.md#point-to-point-deadlock"
    # gloo's "for recv operation" is its transport under every collective: not a p2p hint
    gloo = triage_logs([str(LOGS / "torchrun_gloo_timeout.log")], read_code=False)
    assert "Point-to-point" not in gloo.summary and "Collectives timed out" in gloo.summary


def _watchdog(rank: int, seq: int, enqueued: int) -> str:
    return (
        f"[rank{rank}]:[E1121 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] failure "
        f"detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enqueued}, last completed "
        f"work: {seq - 1}"
    )


def _dump_signal(rank: int, enqueued: int) -> str:
    return (
        f"[rank{rank}]:[E1121 ProcessGroupNCCL.cpp:1520] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Received a "
        f"dump signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. "
        f"Last enqueued NCCL work: {enqueued}, last completed NCCL work: {enqueued}.This is most likely caused by "
        "incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same "
        "for all ranks or the scheduled collective, for some reason, didn't run."
    )


def _conclude(lines: list[str]) -> tuple[list[int], list[int], list[str]]:
    sc = LogScanner()
    for i, line in enumerate(lines, 1):
        sc.feed(line, i, "job.log")
    c = conclude(sc.findings(), sc.failures(), sc.seen_ranks)
    return c.suspect_ranks, c.victim_ranks, c.evidence


def test_rank_that_never_issued_the_failing_collective_is_named_from_its_dump_signal_line() -> None:
    lines = [_watchdog(r, 42, 45) for r in (0, 1, 3)] + [_dump_signal(2, 41)]
    suspects, victims, evidence = _conclude(lines)
    assert suspects == [2] and victims == [0, 1, 3]
    assert any("rank 2: never issued collective #42: its last enqueued work is #41" in e for e in evidence)


def test_rank_whose_dump_signal_shows_it_issued_the_collective_is_not_blamed_for_silence() -> None:
    lines = [_watchdog(r, 42, 45) for r in (0, 1)] + [_dump_signal(2, 44), _watchdog(3, 42, 41)]
    suspects, _victims, evidence = _conclude(lines)
    assert suspects == [3]
    assert any("rank 2: issued collective #42" in e for e in evidence)


def test_nccl_errors_after_a_ranks_oom_are_its_victims_not_more_suspects() -> None:
    """GPU format: rank 3 runs out of memory; NCCL then fails on every other rank (ncclRemoteError),
    and torchrun's root cause names rank 0, the first to exit. Only rank 3 is a suspect."""
    r = triage_logs([str(LOGS / "nccl_remote_after_oom.log")])
    assert {"cuda_oom", "nccl_error"} <= set(r.kinds)
    assert r.suspect_ranks == [3] and r.victim_ranks == [0, 1, 2]
    assert any("NCCL error after rank 3's cuda oom" in e for e in r.evidence)
