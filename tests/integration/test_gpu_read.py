"""Each rank's GPU utilisation through a stand-in nvidia-smi that prints the real CSV format."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.capabilities.gpu_read import gpu_utilisation
from rankscope.models.core import Job, RankProcess


def _fake_smi(tmp: Path, apps: str) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-gpu=*) printf "0, GPU-aaa, 100\\n1, GPU-bbb, 0\\n" ;;\n'
        f'  --query-compute-apps=*) printf "{apps}" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    return bin_dir


def test_utilisation_per_rank_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        apps = f"{procs[0].pid}, GPU-aaa\\n{procs[1].pid}, GPU-bbb\\n"
        monkeypatch.setenv("PATH", f"{_fake_smi(tmp_path, apps)}{os.pathsep}{os.environ['PATH']}")
        job = Job(job_id="j", ranks=[RankProcess(rank=r, pid=p.pid, host="h") for r, p in enumerate(procs)])
        assert gpu_utilisation(job) == {0: 100, 1: 0}
        assert gpu_utilisation(job.model_copy(update={"backend": "gloo"})) == {}
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_no_nvidia_smi_gives_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_utilisation(Job(job_id="j", ranks=[RankProcess(rank=0, pid=os.getpid(), host="h")])) == {}
