"""The start-up verdict on hand-built facts: each rule names the node, the setting and the fix."""

from __future__ import annotations

from collections.abc import Callable

from rankscope.analysis.launcher_args import env_settings, launcher_kind, store_address, torchrun_settings
from rankscope.analysis.startup import init_wait, startup_verdict
from rankscope.models.core import Frame, Job, RankProcess, RankStack, ThreadStack
from rankscope.models.startup import LauncherFacts, Listener, StartupFacts

TORCHRUN = ["/venv/bin/python", "-m", "torch.distributed.run"]


def _agent(host: str, pid: int, *args: str) -> LauncherFacts:
    argv = [*TORCHRUN, *args, "train.py", "--nnodes", "9"]
    return LauncherFacts(host=host, pid=pid, kind="torchrun", settings=torchrun_settings(argv, {}))


def _static(host: str, pid: int, node_rank: int, port: int, nnodes: int = 2) -> LauncherFacts:
    return _agent(
        host, pid, f"--nnodes={nnodes}", f"--node_rank={node_rank}", "--nproc_per_node=2",
        "--master_addr=10.0.0.1", f"--master_port={port}",
    )  # fmt: skip


def _store(host: str, port: int, pid: int | None, of_job: bool = True) -> Listener:
    return Listener(host=host, port=port, address="0.0.0.0", pid=pid, command="python x", of_job=of_job)


EMPTY = Job(job_id="torchrun:10.0.0.1:29500", launcher="torchrun")


