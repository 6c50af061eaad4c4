"""A watch over other hosts, the parts that start nothing: each host's sampler command, the job's
ranks keyed apart across hosts, the merged sample the one detector reads, and the command line's
choice of hosts. The live side (ssh nodes, a real Slurm) is tests/integration/test_watch_hosts_live.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rankscope.analysis.hang.stall import StallDetector
from rankscope.capabilities import watch_folder as wf
from rankscope.capabilities.watch_hosts import HostsSampler, HostStream, sampler_argv, sampler_flags
from rankscope.models.watch import HostSample, SampledRank, WatchSelection
from tests.jobs import run_cli


def test_each_host_samples_the_job_as_the_watch_chose_it() -> None:
    here = WatchSelection(folder="/work/job", hosts=["n1"], via="ssh")
    assert sampler_flags(here, 0.5, None) == [
        "watch",
        "--sampler",
        "--interval",
        "0.5",
        "--here",
        "/work/job",
    ]
    by_id = WatchSelection(folder="/x", job_id="torchrun:a:1", hosts=["n1"], via="ssh")
    assert sampler_flags(by_id, 2, 30)[-4:] == ["--job", "torchrun:a:1", "--job-timeout", "30"]
    slurm = WatchSelection(folder="/x", via="srun", slurm_job="77")
    assert sampler_flags(slurm, 2, None)[-2:] == ["--job", "77"]


def test_a_sampler_starts_over_ssh_with_keepalives_or_in_one_srun_step_per_node() -> None:
    flags = ["watch", "--sampler"]
    ssh = sampler_argv("n2", WatchSelection(hosts=["n2"], via="ssh"), flags)
    assert ssh[:3] == ["ssh", "-o", "BatchMode=yes"] and "ServerAliveInterval=5" in ssh and "n2" in ssh
    assert "watch --sampler" in ssh[-1]  # one quoted remote command
    srun = sampler_argv("n2", WatchSelection(via="srun", slurm_job="77"), flags)
    assert srun[:7] == [
        "srun",
        "--overlap",
        "--jobid=77",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n2",
        "--kill-on-bad-exit=0",
    ]
    assert srun[-2:] == flags


def _stream(host: str, *samples: HostSample) -> HostStream:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    stream = HostStream(host=host, via="ssh", proc=proc)
    stream.first = samples[0] if samples else None
    stream.latest = samples[-1] if samples else None
    return stream


def _sample(host: str, t: float, cpu: float, pids: tuple[int, ...] = (100, 101)) -> HostSample:
    ranks = [SampledRank(pid=p, rank=i, cpu_s=cpu) for i, p in enumerate(pids)]
    return HostSample(host=host, t=t, job_id="j", ranks=ranks, rank_pids=list(pids), output=10)


def test_the_same_pids_on_two_hosts_are_two_ranks_of_one_sample() -> None:
    changes: list[int] = []
    a, b = _stream("node1", _sample("node1", 1, 1.0)), _stream("node2", _sample("node2", 1, 2.0))
    sampler = HostsSampler([a, b], 60.0, lambda: changes.append(1))
    got = sampler.sample()
    assert len(got.ranks) == 4 and got.output == 20
    assert sorted(sampler.where(k) for k in got.ranks) == [
        ("node1", 100),
        ("node1", 101),
        ("node2", 100),
        ("node2", 101),
    ]
    assert {(r.host, r.rank) for r in sampler.job().ranks} == {
        ("node1", 0),
        ("node1", 1),
        ("node2", 0),
        ("node2", 1),
    }


def test_a_sampler_that_ended_is_gone_unless_its_ranks_ended_first() -> None:
    ended = _sample("node1", 2, 1.0).model_copy(update={"ended": True, "ranks": [], "rank_pids": []})
    a = _stream("node1", _sample("node1", 1, 1.0), ended)
    b = _stream("node2", _sample("node2", 1, 1.0))
    a.eof = b.eof = True
    changes: list[int] = []
    sampler = HostsSampler([a, b], 60.0, lambda: changes.append(1))
    assert sampler.alive() == [] and changes == [1]
    assert (a.state, a.note) == ("ended", "its ranks ended")
    assert b.state == "gone" and b.note and "ended" in b.note


def test_a_host_gone_leaves_the_others_judged_by_the_one_detector() -> None:
    a, b = _stream("node1", _sample("node1", 1, 1.0)), _stream("node2", _sample("node2", 1, 1.0))
    sampler = HostsSampler([a, b], 60.0, lambda: None)
    detector = StallDetector(3.0)
    for t in range(8):
        got = sampler.sample()
        detector.add(type(got)(t=float(t), ranks=got.ranks, output=got.output))
        if t == 2:
            b.state = "gone"
    assert detector.judge().state == "suspect"  # node1's ranks stayed idle after node2 went
    assert len(detector.samples[-1].ranks) == 2


def test_watch_over_hosts_takes_no_pid_and_srun_needs_the_slurm_job() -> None:
    done = run_cli("watch", "--out", "/tmp/unused-watch", "--hosts", "n1,n2", "--pid", "1")
    assert done.returncode == 2 and "--job" in done.stderr
    done = run_cli("watch", "--out", "/tmp/unused-watch", "--via", "srun")
    assert done.returncode == 2 and "Slurm job" in done.stderr


def test_a_detached_watch_over_hosts_is_started_with_the_same_choice() -> None:
    from rankscope.capabilities.watch import WatchConfig
    from rankscope.capabilities.watch_start import detach_argv

    ssh = WatchSelection(folder="/j", job_id="torchrun:a:1", hosts=["n1", "n2"], via="ssh")
    argv = detach_argv(WatchConfig(out=Path("/w"), selection=ssh))
    assert argv[argv.index("--job") + 1] == "torchrun:a:1" and argv[argv.index("--hosts") + 1] == "n1,n2"
    srun = WatchSelection(folder="/j", via="srun", slurm_job="77")
    argv = detach_argv(WatchConfig(out=Path("/w"), selection=srun))
    assert argv[argv.index("--job") + 1] == "77" and argv[argv.index("--via") + 1] == "srun"
    assert "--hosts" not in argv


def test_new_ranks_on_every_host_are_the_next_attempt(tmp_path: Path) -> None:
    """Each host's sampler follows the job by its id across a restart; the watch counts the attempt."""
    from rankscope.capabilities.watch_hosts import HostsWatcher
    from rankscope.models.watch import WatchAttempt, WatchManifest, WatchSettings

    a, b = _stream("node1", _sample("node1", 1, 1.0)), _stream("node2", _sample("node2", 1, 1.0))
    watcher = HostsWatcher.__new__(HostsWatcher)
    watcher.folder, watcher.streams, watcher.open = tmp_path, [a, b], None
    watcher.sampler = watcher.hosts = HostsSampler([a, b], 60.0, lambda: None)
    watcher.settings = WatchSettings(interval_s=1, stall_s=3, max_incidents=2, max_incident_bytes=4096)
    watcher.manifest = WatchManifest(
        watcher_pid=1,
        watcher_host="login",
        started_at="2026-11-28T03:00:00+00:00",
        settings=watcher.settings,
        attempts=[WatchAttempt(n=1, first_seen="2026-11-28T03:00:00+00:00", pids={"node1": [100, 101]})],
    )
    watcher._follow_restart()  # node2's ranks seen late: added to attempt 1
    assert [x.pids for x in watcher.manifest.attempts] == [{"node1": [100, 101], "node2": [100, 101]}]
    a.latest = _sample("node1", 2, 0.0, (200, 201))
    watcher._follow_restart()  # node2 still shows attempt 1's ranks
    assert len(watcher.manifest.attempts) == 1
    b.latest = _sample("node2", 2, 0.0, (300, 301))
    watcher._follow_restart()
    first, second = watcher.manifest.attempts
    assert first.ended_at is not None and second.n == 2
    assert second.pids == {"node1": [200, 201], "node2": [300, 301]}
    assert wf.read_watch(tmp_path).attempts[-1].n == 2
