"""The ground vocabulary: processes, jobs, stacks, verdicts and findings.

These are stable JSON contracts (``--json``, MCP structured content). Add
fields with defaults; never rename or remove one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from rankscope.models.base import Model as Model
from rankscope.models.progress import Progress

Severity = Literal["info", "warning", "error", "critical"]

LauncherKind = Literal["torchrun", "mp_spawn", "slurm", "mpi", "env", "unknown"]
"""How a rank was started: ``env`` means a launcher that only set RANK/WORLD_SIZE
(accelerate, deepspeed, a shell script)."""

ProcState = Literal[
    "running", "sleeping", "disk_sleep", "stopped", "tracing_stop", "zombie", "dead", "idle", "unknown"
]

Backend = Literal["nccl", "gloo", "mixed", "unknown"]
"""The communication backend a rank (or a job) uses, read from outside the process."""

WaitKind = Literal["collective", "gpu", "launch_queue", "allocator", "maybe_gpu", "other"]
"""What a rank's main thread waits for: ``collective`` = blocked on the CPU inside a collective
(gloo, NCCL's barrier or blocking wait, communicator init); ``gpu`` = the CPU waits for the GPU
(``.item()``, ``.cpu()``, a synchronize); ``launch_queue`` = blocked launching a kernel behind a hung
one; ``allocator`` = the CUDA caching allocator synchronizes or frees; ``other`` = none of these
(compute, data loading, a lock, I/O)."""

Confidence = Literal["high", "medium", "low"]

FrameOrigin = Literal["user", "torch", "library", "rankscope", "stdlib", "generated", "native"]
"""Where a frame's code comes from: the job's own (``user``), torch, another installed library,
rankscope itself, Python's standard library (and code the interpreter made: ``<frozen ...>``),
code torch.compile generated, or C/C++ (``native``)."""

MissingStatus = Literal["not_visible", "exited", "stopped", "zombie"]
"""Why a rank of the world has no stack here: ``not_visible`` = not on this host (or not found);
it cannot be blamed. ``exited``/``stopped``/``zombie`` can."""

VerdictKind = Literal[
    "mismatched_collectives",
    "divergent_ranks",
    "missing_ranks",
    "all_in_same_collective",
    "no_collective",
    "inconclusive",
    "progressing",
    "straggler",
    "busy",
    "startup",
]
"""The hang kinds, then what a moving job gets instead (it is never called hung): ``progressing``
= it moves; ``straggler`` = it moves, held back by one rank; ``busy`` = nothing completed in the
window, but the ranks that do not wait compute in their own code (slow or stuck cannot be told
yet: look again over a longer window). ``startup``: the job never started: its launchers wait in
rendezvous, or its ranks before their first collective (the nodes or ranks missing, and why)."""


class NextStep(Model):
    """One concrete thing to do next, pointing into the skill and the tools."""

    action: str = Field(description="What to do, in one sentence.")
    tool: str | None = Field(
        default=None, description="MCP tool / CLI command to call next, e.g. 'dump_stacks'."
    )
    skill_section: str | None = Field(
        default=None,
        description="Playbook section that explains it, e.g. 'skill/hangs.md#mismatched-collectives'.",
    )
    args: dict[str, Any] | None = Field(
        default=None, description="Arguments for the MCP tool, e.g. {'from_last_stacks': true}."
    )


class GroupLocals(Model):
    """Process-group facts read from a rank's locals; every other local is dropped."""

    tables: dict[str, list[bool]] = Field(
        default_factory=dict,
        description="Lists or dicts of process groups the job keeps, keyed 'file:function:name': True where "
        "this rank holds a ProcessGroup (a member), False where it holds NON_GROUP_MEMBER (-100).",
    )
    slot: str | None = Field(
        default=None,
        description="'file:function:name[i]': the table entry that is the group its collective runs on.",
    )
    ranks: list[int] | None = Field(
        default=None, description="A list of ranks the job keeps that holds this rank."
    )
    ranks_from: str | None = Field(default=None, description="'file:function:name' of that list.")


class LocalVar(Model):
    """A local variable of a frame, as py-spy reports it (already redacted)."""

    name: str
    repr: str | None = None
    arg: bool = False


class Frame(Model):
    """One stack frame; stacks are stored innermost first, as py-spy prints them."""

    function: str
    file: str
    line: int | None = None
    module: str | None = None
    native: bool = Field(default=False, description="True for C/C++ frames (py-spy --native).")
    locals: list[LocalVar] | None = None
    origin: SkipJsonSchema[FrameOrigin | None] = Field(
        default=None,
        exclude=True,
        description="Where the frame's code comes from, told by the roots of the interpreter that ran it "
        "(rankscope.analysis.code_origin); None until told. Never serialised: a host's look carries the roots "
        "instead (HostLook.code_roots), which tell it again.",
    )

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def __eq__(self, other: object) -> bool:
        """Equal when every serialised field is: the origin is what the roots tell of the rest, so a
        frame read back from JSON equals the one written."""
        if not isinstance(other, Frame):
            return NotImplemented
        mine = {k: v for k, v in self.__dict__.items() if k != "origin"}
        return mine == {k: v for k, v in other.__dict__.items() if k != "origin"}

    __hash__ = None  # type: ignore[assignment]  # mutable, as every pydantic model


class ThreadStack(Model):
    """One thread of one process."""

    thread_id: int
    os_thread_id: int | None = None
    name: str | None = None
    active: bool | None = None
    owns_gil: bool | None = None
    is_main: bool = False
    frames: list[Frame] = Field(default_factory=list)


class CodeRoots(Model):
    """The folders a job's interpreter imports its code from, read from its ranks (``/proc/PID/exe``,
    the mapped ``lib-dynload``, ``site-packages`` and torch libraries, the environment): a frame under
    one of them is not the job's own, whatever the folder names above the job's own files."""

    stdlib: list[str] = Field(default_factory=list, description="The standard library's folders.")
    site: list[str] = Field(
        default_factory=list, description="site-packages / dist-packages folders (venv, prefix, user site)."
    )
    torch: list[str] = Field(default_factory=list, description="The folders torch is imported from.")
    rankscope: list[str] = Field(default_factory=list, description="The folders rankscope is imported from.")


class RankProcess(Model):
    """A process that is one rank of a job, found on this host."""

    rank: int | None = Field(description="Global rank; None when it could not be determined.")
    local_rank: int | None = None
    pid: int
    host: str
    state: ProcState = "unknown"
    launcher: LauncherKind = "unknown"
    rank_source: str = Field(
        default="", description="Where the rank number came from, e.g. 'env:RANK', 'spawn_index'."
    )
    cmdline: list[str] = Field(default_factory=list, description="Redacted command line.")
    python: str | None = Field(default=None, description="Interpreter executable (/proc/PID/exe).")
    children: list[int] = Field(
        default_factory=list, description="Pids of this rank's children (DataLoader workers, ...)."
    )
    backend: Backend | None = Field(
        default=None,
        description="This rank's backend read from /proc (threads, maps, fds); None when not read.",
    )


class MissingRank(Model):
    """A rank of the world with no live stack here, and why."""

    rank: int
    status: MissingStatus
    exit_code: int | None = None
    detail: str = Field(default="", description="Where the status was read, or what to run to see the rank.")


class Job(Model):
    """A distributed job as seen from this host."""

    job_id: str = Field(description="TORCHELASTIC_RUN_ID, SLURM job id, launcher pid, or MASTER_ADDR:PORT.")
    launcher: LauncherKind = "unknown"
    launcher_pid: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    hosts: list[str] = Field(default_factory=list)
    ranks: list[RankProcess] = Field(default_factory=list)
    missing_ranks: list[int] = Field(
        default_factory=list, description="Ranks of the world not found here (on another host, or exited)."
    )
    exited_ranks: list[int] = Field(
        default_factory=list, description="Ranks known to have exited (zombies, gone)."
    )
    notes: list[str] = Field(default_factory=list)
    backend: Backend | None = Field(
        default=None,
        description="nccl | gloo | mixed | unknown, read from outside the ranks; None when not read.",
    )
    backend_evidence: list[str] = Field(
        default_factory=list, description="What decided the backend (mapped libraries, thread names, env)."
    )
    launcher_pids: list[int] = Field(
        default_factory=list,
        description="Every launcher of this job on this host (several torchrun agents of one job are one job).",
    )
    attempt: int | None = Field(
        default=None, description="TORCHELASTIC_RESTART_COUNT of the ranks shown (torchrun restarts)."
    )
    recorder: str | None = Field(
        default=None,
        description="NCCL jobs: where and when this job's flight-recorder dumps are written, and how to get one "
        "now, read from the ranks' launch environment.",
    )
    missing: list[MissingRank] = Field(
        default_factory=list,
        description="Each rank of the world with no live stack here, classified (not_visible, exited, ...).",
    )


class JobList(Model):
    """Answer of `rankscope ps` / MCP `list_jobs`."""

    host: str
    jobs: list[Job] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )


