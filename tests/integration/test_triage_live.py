"""Triage the logs of real failing torchrun jobs (CPU, gloo), produced here.

The seven failures run concurrently (one module-scoped set of jobs) to keep the
wall time low on a small machine; each test then triages one job's combined
output and checks kinds, ranks, facts and the suspects.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.capabilities.triage import triage_logs
from rankscope.models.logs import TriageReport
from tests.jobs import JobFactory, RunningJob, free_port, torchrun_argv, wait_for

MODES = ("timeout", "exit_early", "unused_params", "dl_worker_kill", "sigkill")


def _torchrun(extra: list[str], port: int, args: list[str]) -> list[str]:
    return torchrun_argv("failmodes.py", *extra, args=args)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningJob]]:
    factory = JobFactory(tmp_path_factory.mktemp("triage-live"))
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        started: dict[str, RunningJob] = {}
        for mode in MODES:
            started[mode] = factory.torchrun("failmodes.py", nproc=2, args=[mode])
        # master port already taken by another listener
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        started["port"] = factory.start(
            _torchrun(
                ["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={busy}"], busy, ["ok"]
            ),
            2,
            busy,
            None,
            "port",
        )
        # rendezvous timeout: a 2-node c10d rendezvous that only one node joins
        rport = free_port()
        started["rdzv"] = factory.start(
            _torchrun(
                [
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    "--rdzv_backend=c10d",
                    f"--rdzv_endpoint=127.0.0.1:{rport}",
                    "--rdzv_id=triage-live",
                    "--rdzv_conf=join_timeout=5",
                ],
                rport,
                ["ok"],
            ),
            1,
            rport,
            None,
            "rdzv",
        )
        wait_for(
            lambda: all(j.proc.poll() is not None for j in started.values()),
            240,
            "all failing jobs to exit",
            detail=lambda: "; ".join(
                f"{name}: {j.last_output()}" for name, j in started.items() if j.proc.poll() is None
            ),
        )
        yield started
    finally:
        held.close()
        factory.cleanup()


def _triage(job: RunningJob) -> TriageReport:
    assert job.proc.returncode not in (None, 0), job.output()
    return triage_logs([str(job.log_path)])


def _one(report: TriageReport, kind: str) -> list:  # type: ignore[type-arg]
    found = [f for f in report.findings if f.kind == kind]
    assert found, (kind, report.kinds, report.summary)
    return found


def test_collective_timeout_blames_the_rank_that_never_arrived(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["timeout"])
    (t,) = _one(r, "collective_timeout")
    assert t.ranks == [0] and t.facts["timeout_ms"] == 5000 and t.facts["op"] == "recv"
    assert r.suspect_ranks == [1] and 0 in r.victim_ranks
    # torchrun names rank 0 (it exited first); rankscope says why that is not the culprit
    assert any(f.first_observed and f.rank == 0 for f in r.failures)
    assert any("first observed failure" in e and "victim" in e for e in r.evidence)


def test_rank_leaving_early_peers_see_closed_connection(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["exit_early"])
    (p,) = _one(r, "peer_closed")
    assert p.ranks == [0] and p.facts["peer_addr"] == "127.0.0.1" and isinstance(p.facts["peer_port"], int)
    assert r.victim_ranks == [0]
    assert r.suspect_ranks != [0]  # the only rank torchrun reports failed is a victim
    assert any("victim" in e for e in r.evidence)


def test_ddp_unused_parameters(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["unused_params"])
    found = _one(r, "unused_parameters")
    assert sorted(x for f in found for x in f.ranks) == [0, 1]
    assert all(f.facts.get("unused") == "2 3" for f in found)
    assert "find_unused_parameters=True" in found[0].fix
    assert found[0].next_steps[0].skill_section == "skill/crashes.md#unused-parameters"


def test_dataloader_worker_killed(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["dl_worker_kill"])
    (d,) = _one(r, "dataloader_worker_killed")
    assert d.ranks == [1] and isinstance(d.facts["worker_pids"], int) and d.facts["signal"] == "Killed"
    assert r.suspect_ranks == [1]


def test_rank_killed_by_sigkill(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["sigkill"])
    killed = [f for f in _one(r, "killed_by_signal") if f.facts["signal"] == "SIGKILL"]
    assert killed and killed[0].ranks == [1] and killed[0].facts["exitcode"] == -9
    assert killed[0].severity == "critical" and "OOM killer" in killed[0].explanation
    assert r.suspect_ranks == [1] and 0 in r.victim_ranks
    assert "OOM killer" in r.summary


def test_master_port_in_use(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["port"])
    (a,) = _one(r, "address_in_use")
    assert a.facts["port"] == finished["port"].port and a.facts["code"] == -98
    assert "rendezvous_failure" not in r.kinds and r.suspect_ranks == []


def test_rendezvous_timeout(finished: dict[str, RunningJob]) -> None:
    r = _triage(finished["rdzv"])
    (f,) = _one(r, "rendezvous_failure")
    assert "RendezvousTimeoutError" in f.excerpt
    assert "Rendezvous failed" in r.summary


def test_whole_directory_of_logs(finished: dict[str, RunningJob]) -> None:
    logdir = Path(finished["sigkill"].log_path).parent
    r = triage_logs([str(logdir)], max_findings=5)
    assert len(r.sources) >= len(finished) and r.truncated and len(r.findings) == 5
