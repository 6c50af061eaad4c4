"""`rankscope env` against real torchrun jobs on CPU/gloo: diffs, shared GPUs, secrets, node facts."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from rankscope.capabilities.envinfo import collect_env
from rankscope.cli import main
from tests.jobs import JobFactory, free_port

SECRETS = {
    "TORCH_HUB_TOKEN": "tok-9f8e7d6c5b4a3210",
    "WANDB_API_KEY": "wandbkey-0123456789abcdef",
    "DB_PASSWORD": "hunter2-pa55word",
    "TORCH_STORE_URL": "https://alice:s3cretUrlPw@store.example.com/run",
}
SECRET_VALUES = ("tok-9f8e7d6c5b4a3210", "wandbkey-0123456789abcdef", "hunter2-pa55word", "s3cretUrlPw")
LEAKS = (*SECRET_VALUES, "cmdlinePw77")  # the last one is in a URL on the ranks' command line


def _two_node_launch(jobs: JobFactory) -> tuple[int, int]:
    """Two torchrun agents on this host (--nnodes=2), each with one rank, differing in NCCL_ALGO."""
    port = free_port()
    launchers = []
    for node_rank, algo in ((0, "Ring"), (1, "Tree")):
        job = jobs.torchrun_node(
            "env_hold.py",
            node_rank,
            1,
            port,
            args=["--db-url", "postgres://bob:cmdlinePw77@db.example.com/x"],
            env={"NCCL_ALGO": algo, **SECRETS},
        )
        launchers.append(job)
    launchers[0].wait_ready(["rank0"], timeout=90)
    launchers[1].wait_ready(["rank1"], timeout=90)
    return launchers[0].pid, launchers[1].pid


def test_ranks_differing_in_one_nccl_variable_and_secrets_redacted(jobs: JobFactory) -> None:
    pid0, _ = _two_node_launch(jobs)
    report = collect_env(pid0, include_torch=False)

    assert sorted(r.rank for r in report.ranks if r.rank is not None) == [0, 1]
    diff = {d.name: d for d in report.differences}
    assert set(diff) == {"NCCL_ALGO"}, diff
    assert diff["NCCL_ALGO"].values == {"0": "Ring", "1": "Tree"}
    mismatch = [f for f in report.findings if f.kind == "env_mismatch"]
    assert len(mismatch) == 1 and mismatch[0].ranks == [0, 1] and mismatch[0].severity == "error"
    assert mismatch[0].facts["variable"] == "NCCL_ALGO"
    for r in report.ranks:
        assert r.torch_version and r.torch_version.startswith("2.13.0")
        assert r.python and "python" in r.python
        assert r.env["TORCH_HUB_TOKEN"] == "<redacted>"
        assert r.env["WORLD_SIZE"] == "2"

    dumped = report.model_dump_json()
    for value in LEAKS:
        assert value not in dumped

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["env", "--pid", str(pid0), "--no-torch", "--json"]) == 0
    text = out.getvalue()
    assert json.loads(text)["differences"][0]["name"] == "NCCL_ALGO"
    for value in LEAKS:
        assert value not in text

    human = io.StringIO()
    with redirect_stdout(human):
        assert main(["env", "--pid", str(pid0), "--no-torch"]) == 0
    assert "NCCL_ALGO: rank 0=Ring, rank 1=Tree" in human.getvalue()
    for value in LEAKS:
        assert value not in human.getvalue()


def test_two_ranks_given_the_same_gpu_and_dataloader_workers(jobs: JobFactory) -> None:
    job = jobs.torchrun("env_hold.py", nproc=2, args=["--workers", "1"], env={"CUDA_VISIBLE_DEVICES": "0"})
    job.wait_ready(["rank0", "rank1"], timeout=90)
    report = collect_env(job.pid, include_torch=False)

    shared = [f for f in report.findings if f.kind == "gpu_shared"]
    assert len(shared) == 1, report.findings
    assert shared[0].ranks == [0, 1]
    assert shared[0].facts["gpu"] == "0"
    assert all(r.children >= 1 for r in report.ranks), [r.children for r in report.ranks]
    assert not report.differences
    assert report.job is not None and report.job.launcher == "torchrun"


def test_node_facts_on_a_machine_without_nvidia_driver() -> None:
    report = collect_env(None)
    node = report.node
    assert node.gpus == [] and node.gpu_note and "no NVIDIA driver" in node.gpu_note
    assert node.xid_note and "NVIDIA" in node.xid_note
    assert node.torch is not None and node.torch.available and node.torch.version
    assert node.torch.version.startswith("2.13.0")
    assert node.torch.backends.get("gloo") is True
    assert node.torch.collect_env.get("torch_version", "").startswith("2.13.0")
    assert node.cpus and node.memory_total_bytes and node.shm.size_bytes
    assert any(i.name == "lo" and "127.0.0.1" in i.addresses for i in node.interfaces)
    assert node.limits.open_files_soft is None or node.limits.open_files_soft > 0
    # without --pid, this shell's own variables are checked
    assert len(report.ranks) == 1
