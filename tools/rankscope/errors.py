"""One error hierarchy, each error carrying the fix.

Library code raises these; only the faces turn them into exit codes (CLI) or
``ToolError`` (MCP). Each error says what went wrong *and what to do*, because
the reader is an engineer or an agent in the middle of an incident.
"""

from __future__ import annotations

import textwrap


class RankscopeError(Exception):
    """Base of every error rankscope reports to a user.

    ``fix`` is the concrete next action. ``exit_code`` is what the CLI returns: 2, "no answer: bad
    input or nothing to read" (see :data:`EXIT_CODES`), whether the call must change or rankscope
    could not read what it names; 1 and 3 are answers (a failure found, a hang), never errors.
    """

    exit_code: int = 2
    default_fix: str = ""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix if fix is not None else self.default_fix

    def __str__(self) -> str:
        return self.message

    def render(self) -> str:
        """The message and its fix, as one text for a person or an agent."""
        if self.fix:
            return f"{self.message}\nFix: {self.fix}"
        return self.message


EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "answered (stacks, triage, fr, env: whatever the verdict; read it)"),
    (
        1,
        "answered, and the answer is a failure: a rank crashed (run), tensors differ (compare), "
        "placements have gaps (placements), a repro did not behave as expected (repro --verify)",
    ),
    (
        2,
        "no answer: bad input or nothing to read (a bad flag or argument, an empty folder, no job, "
        "an unreadable file, no permission); the message names the input and the fix",
    ),
    (3, "hung (run: stacks taken, the job reaped)"),
)
"""The one exit-code table: the CLI's --help epilog and skill/tools.md say the same."""


def exit_codes_text() -> str:
    """The table as --help prints it."""
    rows = (textwrap.fill(m, 90, initial_indent=f"  {c}  ", subsequent_indent="     ") for c, m in EXIT_CODES)
    return "exit codes:\n" + "\n".join(rows)


class UsageError(RankscopeError):
    """The call must change (an argument, a file, a pid): the CLI exits 2, as for a bad flag."""

    exit_code = 2


class NothingToRead(UsageError):
    """The input exists but holds nothing rankscope can read (an empty folder, no saved capture)."""

    default_fix = "Point the command at the files the job wrote; `rankscope <command> --help` says which."


class InvalidInput(UsageError):
    """Arguments or files that cannot be used as given."""

    default_fix = "Check the arguments; `rankscope <command> --help` lists them."


class ProcessNotFound(UsageError):
    """The pid names no running process."""

    default_fix = "Run `rankscope ps` (MCP: list_jobs) to list the distributed jobs on this host and pick a pid from there."


class NotADistributedJob(UsageError):
    """The process exists but is not part of a distributed PyTorch job."""

    default_fix = (
        "Pass the pid of a rank or of its launcher (torchrun, torch.multiprocessing.spawn, srun, mpirun); "
        "`rankscope ps` (MCP: list_jobs) lists the jobs it recognises."
    )


class NoJobsFound(RankscopeError):
    """Nothing on this host looks like a distributed PyTorch job."""

    check = (
        "Check the host and the user first: the job must run on this host (`hostname`) as your user, or "
        "rankscope must run as root; `ps -eo user,pid,args | grep -E '[t]orchrun|[p]ython'` lists its "
        "processes with their user."
    )
    elsewhere = (
        "On another node, use `rankscope stacks --hosts ...` (MCP: dump_stacks(hosts=[...])); for a job that "
        "already died, `rankscope triage` (triage_logs) on its logs or `rankscope fr` (analyze_flight_recorder) "
        "on flight-recorder dumps."
    )
    default_fix = f"{check} {elsewhere}"


class PermissionDenied(RankscopeError):
    """ptrace or /proc access was refused."""

    default_fix = (
        "Run rankscope as the job's user or as root. ptrace also needs CAP_SYS_PTRACE "
        "(containers: `docker run --cap-add SYS_PTRACE`, Kubernetes: securityContext.capabilities.add: "
        "[SYS_PTRACE]) and, for a non-root user, `sysctl kernel.yama.ptrace_scope=0`."
    )