class CallSite(Model):
    """Innermost frame in user code (outside torch, site-packages and the stdlib)."""

    file: str
    line: int | None = None
    function: str

    def __str__(self) -> str:
        return (
            f"{self.file}:{self.line} in {self.function}"
            if self.line is not None
            else f"{self.file} in {self.function}"
        )


class RankError(Model):
    """Why one rank's capture failed; never hides the other ranks' results."""

    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    kind: str = Field(
        description="permission_denied | pyspy_missing | process_exited | timeout | unsupported | failed | unreachable"
    )
    message: str
    fix: str = ""


class RankStack(Model):
    """Everything captured for one rank."""

    rank: int | None
    pid: int
    host: str
    state: ProcState = "unknown"
    threads: list[ThreadStack] = Field(default_factory=list)
    op: str | None = Field(
        default=None, description="torch.distributed operation the rank is blocked in, if any."
    )
    op_evidence: str | None = Field(default=None, description="The frame(s) the op was read from.")
    peer: int | None = Field(
        default=None,
        description="For a blocking send/recv: the rank on the other end (global), read from the call's "
        "src/dst local; only with locals captured.",
    )
    call_site: CallSite | None = None
    error: RankError | None = None
    backend: Backend | None = Field(default=None, description="This rank's backend, when read.")
    wait: WaitKind | None = Field(default=None, description="What the main thread waits for.")
    wait_evidence: str | None = Field(
        default=None, description="The frame the wait was read from; says 'inferred' without native frames."
    )
    counters: dict[str, int] = Field(
        default_factory=dict,
        description="Integer locals (step, epoch, i, ...) of the job's frames, keyed 'file:function:name'.",
    )
    subgroup: bool | None = Field(
        default=None,
        description="True when the collective it waits in runs on a process group other than the default one "
        "(read from the call's `group` argument; None when locals were not read).",
    )
    group_locals: GroupLocals | None = Field(
        default=None,
        description="What its locals say of the process groups' members (group tables, a list of ranks).",
    )
    gpu_util: int | None = Field(
        default=None,
        description="Utilisation % of this rank's GPU (nvidia-smi) when read; ~100 spins, ~0 idles.",
    )


