"""What one host saw of a job: evidence, not a verdict.

A host of a multi-host call (``rankscope stacks --local --json``) hands its evidence to the
collecting host, which merges every host's and judges the job once, with the source lines the
ranks' frames need (guards, loops, the condition that sent a rank out): the same answer as if
every rank ran on one host. A host that saw several jobs and was told none returns them as
choices, so the collecting host can list the jobs once for all hosts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.base import Model
from rankscope.models.core import CodeRoots, Job, RankError, RankStack
from rankscope.models.flight import FlightReport
from rankscope.models.progress import Progress
from rankscope.models.ras import RasFinding
from rankscope.models.startup import StartupFacts

ChosenBy = Literal["pid", "job_id", "folder", "only"]
"""How the host picked the job: the pid or job id it was given, the folder the call was made
from (the job started there), or the only job on the host."""


class SourceLine(Model):
    """One line of a rank's source file, read on the host that runs the rank."""

    file: str
    line: int
    text: str


class WorkerLine(Model):
    """One busy DataLoader worker (or feeder thread) of a rank that waits on it, found on the rank's
    host: where it waits, and on what (its line and its kernel wait). The verdict carries the lines
    of the ranks it names."""

    rank: int
    text: str


class JobChoice(Model):
    """One job of a host that runs several, as a person knows it: id, ranks here, folder."""

    job_id: str
    world_size: int | None = None
    ranks: list[int] = Field(default_factory=list, description="The job's ranks on this host.")
    launcher_pids: list[int] = Field(default_factory=list)
    cwd: str | None = Field(default=None, description="The folder the job was started in.")


class HostLook(Model):
    """One host's evidence for the collecting host's single verdict."""

    host: str
    job: Job | None = None
    chosen_by: ChosenBy | None = None
    stacks: list[RankStack] = Field(default_factory=list)
    errors: list[RankError] = Field(default_factory=list)
    progress: Progress | None = None
    flight: FlightReport | None = None
    ras: RasFinding | None = None
    source: list[SourceLine] = Field(
        default_factory=list,
        description="The source lines the ranks' frames need (guards, loops, call sites).",
    )
    workers: list[WorkerLine] = Field(
        default_factory=list,
        description="The busy workers (or threads) of each rank whose main thread waits on them.",
    )
    worker_servers: bool = Field(
        default=False,
        description="Some rank listens on [::], where torch's debug server binds its worker servers.",
    )
    choices: list[JobChoice] = Field(
        default_factory=list, description="Several jobs here and none chosen: each of them; no job then."
    )
    absent: str | None = Field(
        default=None, description="Why no rank of the job runs here (no job here, or not the one asked for)."
    )
    code_roots: CodeRoots | None = Field(
        default=None,
        description="Where the ranks' interpreter imports its code from, read from the ranks: what tells the "
        "job's own frames from the libraries' on the host that judges them.",
    )
    startup: list[StartupFacts] = Field(
        default_factory=list,
        description="A job in start-up (or no job here): each host's launchers' settings, who listens at the store.",
    )
