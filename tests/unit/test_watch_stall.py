"""The one stall detector (analysis/hang/stall.py) and the job's timeout (analysis/hang/job_timeout.py),
on hand-built samples: progress is output, I/O or a file wait, never CPU alone; a busy quiet job (NCCL
spins) is suspected only after the longer threshold."""

from __future__ import annotations

from rankscope.analysis.hang import job_timeout as jt
from rankscope.analysis.hang.stall import JobSample, RankSample, every_rank_ran, judge_stall, moved
from rankscope.models.watch import IncidentManifest, IncidentView, WatchManifest, WatchSettings, WatchView
from rankscope.render.watch import render_watch


def _samples(
    seconds: int, *, cpu_per_s: float = 0.0, output_until: int = 0, io_per_s: int = 0
) -> list[JobSample]:
    out = []
    for t in range(seconds + 1):
        io = {"rchar": 0, "wchar": t * io_per_s, "syscr": 0, "syscw": t, "read_bytes": 0, "write_bytes": 0}
        ranks = {
            p: RankSample(pid=p, cpu_s=t * cpu_per_s, state="R" if cpu_per_s else "S", io=io)
            for p in (10, 11)
        }
        out.append(JobSample(t=float(t), ranks=ranks, output=min(t, output_until) * 100))
    return out


def test_idle_and_silent_is_suspected_after_the_threshold_not_before() -> None:
    samples = _samples(20, output_until=5)
    assert judge_stall(samples[:8], stall_s=5).state in ("moving", "quiet")
    call = judge_stall(samples, stall_s=5)
    assert call.state == "suspect" and call.idle and call.quiet_s == 15
    assert "no output" in call.why


def test_a_job_moves_again_only_when_every_rank_runs() -> None:
    """A stall that resumes moves every rank; one that ends by its collective timeout prints from the
    ranks that waited while the rank stuck in its read uses no CPU at all."""
    resumed = _samples(6, cpu_per_s=0.1, output_until=6)
    assert every_rank_ran(resumed, [10, 11], since=2.0)
    timing_out = [
        JobSample(
            t=s.t,
            ranks={**s.ranks, 11: RankSample(pid=11, cpu_s=0.5, state="S", io=s.ranks[11].io)},
            output=s.output,
        )
        for s in resumed
    ]
    assert not every_rank_ran(timing_out, [10, 11], since=2.0)
    assert not every_rank_ran(resumed, [10, 11, 12], since=2.0)  # a rank never sampled did not run
    assert not every_rank_ran(resumed, [10, 11], since=7.0)  # nothing sampled since then


def test_output_or_io_is_progress() -> None:
    assert judge_stall(_samples(20, output_until=20), stall_s=5).state == "moving"
    busy_io = _samples(20, io_per_s=1 << 20)  # a checkpoint written in large calls
    assert moved(busy_io[3], busy_io[4])
    assert judge_stall(busy_io, stall_s=5).state == "moving"


def test_a_file_wait_in_the_kernel_is_progress() -> None:
    a = JobSample(t=0, ranks={1: RankSample(pid=1, cpu_s=0, state="D", wchan="io_schedule")})
    b = JobSample(t=1, ranks={1: RankSample(pid=1, cpu_s=0, state="D", wchan="io_schedule")})
    assert moved(a, b)


def test_busy_ranks_are_suspected_only_after_the_busy_threshold() -> None:
    spinning = _samples(40, cpu_per_s=1.0)  # NCCL busy-polls in a hung collective
    early = judge_stall(spinning[:12], stall_s=5, busy_stall_s=20)
    assert early.state == "quiet" and early.busy_pids
    late = judge_stall(spinning, stall_s=5, busy_stall_s=20)
    assert late.state == "suspect" and not late.idle and "spins" in late.why


def test_no_process_left_is_gone() -> None:
    assert judge_stall([JobSample(t=0)], stall_s=5).state == "gone"
    assert judge_stall([], stall_s=5).state == "unknown"


def test_the_jobs_timeout_is_read_from_args_env_locals_or_stated_as_default() -> None:
    got = jt.job_timeout([["python", "train.py", "--distributed-timeout-minutes", "30"]], [], "nccl")
    assert (got.seconds, got.source) == (1800.0, "args")
    got = jt.job_timeout([["train.py", "--ddp_timeout=120"]], [], None)
    assert (got.seconds, got.source) == (120.0, "args")
    got = jt.job_timeout([["train.py"]], [{"NCCL_TIMEOUT": "900"}], "nccl")
    assert (got.seconds, got.source) == (900.0, "env")
    got = jt.job_timeout([["train.py"]], [{}], "gloo")
    assert (got.seconds, got.source) == (1800.0, "default") and "default" in got.note
    local = jt.from_locals([("timeout", "datetime.timedelta(seconds=30)")])
    assert local is not None and (local.seconds, local.source) == (30.0, "stacks")
    assert jt.stall_threshold(30) == 10 and jt.stall_threshold(600) == 120 and jt.stall_threshold(1800) == 120
    assert jt.busy_threshold(10, 30) == 15 and jt.busy_threshold(120, 600) == 300


def test_a_folder_read_back_says_resumed_and_incomplete() -> None:
    settings = WatchSettings(interval_s=2, stall_s=20, max_incidents=3, max_incident_bytes=1 << 20)
    watch = WatchManifest(
        watcher_pid=1, watcher_host="h", started_at="2026-11-28T03:00:00+00:00", settings=settings
    )
    resumed = IncidentManifest(
        name="001-x", stall_suspected_at="t", status="resumed", resumed_after_s=40, complete=True
    )
    cut = IncidentManifest(name="002-x", stall_suspected_at="t")
    text = "\n".join(
        render_watch(
            WatchView(
                dir="/w", watch=watch, incidents=[IncidentView(manifest=resumed), IncidentView(manifest=cut)]
            )
        )
    )
    assert "resumed after 40s (a slow phase)" in text and "INCOMPLETE" in text


def test_the_jobs_timeout_is_read_from_its_scripts_init_process_group() -> None:
    """Most jobs set it in code: read before any stall, so a 30 s timeout is not taken for 10 min."""
    script = "import datetime\n\n\ndef main():\n    dist.init_process_group(\n        'nccl',\n        timeout=datetime.timedelta(seconds=30),\n    )\n"
    got = jt.job_timeout([["python", "train.py"]], [{}], "nccl", [("train.py", script)])
    assert (got.seconds, got.source) == (30.0, "source") and "train.py:5" in got.note
    mesh = "mesh = init_device_mesh('cuda', (8,), timeout=timedelta(minutes=2, seconds=5))"
    got_mesh = jt.from_source([("setup.py", mesh)])
    assert got_mesh is not None and got_mesh.seconds == 125.0
    assert jt.from_source([("t.py", "init_process_group('nccl', timeout=timedelta(seconds=args.t))")]) is None
    assert jt.from_source([("t.py", "x = timedelta(seconds=5)\ninit_process_group('nccl')")]) is None
    flagged = jt.job_timeout([["train.py", "--ddp_timeout=120"]], [{}], "nccl", [("train.py", script)])
    assert flagged.source == "args"  # what the command line says wins over the code's literal


def test_the_h200_stall_scripts_timeout_is_read_from_its_source() -> None:
    from tests.paths import DATA

    script = DATA / "h200" / "scripts" / "w_stall.py"
    got = jt.from_source([(script.name, script.read_text())])
    assert got is not None and got.seconds == 30.0
