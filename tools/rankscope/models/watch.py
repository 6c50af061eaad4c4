"""The watch folder (issue 42): what `rankscope watch` writes beside a running job, and what
`rankscope triage <watch folder>` reads the morning after.

The folder is the contract between the two sides, so its models live here, one place::

    DIR/
      watch.json            WatchManifest (rewritten atomically on every change)
      watcher.log           the watcher's own log (bounded)
      incidents/
        001-20261128T030012Z/
          manifest.json     IncidentManifest (first with complete=false, last with complete=true)
          look-<host>.json  one HostLook per host, as `rankscope stacks --local --json` emits it
          env.json          the environment answer (optional)
          gpu.txt           GPU state (optional)
          logs/             tails of the job's logs (optional)
          fr/               recorder dumps (optional)

Everything in it is redacted as an answer is; the folder is its owner's only (0700, files 0600).
Changes to these models stay additive: new fields with defaults, never a renamed or retyped one,
so a folder written by an older watcher still reads.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.base import Model

WATCH_SCHEMA = 1
"""The folder layout's version; bumped only if a change could not stay additive."""

WATCH_FILE = "watch.json"
WATCHER_LOG = "watcher.log"
INCIDENTS_DIR = "incidents"
INCIDENT_FILE = "manifest.json"
LOOK_PREFIX = "look-"
"""An incident's looks are ``look-<host>.json``: one HostLook per host."""

WatchState = Literal["starting", "watching", "job_ended", "stopped", "failed"]
"""``starting``: the watcher has not found the job's ranks yet. ``watching``: sampling.
``job_ended``: the job's ranks are gone (no restart came); the watcher stopped itself.
``stopped``: stopped by its owner (a signal). ``failed``: the watcher itself failed (see ``note``)."""

TimeoutSource = Literal["args", "env", "source", "stacks", "recorder", "default"]
"""Where the job's collective timeout was read: its command line, its environment, the
``timeout`` of ``init_process_group`` in its stacks' locals, its recorder, or a stated default."""

IncidentStatus = Literal["stalled", "resumed"]
"""``stalled``: the job did not move again while watched (a hang, as far as the watch saw).
``resumed``: it moved again after ``resumed_after_s``: a slow phase, never a hang."""

HostState = Literal["watching", "gone", "unreachable", "ended"]
"""A host's part of the watch: sampled; its watcher (or step) went away; never reached; its ranks ended."""


class WatchSelection(Model):
    """How the job was chosen: the same selection a live ``stacks`` call takes (folder, pid,
    job id, hosts and how they are reached). Kept so the watcher finds the job again after a
    restart, by its id rather than by pid."""

    folder: str | None = Field(default=None, description="The folder the job was started in.")
    pid: int | None = Field(default=None, description="A pid given with --pid (a rank or its launcher).")
    job_id: str | None = Field(default=None, description="The job id given with --job (one of several here).")
    hosts: list[str] = Field(default_factory=list, description="The hosts given (--hosts), if any.")
    via: str | None = Field(default=None, description="How other hosts are reached (ssh, srun, ...), if any.")
    slurm_job: str | None = Field(default=None, description="The Slurm job id given with --via srun --job.")


class WatchSettings(Model):
    """The thresholds the watcher used, so a reader knows what "stall" meant for this folder."""

    interval_s: float = Field(description="Seconds between two cheap samples.")
    stall_s: float = Field(description="Seconds without progress before a stall is suspected.")
    confirm_s: float = Field(default=0.0, description="Seconds before the confirming second sample.")
    job_timeout_s: float | None = Field(default=None, description="The job's collective timeout, seconds.")
    job_timeout_source: TimeoutSource = "default"
    job_timeout_note: str | None = Field(
        default=None, description="Where exactly it was read (the flag or variable), or why the default."
    )
    resume_s: float = Field(
        default=0.0, description="Seconds of renewed progress after which an incident is marked resumed."
    )
    busy_stall_s: float | None = Field(
        default=None,
        description="Seconds without progress, ranks busy (NCCL spins), before a stall is suspected.",
    )
    linger_s: float = Field(
        default=0.0,
        description="Seconds the watch waits for a new attempt once the job's processes are gone.",
    )
    max_incidents: int = Field(description="Incidents kept; the oldest beyond are removed.")
    max_incident_bytes: int = Field(description="Bytes one incident may hold; pieces beyond are left out.")