def test_torchrun_settings_read_as_torchrun_reads_them() -> None:
    argv = [
        *TORCHRUN,
        "--nnodes",
        "1:3",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv_endpoint",
        "h1",
    ]
    got = torchrun_settings([*argv, "train.py", "--rdzv_id", "x"], {"PET_RDZV_ID": "job7"})
    assert got["rdzv_id"] == "job7"  # the script's own --rdzv_id is not torchrun's
    assert got["store"] == "h1:29400" and got["world_size"] == "12" and "master_port" not in got
    static = torchrun_settings(["torchrun", "train.py"], {})
    assert static["store"] == "127.0.0.1:29500" and static["nnodes"] == "1"
    assert launcher_kind(["/usr/bin/python3", "/venv/bin/torchrun", "x.py"]) == "torchrun"
    assert launcher_kind(["mpirun", "-np", "4", "python", "x.py"]) == "mpirun"
    assert launcher_kind(["python", "train.py"]) is None
    assert env_settings({"MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "4"})["store"] == "a:1"
    assert store_address({"store": "[::1]:5"}) == ("::1", 5)


def test_the_node_with_another_master_port_is_named_with_the_fix() -> None:
    facts = [
        StartupFacts(
            host="node1", launchers=[_static("node1", 10, 0, 29500)], listeners=[_store("node1", 29500, 10)]
        ),
        StartupFacts(host="node2", launchers=[_static("node2", 20, 1, 29511)]),
    ]
    ruled = startup_verdict(EMPTY, facts, [], remote=True)
    assert ruled is not None
    verdict, finding = ruled
    assert verdict.kind == "startup" and verdict.confidence == "high"
    assert verdict.summary.startswith(
        "starting: rendezvous: node2 was launched with --master_port=29511, node1 with"
    )
    assert "Relaunch node2 with --master_port=29500" in verdict.next_steps[0].action
    assert finding.differences[0].odd_hosts == ["node2"]


def test_a_node_never_launched() -> None:
    facts = [
        StartupFacts(
            host="node1", launchers=[_static("node1", 10, 0, 29500)], listeners=[_store("node1", 29500, 10)]
        ),
        StartupFacts(host="node2"),
    ]
    verdict, finding = startup_verdict(EMPTY, facts, [], remote=True) or (None, None)
    assert verdict is not None and finding is not None
    assert "1 of 2 nodes joined (node1); node2 (node_rank 1) runs no launcher" in verdict.summary
    assert finding.missing_hosts == ["node2"]
    # from the job's own host alone, the other node cannot be named: said, at lower confidence
    local, _ = startup_verdict(EMPTY, facts[:1], [], remote=False) or (None, None)
    assert local is not None and local.confidence == "medium"
    assert "wait in rendezvous at 10.0.0.1:29500 for 1 more node(s) (node_rank 1)" in local.summary
    assert "--hosts" in local.next_steps[0].action


def test_nnodes_and_rdzv_id_differ_without_a_majority() -> None:
    facts = [
        StartupFacts(host="node1", launchers=[_static("node1", 10, 0, 29500, nnodes=2)]),
        StartupFacts(host="node2", launchers=[_static("node2", 20, 1, 29500, nnodes=3)]),
    ]
    verdict, _ = startup_verdict(EMPTY, facts, [], remote=True) or (None, None)
    assert verdict is not None
    assert "the launchers disagree on --nnodes (node1 --nnodes=2, node2 --nnodes=3)" in verdict.summary
    c10d = ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400"]
    ids = [
        StartupFacts(host="node1", launchers=[_agent("node1", 10, *c10d, "--rdzv_id=today")]),
        StartupFacts(host="node2", launchers=[_agent("node2", 20, *c10d, "--rdzv_id=yesterday")]),
    ]
    verdict, _ = startup_verdict(EMPTY, ids, [], remote=True) or (None, None)
    assert (
        verdict is not None
        and "--rdzv_id (node1 --rdzv_id=today, node2 --rdzv_id=yesterday)" in verdict.summary
    )


def test_the_store_port_held_by_another_process() -> None:
    said = "/shared/job.log: torch.distributed.DistNetworkError: address already in use"
    agent = _static("node2", 20, 1, 29500).model_copy(update={"log_line": said})
    facts = [
        StartupFacts(host="node1", listeners=[_store("node1", 29500, 77, of_job=False)]),
        StartupFacts(host="node2", launchers=[agent]),
    ]
    verdict, _ = startup_verdict(EMPTY, facts, [], remote=True) or (None, None)
    assert verdict is not None
    assert (
        "port 29500 on node1 is held by pid 77 (python x), no launcher or rank of this job" in verdict.summary
    )
    assert "node1 runs no launcher of the job" in verdict.summary
    assert f"log: {said}" in verdict.evidence  # the shared log says why node1's launcher is gone


def test_master_addr_resolved_elsewhere_on_one_node() -> None:
    agents = [
        _static("node1", 10, 0, 29500),
        _static("node2", 20, 1, 29500),
        _static("node3", 30, 2, 29500, 3),
    ]
    facts = [
        StartupFacts(host=a.host, launchers=[a.model_copy(update={"settings": {**a.settings, "nnodes": "3"}})],
                     resolved={"10.0.0.1": [ip]})
        for a, ip in zip(agents, ["10.0.0.1", "10.0.0.1", "10.9.9.9"], strict=True)
    ]  # fmt: skip
    verdict, _ = startup_verdict(EMPTY, facts, [], remote=True) or (None, None)
    assert verdict is not None and "node3 looks for the store elsewhere" in verdict.summary


def _waiting(rank: int, host: str, function: str = "init_process_group") -> RankStack:
    frames = [Frame(function="_create_c10d_store", file="torch/distributed/rendezvous.py", line=199),
              Frame(function=function, file="torch/distributed/distributed_c10d.py", line=1),
              Frame(function="main", file="train.py", line=19)]  # fmt: skip
    return RankStack(
        rank=rank, pid=100 + rank, host=host, threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
    )


def test_ranks_in_init_wait_for_a_rank_that_never_started() -> None:
    job = Job(
        job_id="env:10.0.0.1:29500", launcher="env", world_size=4, missing_ranks=[3],
        ranks=[RankProcess(rank=r, pid=100 + r, host="node1" if r < 2 else "node2") for r in range(3)],
    )  # fmt: skip
    stacks = [_waiting(r, "node1" if r < 2 else "node2") for r in range(3)]
    assert init_wait(stacks[0]) == "init_process_group"
    facts = [StartupFacts(host="node1"), StartupFacts(host="node2")]
    verdict, finding = startup_verdict(job, facts, stacks, remote=True) or (None, None)
    assert verdict is not None and finding is not None
    assert verdict.summary.startswith(
        "starting: init: ranks 0-2 wait in init_process_group for rank 3 of world size 4"
    )
    assert verdict.suspect_ranks == [3] and "WORLD_SIZE=4" in verdict.next_steps[0].action
    # a rank past start-up: the hang rules decide
    past = RankStack(rank=2, pid=102, host="node2", threads=[ThreadStack(thread_id=1, is_main=True, frames=[
        Frame(function="all_reduce", file="torch/distributed/distributed_c10d.py", line=2)])])  # fmt: skip
    assert startup_verdict(job, facts, [*stacks[:2], past], remote=True) is None


def test_every_rank_present_and_waiting_points_at_the_network() -> None:
    job = Job(
        job_id="env:10.0.0.1:29500", launcher="env", world_size=2,
        ranks=[RankProcess(rank=r, pid=100 + r, host="node1") for r in range(2)],
    )  # fmt: skip
    verdict, _ = startup_verdict(job, [StartupFacts(host="node1")], [_waiting(0, "node1"), _waiting(1, "node1")],
                                 remote=False) or (None, None)  # fmt: skip
    assert verdict is not None and verdict.confidence == "low"
    assert (
        "every rank of world size 2 runs" in verdict.summary
        and "GLOO_SOCKET_IFNAME" in verdict.next_steps[0].action
    )


def test_a_rank_still_importing_is_not_a_start_up_hang() -> None:
    """A slow start (one rank still in its imports) leaves the verdict to the window and the hang rules."""
    job, facts, stacks = _init_case()
    importing = RankStack(rank=2, pid=102, host="node2", threads=[ThreadStack(thread_id=1, is_main=True, frames=[
        Frame(function="_find_and_load", file="<frozen importlib._bootstrap>", line=1186),
        Frame(function="<module>", file="train.py", line=3)])])  # fmt: skip
    assert startup_verdict(job, facts, [*stacks[:2], importing], remote=True) is None


def _port_case() -> tuple[Job, list[StartupFacts], list[RankStack]]:
    facts = [
        StartupFacts(
            host="node1", launchers=[_static("node1", 10, 0, 29500)], listeners=[_store("node1", 29500, 10)]
        ),
        StartupFacts(host="node2", launchers=[_static("node2", 20, 1, 29511)]),
    ]
    return EMPTY, facts, []


def _init_case() -> tuple[Job, list[StartupFacts], list[RankStack]]:
    job = Job(
        job_id="env:10.0.0.1:29500", launcher="env", world_size=4, missing_ranks=[3],
        ranks=[RankProcess(rank=r, pid=100 + r, host="node1" if r < 2 else "node2") for r in range(3)],
    )  # fmt: skip
    stacks = [_waiting(r, "node1" if r < 2 else "node2") for r in range(3)]
    return job, [StartupFacts(host="node1"), StartupFacts(host="node2")], stacks


CASES: dict[str, Callable[[], tuple[Job, list[StartupFacts], list[RankStack]]]] = {
    "master_port": _port_case,
    "rank_never_started": _init_case,
}
"""Start-up cases the verdict golden file keeps word for word."""


def test_every_hosts_facts_are_judged_together_under_the_hosts_names() -> None:
    """The collecting host merges each host's look (a host with no launcher of the job still
    hands its facts) and names the hosts as the call named them."""
    from rankscope.capabilities.remote import judge_looks
    from rankscope.models.look import HostLook

    job = EMPTY.model_copy(
        update={"launcher_pid": 10, "launcher_pids": [10], "notes": ["starting: rendezvous: x"]}
    )
    facts = StartupFacts(
        host="n1.cluster",
        launchers=[_static("n1.cluster", 10, 0, 29500)],
        listeners=[_store("n1.cluster", 29500, 10)],
    )
    looks = {
        "node1": HostLook(host="n1.cluster", job=job, chosen_by="folder", startup=[facts]),
        "node2": HostLook(
            host="n2.cluster", absent="No distributed PyTorch job found.", startup=[StartupFacts(host="n2")]
        ),
    }
    report = judge_looks(looks, ["node1", "node2"], [])
    assert report.verdict.kind == "startup", report.verdict
    assert "1 of 2 nodes joined (node1); node2 (node_rank 1) runs no launcher" in report.verdict.summary


def test_a_start_that_moves_keeps_its_progress_verdict() -> None:
    """Ranks in init whose window saw them move (a slow filesystem, a big import under it) are not hung."""
    from rankscope.capabilities.judge import judge_look
    from rankscope.models.look import HostLook
    from rankscope.models.progress import Progress, RankMotion

    job, facts, stacks = _init_case()
    moving = Progress(
        motion="moving", window_s=2.0, looks=2, summary="every rank moved",
        ranks=[RankMotion(rank=r, motion="moving") for r in range(3)],
    )  # fmt: skip
    look = HostLook(host="node1", job=job, stacks=stacks, progress=moving, startup=facts)
    assert judge_look(look, remote=True).verdict.kind == "progressing"
    still = look.model_copy(update={"progress": None})
    assert judge_look(still, remote=True).verdict.kind == "startup"
