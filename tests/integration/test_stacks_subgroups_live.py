"""rankscope on real hung gloo jobs whose ranks part where the stacks alone cannot tell who is at
fault: a rank left waiting in a subgroup (named from the job's group table, a flight recorder, or
the debug server, and not named without them), and a loop inside an installed library.

Every job is started through the ``jobs`` fixture (reaped at teardown, pass or fail) and polled
until the expected verdict shows (tests/live_stacks.py). The other hung-job tests are in test_stacks_live.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.api import dump_stacks
from rankscope.options import DumpOptions
from tests.jobs import PROGRAMS, JobFactory
from tests.live_stacks import READY_S, settle

pytestmark = pytest.mark.slow


def test_rank_left_waiting_in_a_subgroup_names_the_member_that_went_on(
    jobs: JobFactory, pyspy_works: str
) -> None:
    """Rank 3 skips its pair's all_reduce and waits in the global barrier; rank 2 is left in the pair's.
    The job keeps its groups in a list, so each rank's locals say which groups it belongs to."""
    job = jobs.torchrun("hang_subgroup.py", nproc=4, args=["--groups", "table"])
    job.wait_ready(timeout=READY_S)
    report = settle(
        job.pid, lambda r: r.verdict.kind == "mismatched_collectives" and "subgroup" in r.verdict.summary
    )
    v = report.verdict
    assert v.suspect_ranks == [3] and v.confidence == "high", v
    assert "rank 2 waits in all_reduce" in v.summary and "rank 3, of rank 2's group, has gone on" in v.summary
    assert v.evidence[0].startswith(
        "window: nothing moved"
    )  # the window saw nothing move, then the hang rules
    assert "entry 1 of `pairs` in main (hang_subgroup.py): ranks 2-3 hold a ProcessGroup" in v.evidence[1]
    # only integers and the group facts were kept from the locals
    assert all(f.locals is None for s in report.stacks for t in s.threads for f in t.frames)
    assert {s.rank: s.group_locals.slot for s in report.stacks if s.group_locals}[
        2
    ] == "hang_subgroup.py:main:pairs[1]"


def test_rank_left_waiting_in_a_subgroup_is_named_from_the_probes_flight_recorder(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    """No local says who the members are (each rank's group is built in a helper), but the job runs
    rankscope.probe's flight recorder: stacks asks each rank for a dump through the probe's signal
    (the hung ranks go on waiting), and the recorder's groups and sequence numbers name rank 3.
    Without the recorder (``flight_recorder=False``: no dump read or asked for, no debug server)
    the same hang names no culprit: the stacks alone show a rank left in a subgroup, not who left."""
    dumps = tmp_path / "fr"
    job = jobs.torchrun("hang_subgroup.py", nproc=4, args=["--groups", "helper", "--probe", str(dumps)])
    job.wait_ready(timeout=READY_S)
    report = settle(
        job.pid, lambda r: r.verdict.kind == "mismatched_collectives" and "subgroup" in r.verdict.summary
    )
    v = report.verdict
    assert v.suspect_ranks == [3], v
    assert "flight recorder:" in v.summary
    assert any("flight recorder" in n for n in report.job.notes)
    assert sorted(p.name for p in dumps.glob("fr_trace_rank_*")) == [f"fr_trace_rank_{r}" for r in range(4)]
    assert len(list(dumps.glob(".rankscope-probe-*.json"))) == 4
    # the ranks were only asked for a dump: still alive, still waiting
    assert job.proc.poll() is None
    again = dump_stacks(job.pid, DumpOptions(flight_recorder=False))
    w = again.verdict
    assert w.kind == "mismatched_collectives" and w.suspect_ranks == [] and w.confidence == "low", w
    assert "rank 2 waits in all_reduce" in w.summary and "on a subgroup" in w.summary
    assert "flight recorder" not in w.summary and not any("flight recorder" in n for n in again.job.notes)
    assert {s.rank: s.subgroup for s in again.stacks}[2] is True
    assert all(f.locals is None for s in again.stacks for t in s.threads for f in t.frames)


def test_rank_left_waiting_in_a_subgroup_is_named_from_the_debug_servers_recorder(
    jobs: JobFactory, pyspy_works: str
) -> None:
    """No local names the members and no dump channel is open, but the job started torch's debug
    server: the stacks leave the verdict unsure, so stacks reads every rank's recorder from the
    worker servers registered in the job's store, and the recorder names rank 3."""
    from tests.jobs import free_port

    job = jobs.torchrun(
        "hang_subgroup.py", nproc=4, args=["--groups", "helper", "--debug-server", str(free_port())]
    )
    job.wait_ready(timeout=READY_S)
    report = settle(job.pid, lambda r: r.verdict.suspect_ranks == [3])
    assert "flight recorder:" in report.verdict.summary
    assert any("trace(s) from the job's debug server" in n for n in report.job.notes)
    assert job.proc.poll() is None


def test_a_loop_in_an_installed_library_names_where_the_ranks_part(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    """The training loop lives in a real installed package (trainlib, pip-installed into a
    site-packages folder); one rank drops a batch inside it and ends in the library's checkpoint
    barrier. The verdict names the library frame where that rank left the others, and the repro
    is the data-dependent skip."""
    from rankscope.analysis.templates import choose_from_stacks

    site = tmp_path / "site-packages"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(PROGRAMS / "trainlib_pkg")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    assert (site / "trainlib" / "trainer.py").is_file() and list(site.glob("trainlib-*.dist-info"))
    env = {"PYTHONPATH": f"{site}{os.pathsep}{PROGRAMS}"}
    job = jobs.torchrun("hang_library.py", nproc=3, args=["--odd", "1"], env=env)
    job.wait_ready(["rank0", "rank1", "rank2"], timeout=READY_S)
    report = settle(job.pid, lambda r: r.verdict.suspect_ranks == [1] and len(r.groups) == 2)
    v = report.verdict
    assert v.kind == "mismatched_collectives"
    # the ranks part in the library's loop, not at the user's trainer.fit() line they share, and
    # the loop's body holds the data check that sent rank 1 out of a step
    assert "rank 1 has left the loop at trainer.py:22 `for batch in batches`" in v.summary, v.summary
    assert (
        "`not torch.isfinite(loss)` (trainer.py:24) sends some ranks to the `continue` at trainer.py:25"
        in (v.summary)
    )
    assert v.next_steps[0].action.startswith(
        "Fix: all_reduce the flag first, so every rank takes the `continue`"
    )
    ops = {g.op: g for g in report.groups}
    assert set(ops) == {"all_reduce", "barrier"} and ops["barrier"].ranks == [1]
    choice = choose_from_stacks(report)
    assert choice.template == "nonfinite_skip" and choice.params["bad_rank"] == 1