class Group(Model):
    """Ranks that share (operation, user call site)."""

    ranks: list[int]
    op: str | None = None
    call_site: CallSite | None = None
    state: ProcState | None = Field(
        default=None, description="Set when the group is formed by a process state (stopped, zombie)."
    )
    wait: WaitKind | None = Field(
        default=None, description="What the group's main threads wait for (gpu, collective, other, ...)."
    )
    frames: list[Frame] = Field(
        default_factory=list, description="Representative main-thread stack, innermost first (bounded)."
    )


class Verdict(Model):
    """What the evidence says, in a stable shape."""

    kind: VerdictKind
    suspect_ranks: list[int] = Field(default_factory=list)
    confidence: Confidence = Field(
        default="medium", description="high | medium | low: how strongly the evidence decides."
    )
    summary: str
    evidence: list[str] = Field(default_factory=list)
    next_steps: list[NextStep] = Field(default_factory=list)


class StacksReport(Model):
    """Answer of `rankscope stacks` / MCP `dump_stacks`. The verdict leads: a reader that stops
    early has read the answer."""

    verdict: Verdict
    only_ranks: list[int] = Field(
        default_factory=list,
        description="Set when only these ranks were captured (--only-rank, MCP ranks): the verdict speaks "
        "for them alone, not for the job.",
    )
    progress: Progress | None = Field(
        default=None,
        description="Whether the job moved while it was watched (live captures), and where its time goes.",
    )
    job: Job
    groups: list[Group] = Field(default_factory=list, description="By (op, call site).")
    stack_groups: list[Group] = Field(
        default_factory=list, description="By whole main-thread stack, for display."
    )
    stacks: list[RankStack] = Field(
        default_factory=list, description="Per-rank stacks; may be omitted in bounded answers."
    )
    errors: list[RankError] = Field(default_factory=list)
    truncated: bool = False
    hint: str | None = Field(default=None, description="How to get what a bounded answer left out.")
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )


class Finding(Model):
    """One recognised event or check result (log triage, env checks, ...)."""

    kind: str = Field(description="Stable identifier, e.g. 'collective_timeout', 'peer_closed'.")
    severity: Severity = "error"
    ranks: list[int] = Field(default_factory=list)
    message: str
    explanation: str = ""
    fix: str = ""
    source: str | None = Field(default=None, description="File (and host) the evidence came from.")
    line_numbers: list[int] = Field(default_factory=list)
    excerpt: str = ""
    facts: dict[str, Any] = Field(default_factory=dict)
    next_steps: list[NextStep] = Field(default_factory=list)
