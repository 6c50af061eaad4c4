"""The agent benchmark's incidents: where each one lives and how it is set up.

Shared by ``setup_incident.py`` (hands an incident to an agent) and ``bytecost.py`` (the
deterministic byte count of the rankscope path). Nothing here reads ``truth/`` except
:func:`culprits`, which only the measuring scripts call.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
INCIDENTS = HERE / "incidents"
TRUTH = HERE / "truth"
JOBS = HERE / "jobs"


@dataclass(frozen=True)
class Incident:
    name: str
    folder: Path

    @property
    def live(self) -> bool:
        return (self.folder / "job.json").is_file()

    @property
    def spec(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.folder / "job.json").read_text(encoding="utf-8"))
        return data

    @property
    def multinode(self) -> bool:
        """Jobs over several nodes on this machine, the agent on a login node (multinode.py)."""
        return self.live and "nodes" in self.spec

    def description(self, workdir: Path) -> str:
        return (self.folder / "incident.md").read_text(encoding="utf-8").replace("{workdir}", str(workdir))


def all_incidents() -> list[Incident]:
    return [Incident(p.name, p) for p in sorted(INCIDENTS.iterdir()) if (p / "incident.md").is_file()]


def by_name(name: str) -> Incident:
    for incident in all_incidents():
        if incident.name == name:
            return incident
    names = ", ".join(i.name for i in all_incidents())
    raise SystemExit(f"no incident {name!r}; the incidents are: {names}")


def culprits() -> dict[str, list[int]]:
    """The ranks each incident's truth blames (for the measuring scripts only, never the agent)."""
    data: dict[str, list[int]] = json.loads((TRUTH / "culprits.json").read_text(encoding="utf-8"))
    return data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_up(
    incident: Incident, workdir: Path, python: str = sys.executable, wait_s: float = 120.0
) -> int | None:
    """Prepare ``workdir`` for ``incident``: copy a dead job's leftovers, or start a live job there.

    Returns the live job's launcher pid (None for a dead job). A live job's script is copied as
    ``train.py`` so its file name says nothing; its pid is written beside ``workdir``, not in it.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if incident.multinode:
        import multinode

        multinode.set_up(incident.spec, JOBS, workdir)
        return None
    if not incident.live:
        shutil.copytree(incident.folder / "leftovers", workdir / "leftovers", dirs_exist_ok=True)
        return None
    spec = json.loads((incident.folder / "job.json").read_text(encoding="utf-8"))
    shutil.copy(JOBS / spec["script"], workdir / "train.py")
    if spec.get("prepare"):  # the job's files (data, a checkpoint), made by a script the agent never sees
        subprocess.run([python, str(JOBS / spec["prepare"])], cwd=workdir, check=True, timeout=600)
    log = (workdir / "job.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [python, "-m", "torch.distributed.run", f"--nproc_per_node={spec['nproc']}",
           f"--master_port={_free_port()}", "train.py"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    pid_file(workdir).write_text(str(proc.pid))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:  # started: every rank has printed once
        if (workdir / "job.log").read_text(errors="replace").count(" step ") >= spec["nproc"]:
            break
        time.sleep(0.5)
    time.sleep(float(spec.get("settle_s", 5)))
    return proc.pid


def pid_file(workdir: Path) -> Path:
    return workdir.parent / f"{workdir.name}.launcher-pid"


def stop(workdir: Path) -> None:
    """End a live incident's job by its process tree, started by :func:`set_up`.

    A multi-node incident's jobs and nodes are stopped by :func:`multinode.stop`. Not by its
    process group: torchrun starts each worker in a session of its own, so a signal
    to the launcher's group leaves the ranks running, orphaned.
    """
    import multinode

    from rankscope.runtime.proctree import reap_tree

    multinode.stop(workdir)
    path = pid_file(workdir)
    if not path.is_file():
        return
    reap_tree(int(path.read_text()))
    path.unlink()