class WatchAttempt(Model):
    """One attempt of the job: a torchelastic restart or a Slurm requeue starts the next one."""

    n: int = Field(description="1 for the first attempt seen, then 2, 3, ...")
    first_seen: str = Field(description="UTC ISO time the watcher first saw this attempt's ranks.")
    ended_at: str | None = Field(default=None, description="UTC ISO time its ranks were all gone.")
    pids: dict[str, list[int]] = Field(
        default_factory=dict, description="Rank pids per host (host name -> pids)."
    )
    launcher_pids: list[int] = Field(default_factory=list)
    run_id: str | None = Field(default=None, description="torchelastic's run id or the Slurm step, if known.")


class WatchHost(Model):
    """One host's part of the watch: never silently missing."""

    host: str
    state: HostState = "watching"
    note: str | None = None


class WatchManifest(Model):
    """``DIR/watch.json``: the watch as a whole."""

    schema_version: int = WATCH_SCHEMA
    selection: WatchSelection = Field(default_factory=WatchSelection)
    watcher_pid: int
    watcher_host: str
    started_at: str = Field(description="UTC ISO time the watch started.")
    ended_at: str | None = Field(default=None, description="UTC ISO time the watch ended.")
    state: WatchState = "starting"
    note: str | None = Field(default=None, description="Why it ended or failed, in one line.")
    job_id: str | None = None
    command: list[str] = Field(
        default_factory=list, description="The job's launcher command line (redacted)."
    )
    job_ended_at: str | None = Field(default=None, description="UTC ISO time the job's ranks were all gone.")
    attempts: list[WatchAttempt] = Field(default_factory=list)
    hosts: list[WatchHost] = Field(default_factory=list)
    settings: WatchSettings
    incidents: list[str] = Field(
        default_factory=list, description="Names of the incident folders under incidents/, oldest first."
    )
    incidents_dropped: int = Field(default=0, description="Older incidents removed to keep max_incidents.")


class IncidentPiece(Model):
    """One piece of an incident's capture, written as it arrived."""

    name: str = Field(description="What it is: look, env, gpu, logs, recorder.")
    file: str | None = Field(default=None, description="Its path relative to the incident folder.")
    captured_at: str = Field(description="UTC ISO time it was written.")
    ok: bool = True
    bytes: int = 0
    note: str | None = Field(default=None, description="Why it failed or was cut, if it was.")


class RankMotion(Model):
    """What the cheap samples saw of one rank over the stall window (from /proc only)."""

    pid: int
    host: str | None = None
    rank: int | None = None
    cpu_s: float = Field(default=0.0, description="CPU seconds used over the window.")
    io_bytes: int = Field(default=0, description="Bytes read and written over the window.")
    state: str | None = Field(
        default=None, description="The process state at the last sample (R, S, D, ...)."
    )
    wchan: str | None = Field(default=None, description="Where the main thread sleeps in the kernel.")
    moved: bool = Field(default=False, description="Whether the sampler counted it as progressing.")


