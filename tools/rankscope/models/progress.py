"""Whether a live job makes progress, read from several looks at each rank over a short window.

One instant of a moving job looks like a hang: ranks stand in collectives, one rank is a step
ahead. So every live capture first watches the job for a moment (``window_s``) and says what
moved. These models carry that answer; :mod:`rankscope.analysis.hang.progress` computes them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.base import Model

Motion = Literal["moving", "busy", "blocked", "unknown"]
"""One rank over the window: ``moving`` = its loop counters, the lines of its own code, its I/O (bytes
read or written, a file wait in the kernel) or the locals of its own frames changed;
``busy`` = same place, but it burns CPU in its own code (a long evaluation, a checkpoint write, a
compile); ``blocked`` = same stack and no CPU of its own (or a wait for a collective or the GPU);
``unknown`` = not looked at twice."""

JobMotion = Literal["moving", "busy", "no_progress", "unknown"]
"""The job over the window: ``moving`` = every rank moved; ``busy`` = no rank is blocked, but not
every one moved (they compute); ``no_progress`` = some rank is blocked; ``unknown`` = one look only."""


class RankMotion(Model):
    """What one rank did during the window."""

    rank: int
    motion: Motion
    counters: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Progress counters that moved, 'file:function:name' -> [first, last] value.",
    )
    moved_lines: int = Field(
        default=0, description="Distinct places (the job's own innermost line) the main thread was seen at."
    )
    cpu_pct: int | None = Field(
        default=None,
        description="CPU time it used over the window, % of one core (/proc/PID/stat). On NCCL a CPU that waits "
        "for the GPU spins, so this says nothing about progress there.",
    )
    queued_pct: int | None = Field(
        default=None,
        description="% of the window its main thread waited for a core: high on oversubscribed cores.",
    )
    samples: int = Field(default=0, description="Looks at its main thread (dumps and samples).")
    waiting_pct: int | None = Field(
        default=None,
        description="% of the samples spent waiting: in a collective, or (NCCL) for the GPU.",
    )
    hot: list[str] = Field(
        default_factory=list,
        description="Where its own time goes: the job's lines it was seen at when not waiting, with their share.",
    )
    hot_code: str | None = Field(
        default=None, description="The source text of its top hot line, where the job's files could be read."
    )
    hot_locals: dict[str, int] = Field(
        default_factory=dict,
        description="Integer locals of the functions of its hot lines that stayed put over the window "
        "(name -> value): the sizes behind its work, e.g. side=448.",
    )
    moved: list[str] = Field(
        default_factory=list,
        description="The signals that moved over the window: counters, io (bytes read or written, or a file "
        "wait in the kernel), lines, locals; empty when none did.",
    )
    io: dict[str, int] = Field(
        default_factory=dict,
        description="Its main thread's I/O counters that moved over the window (/proc/PID/task/PID/io: rchar, "
        "wchar, syscr, syscw, read_bytes, write_bytes) -> by how much.",
    )
    kernel: dict[str, int] = Field(
        default_factory=dict,
        description="Where its main thread was in the kernel during the window (state and wchan): running, file, "
        "timer, futex, socket, poll, pipe, other -> % of the looks.",
    )
    inner_lines: int = Field(
        default=0,
        description="Distinct places, below its own code, of the code it calls into (a library, the standard "
        "library) the samples saw while it did not wait: a long call that works moves there.",
    )
    loop: str | None = Field(
        default=None,
        description="The loop of its own code it stood in with nothing else moving: 'file:line `header`'.",
    )
    loop_values: dict[str, str] = Field(
        default_factory=dict,
        description="The values the loop's condition reads (its frame's locals), e.g. p='/data/ready'.",
    )


class Progress(Model):
    """Whether the job moved during the window, and where its time goes."""

    motion: JobMotion
    window_s: float = Field(description="Seconds between the first and the last look.")
    looks: int = Field(
        default=0, description="Samples of each rank's main thread (about; per rank in ranks)."
    )
    summary: str = Field(
        description="What moved and by how much, e.g. 'step 421 -> 547 on every rank in 1.2 s'."
    )
    straggler: int | None = Field(
        default=None,
        description="The rank the others wait for, when the job moves but one rank holds it back.",
    )
    ranks: list[RankMotion] = Field(default_factory=list)


__all__ = ["JobMotion", "Motion", "Progress", "RankMotion"]
