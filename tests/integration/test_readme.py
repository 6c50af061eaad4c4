"""README.md runs as written: its quick start on a real 4-rank gloo job, every console block's
commands against it, each shown output compared with the real one.

One job serves every block (start-up is the expensive part on 2 cores). What may differ from the
README is only what differs from run to run (tests/readme.py ``normalised``: pids, ports, paths,
the host, timings, percentages); the job id is compared as printed. Every command, torchrun's
too, runs as a reader's would: in a fresh bash whose PATH the test leaves without any virtualenv,
after README's own shell lines (``source .venv/bin/activate``, from the repository root), in the
demo folder; torchrun starts as README says, with no port given. One thing a reader would do
differently here: ``rankscope ps`` runs with the job's ``--pid``, because other jobs run on this
host while the suite does; a ``--pid N`` in a command is the job's launcher. A second test runs
the script on 2 ranks, where it must train and exit cleanly.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from tests.jobs import JobFactory, RunningJob, free_port, wait_for
from tests.paths import ROOT
from tests.readme import README, Block, Step, blocks, normalised, steps


def _write_files(folder: Path) -> None:
    for block in blocks():
        if block.mark == "file":
            (folder / block.arg).write_text(block.text)


def _fresh_env() -> dict[str, str]:
    """This environment as a new login's shell has it: no virtualenv on PATH (the README's shell
    lines must put the tools there), none active."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    kept = [p for p in env.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "activate").exists()]
    env["PATH"] = os.pathsep.join(kept) or os.defpath
    return env


def _in_shell(command: str, folder: Path) -> list[str]:
    """``bash -c`` running README's shell lines from the repository root, then ``command`` in ``folder``."""
    prelude = "".join(b.text for b in blocks() if b.mark == "shell")
    script = f"cd {shlex.quote(str(ROOT))}\n{prelude}cd {shlex.quote(str(folder))}\n{command}"
    return ["bash", "-c", script]


def _torchrun(jobs: JobFactory, folder: Path, nproc: int) -> RunningJob:
    """``torchrun --nproc_per_node=N train.py`` as README says it (the launcher keeps the shell's pid)."""
    command = f"torchrun --nproc_per_node={nproc} train.py"
    assert f"`{command}`" in README.read_text(encoding="utf-8")
    env = {"PATH": _fresh_env()["PATH"]}
    return jobs.start(_in_shell(f"exec {command}", folder), nproc, free_port(), env, tag="readme", cwd=folder)


def _run(command: str, folder: Path, launcher: int) -> subprocess.CompletedProcess[str]:
    """One ``$ `` line as a reader runs it, in the demo folder, after README's shell lines."""
    command = re.sub(r"--pid \d+", f"--pid {launcher}", command)
    if command.strip() == "rankscope ps":
        command += f" --pid {launcher}"
    return subprocess.run(
        _in_shell(command, folder),
        cwd=folder,
        env=_fresh_env(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def _hung(folder: Path, launcher: int) -> bool:
    """The readiness signal: the job reached its hang (every rank waits where the README says)."""
    out = _run(f"rankscope stacks --pid {launcher} --json --window 0", folder, launcher)
    if out.returncode != 0:
        return False
    return bool(json.loads(out.stdout)["verdict"]["kind"] == "mismatched_collectives")


def _check(step: Step, block: Block, folder: Path, launcher: int) -> None:
    out = _run(step.command, folder, launcher)
    assert out.returncode == 0, (
        f"README.md:{block.line} `$ {step.command}` exited {out.returncode}:\n{out.stderr}"
    )
    host = socket.gethostname()
    shown = normalised("\n".join(step.shown), folder="/tmp/demo", host="vm")
    real = normalised(out.stdout, folder=str(folder), host=host)
    assert real == shown, (
        f"README.md:{block.line} `$ {step.command}` prints otherwise:\n{out.stdout}\n{out.stderr}"
    )


@pytest.mark.slow
def test_every_console_block_prints_what_the_readme_shows(
    jobs: JobFactory, tmp_path: Path, pyspy_works: str
) -> None:
    folder = tmp_path / "demo"
    folder.mkdir()
    _write_files(folder)
    job = _torchrun(jobs, folder, 4)
    wait_for(lambda: "step 0" in job.output(), 120, "the quick start's first step", detail=job.last_output)
    wait_for(lambda: _hung(folder, job.pid), 120, "the quick start's hang", 1.0, job.last_output)
    consoles = [b for b in blocks() if b.mark is None]
    assert consoles
    for block in consoles:
        for step in steps(block):
            _check(step, block, folder, job.pid)


@pytest.mark.slow
def test_the_quick_start_trains_and_exits_cleanly_on_two_ranks(jobs: JobFactory, tmp_path: Path) -> None:
    """On 2 ranks rank 2 does not exist: 100 steps, destroy_process_group, exit 0, no abort at exit."""
    _write_files(tmp_path)
    job = _torchrun(jobs, tmp_path, 2)
    assert job.wait_exit(240, "the quick start to train and exit on two ranks") == 0, job.output()
    output = job.output()
    assert "step 90" in output and "terminate called" not in output