class IncidentManifest(Model):
    """``incidents/NNN-<time>/manifest.json``: one suspected stall and what was captured."""

    schema_version: int = WATCH_SCHEMA
    name: str = Field(description="The incident folder's name, e.g. 001-20261128T030012Z.")
    attempt: int = Field(default=1, description="The job attempt (WatchAttempt.n) it happened in.")
    stall_suspected_at: str = Field(description="UTC ISO time the first sample suspected a stall.")
    confirmed_at: str | None = Field(default=None, description="UTC ISO time the second sample confirmed it.")
    captured_at: str | None = Field(default=None, description="UTC ISO time the capture finished.")
    quiet_s: float = Field(default=0.0, description="Seconds without progress when the capture began.")
    reason: str = Field(default="", description="Why a stall was suspected (the detector's evidence).")
    job_timeout_s: float | None = None
    job_timeout_source: TimeoutSource = "default"
    pieces: list[IncidentPiece] = Field(default_factory=list)
    hosts_missing: list[WatchHost] = Field(
        default_factory=list, description="Hosts whose part is missing from this incident, and why."
    )
    motion: list[RankMotion] = Field(default_factory=list, description="Each rank's motion over the window.")
    status: IncidentStatus = "stalled"
    resumed_at: str | None = None
    resumed_after_s: float | None = Field(
        default=None, description="Seconds from the suspected stall to renewed progress."
    )
    job_ended_at: str | None = Field(
        default=None, description="UTC ISO time the job ended (filled in when it ended)."
    )
    captured_before_end_s: float | None = Field(
        default=None, description="Seconds between the capture and the job's end."
    )
    complete: bool = Field(
        default=False,
        description="False until every piece was written; a watcher killed mid-incident leaves False.",
    )
    truncated: bool = Field(
        default=False, description="Pieces were cut or left out to keep max_incident_bytes."
    )


class SampledRank(Model):
    """One process of the job on one host, as a host's sampler read it from /proc."""

    pid: int
    rank: int | None = None
    cpu_s: float = 0.0
    state: str = "S"
    wchan: str = ""
    io: dict[str, int] | None = None


class HostSample(Model):
    """One line a host's sampler streams to a watch on another host (``rankscope watch --sampler``):
    its ranks' /proc counters and the size of their output, nothing that pauses them. The first
    line also says which job it found and its timeout; the last says its ranks ended."""

    host: str
    t: float = Field(description="The sampler host's monotonic seconds.")
    job_id: str | None = None
    ranks: list[SampledRank] = Field(default_factory=list, description="Every process of the job read now.")
    rank_pids: list[int] = Field(default_factory=list, description="The rank pids (their children aside).")
    output: int = Field(default=0, description="Bytes of the job's output files on this host.")
    files: list[str] = Field(default_factory=list, description="The output files (first line only).")
    job_timeout_s: float | None = Field(default=None, description="The job's timeout (first line only).")
    job_timeout_source: TimeoutSource = "default"
    job_timeout_note: str | None = None
    command: list[str] = Field(default_factory=list, description="The launcher's argv (first line only).")
    ended: bool = Field(default=False, description="The job's ranks and launchers on this host are gone.")


class WatchSummary(Model):
    """One watch as the list of watches shows it (MCP list_watches)."""

    dir: str
    state: WatchState
    watcher_pid: int
    watcher_alive: bool
    job_id: str | None = None
    started_at: str
    attempts: int = 0
    incidents: int = 0
    last_incident: str | None = None


class WatchList(Model):
    """The watches found under the folders asked about."""

    watches: list[WatchSummary] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class WatchStarted(Model):
    """Answer of `rankscope watch --detach` and MCP start_watch: where the watch lives."""

    dir: str
    watcher_pid: int
    log: str
    job_id: str | None = None
    summary: str
    next_steps: list[str] = Field(default_factory=list)


class IncidentView(Model):
    """One incident as read back: its manifest and the looks' hosts found beside it."""

    manifest: IncidentManifest
    looks: list[str] = Field(default_factory=list, description="The look files present.")


class WatchView(Model):
    """Answer of MCP read_watch: the watch manifest and its incidents' manifests, read back."""

    dir: str
    watch: WatchManifest
    watcher_alive: bool = False
    incidents: list[IncidentView] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
