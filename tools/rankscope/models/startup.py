"""A job in start-up: what each host reads of its launchers, and the verdict on who is missing.

The most common multi-node incident has no training stack at all: the launchers wait in
rendezvous for a node that was launched with another port, another ``--nnodes``, yesterday's
rendezvous id, or never launched; or the ranks wait in ``init_process_group`` for a rank that
never started. Each host reads its own launchers' arguments and environment, who listens at the
store's address, and where it resolves the master's name (:class:`StartupFacts`); the collecting
host compares them (``rankscope.analysis.startup``) and names the node, the setting that differs
and the fix (:class:`StartupFinding`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.base import Model

StartupState = Literal["starting: rendezvous", "starting: init"]
"""``rendezvous``: launchers run and no rank has started yet; ``init``: ranks run, none past its
first process group (blocked in ``init_process_group``, a TCPStore connect or wait, the
rendezvous barrier, ``init_device_mesh``)."""


class LauncherFacts(Model):
    """One launcher process (a torchrun agent, mpirun) as its host reads it."""

    host: str
    pid: int
    kind: str = Field(description="torchrun | mpirun")
    settings: dict[str, str] = Field(
        default_factory=dict,
        description="What it was told, from its arguments then its environment: nnodes, nproc_per_node, "
        "node_rank, master_addr, master_port, rdzv_backend, rdzv_endpoint, rdzv_id, store (the address the "
        "store is reached at), world_size, backend.",
    )
    ranks: int = Field(default=0, description="Its live ranks (0: none started yet).")
    cwd: str | None = None
    log_line: str | None = Field(
        default=None, description="The last error line of the file its output goes to (a shared job log too)."
    )


class Listener(Model):
    """A process listening on a TCP port the job's store uses, as one host sees it."""

    host: str
    port: int
    address: str = Field(description="The address it listens on (0.0.0.0, 127.0.0.1, ::).")
    pid: int | None = Field(
        default=None, description="None: the socket is there, its process not visible here."
    )
    command: str | None = Field(default=None, description="Its command line, redacted and clipped.")
    of_job: bool = Field(default=False, description="One of this job's launchers or ranks.")
    connections: int = Field(
        default=0, description="Established connections to the port, as this host sees them."
    )


class InitWait(Model):
    """A rank whose main thread waits before its first collective, and where."""

    rank: int
    host: str
    where: str = Field(description="The start-up call it waits in (init_process_group, TCPStore, ...).")


class StartupFacts(Model):
    """What one host reads of a job in start-up (or of nothing, when no launcher of it runs here)."""

    host: str
    launchers: list[LauncherFacts] = Field(default_factory=list)
    listeners: list[Listener] = Field(default_factory=list)
    resolved: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Each master or endpoint name and the addresses it resolves to here.",
    )
    exited: list[str] = Field(
        default_factory=list,
        description="Ranks or launchers of the job that already exited, with their last line.",
    )


class Difference(Model):
    """One setting the launchers disagree on."""

    setting: str
    values: dict[str, str] = Field(description="host -> value (a launcher without it: 'default').")
    odd_hosts: list[str] = Field(
        default_factory=list, description="The hosts whose value differs from the reference."
    )
    reference: str | None = Field(default=None, description="The value the others (or the store's node) use.")


class StartupFinding(Model):
    """The start-up verdict's facts: who joined, who is missing, and what differs."""

    state: StartupState
    joined_hosts: list[str] = Field(default_factory=list)
    missing_hosts: list[str] = Field(
        default_factory=list, description="Hosts of the call with no launcher or rank of the job."
    )
    expected_nodes: int | None = None
    missing_ranks: list[int] = Field(default_factory=list)
    differences: list[Difference] = Field(default_factory=list)
    listeners: list[Listener] = Field(default_factory=list)
    waiting: list[InitWait] = Field(default_factory=list)


__all__ = [
    "Difference",
    "InitWait",
    "LauncherFacts",
    "Listener",
    "StartupFacts",
    "StartupFinding",
    "StartupState",
]