class PySpyNotFound(RankscopeError):
    """The py-spy binary is missing."""

    default_fix = "Install it into the environment that runs rankscope: `pip install py-spy`."


class TorchMissing(RankscopeError):
    """A feature that needs torch ran where torch cannot be imported."""

    default_fix = (
        "Run this in the Python environment of the training job (the one with torch installed), "
        "or install a torch build that matches your CUDA version."
    )


class ToolTimeout(RankscopeError):
    """An external command did not finish in time."""

    default_fix = "Retry with a longer --timeout; a process stuck in the kernel (state D) cannot be sampled."


class ExternalToolFailed(RankscopeError):
    """An external command (py-spy, nvidia-smi, ssh, ...) failed."""


# ------------------------------------------------------------ capability errors
# Raised by one capability each, kept here so that every error a user can see is in one file.

DUMP_FIXES: dict[str, str] = {
    "permission_denied": PermissionDenied.default_fix,
    "pyspy_missing": PySpyNotFound.default_fix,
    "process_exited": "The process exited during capture; run `rankscope ps` (MCP: list_jobs) to see what is left of the job.",
    "timeout": "Retry with a longer --timeout, or with --nonblocking (does not pause the process); "
    "a process stuck in the kernel (state D) cannot be paused.",
    "unsupported": "py-spy reads CPython 2.3-3.13 processes only: check that the pid is a Python rank and that "
    "py-spy is recent (`pip install -U py-spy`).",
    "failed": "Run `py-spy dump --pid PID` by hand to see the full error; retry with --nonblocking.",
}


class DumpFailed(RankscopeError):
    """py-spy could not dump one process; ``kind`` is the RankError kind."""

    def __init__(self, kind: str, message: str, fix: str | None = None) -> None:
        super().__init__(message, fix if fix is not None else DUMP_FIXES.get(kind, DUMP_FIXES["failed"]))
        self.kind = kind


class ProbeTimeout(RankscopeError):
    """Another rank did not join a probe exchange in time."""

    default_fix = (
        "Every rank of the group must call the same probe at the same point (not under `if rank == 0`). "
        "Run `rankscope stacks` on the job to see where the missing rank is, or raise RANKSCOPE_PROBE_TIMEOUT."
    )


class LocalEditsFound(UsageError):
    """install-skill would overwrite files someone changed."""

    default_fix = (
        "Copy your edits elsewhere, then re-run the same command with --force (`rankscope install-skill --force "
        "...`; API: force=True) to overwrite them."
    )


class SnapshotUnreadable(InvalidInput):
    """A snapshot file that is not a plain ``_dump_snapshot`` pickle."""

    default_fix = (
        "Pass files written by torch.cuda.memory._dump_snapshot(path) or rankscope.probe.record_oom_snapshots(dir); "
        "rankscope only unpickles plain dicts/lists/numbers/strings and refuses anything else."
    )


class SlurmJobNotFound(UsageError):
    """``--via srun --job`` names a job the Slurm controller does not know (a wrong id, or a job
    that ended longer ago than the controller keeps finished jobs, MinJobAge)."""

    default_fix = (
        "Check the id: `squeue --me` lists your running jobs; a job that ended has no stacks, "
        "`rankscope triage` reads its output file."
    )


class SlurmJobNotRunning(UsageError):
    """The Slurm job is pending, suspended or finished: it has no ranks to sample."""

    default_fix = "Collect while `squeue -j JOBID` shows the job R (running)."


class SlurmJobNotYours(PermissionDenied):
    """Another user's Slurm job: ``srun --overlap --jobid`` joins only one's own (or, as root, any)."""

    default_fix = "Run rankscope as the job's user (or root); `squeue --me` lists your own jobs."
