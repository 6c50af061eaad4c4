"""`rankscope watch`: stay beside a running job, and capture a stall before its watchdog erases it.

The job is chosen once, as a live stacks call chooses it (its folder, a pid, a job id), and then
followed by its id: a torchelastic restart (new rank pids under the same launcher and run id) is a
new attempt of the same job. Between incidents the watch reads only /proc and the output files'
sizes (:class:`rankscope.capabilities.watch_sampler.HostSampler`); the one stall detector
(:func:`rankscope.analysis.hang.stall.judge_stall`) says when the job went quiet long enough, a
second sample confirms it, and only then is the job captured as a live call captures it
(:mod:`rankscope.capabilities.watch_capture`), well inside the job's own collective timeout. The
watch goes on: a job that moves again marks the incident resumed (a slow phase); a job whose
processes are all gone ends the watch. It never signals, kills or slows the job.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

from rankscope.analysis.hang import job_timeout as jt
from rankscope.analysis.hang.progress_signals import io_bytes, io_moved
from rankscope.analysis.hang.stall import JobSample, StallCall, StallDetector, every_rank_ran, moved
from rankscope.analysis.redact import Redactor
from rankscope.capabilities import discovery
from rankscope.capabilities import watch_capture as cap
from rankscope.capabilities import watch_folder as wf
from rankscope.capabilities.watch_sampler import HostSampler, Sampler
from rankscope.errors import InvalidInput, RankscopeError
from rankscope.models.core import Job
from rankscope.models.watch import (
    IncidentManifest,
    RankMotion,
    WatchAttempt,
    WatchHost,
    WatchManifest,
    WatchSelection,
    WatchSettings,
)
from rankscope.options import DumpOptions
from rankscope.runtime import procfs, pyspy

log = logging.getLogger("rankscope.capabilities.watch")

DEFAULT_INTERVAL_S = 2.0
DEFAULT_MAX_INCIDENTS = 20
DEFAULT_MAX_INCIDENT_BYTES = 32 * 1024 * 1024
DEFAULT_RESUME_S = 10.0


@dataclass(frozen=True)
class WatchConfig:
    """How one watch runs: where it writes, what it watches, its thresholds (None: from the job's timeout)."""

    out: Path
    selection: WatchSelection = field(default_factory=WatchSelection)
    interval_s: float = DEFAULT_INTERVAL_S
    stall_s: float | None = None
    busy_stall_s: float | None = None
    confirm_s: float | None = None
    resume_s: float = DEFAULT_RESUME_S
    job_timeout_s: float | None = None
    linger_s: float = 0.0
    max_incidents: int = DEFAULT_MAX_INCIDENTS
    max_incident_bytes: int = DEFAULT_MAX_INCIDENT_BYTES
    options: DumpOptions = field(default_factory=DumpOptions)

    def __post_init__(self) -> None:
        for name in ("interval_s", "resume_s"):
            if not getattr(self, name) > 0:
                raise InvalidInput(
                    f"{name} must be positive, got {getattr(self, name)}.", fix="Pass seconds > 0."
                )
        for name in ("stall_s", "busy_stall_s", "confirm_s", "job_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InvalidInput(
                    f"{name} must be positive, got {value}.", fix="Pass seconds > 0, or leave it out."
                )
        if self.max_incidents < 1 or self.max_incident_bytes < 4096:
            raise InvalidInput(
                "max incidents must be at least 1 and max bytes per incident at least 4096.",
                fix="Pass --max-incidents N >= 1 and --max-incident-mb >= 0.01.",
            )


def wall(t: float) -> str:
    """A monotonic time as the folder's UTC ISO time."""
    when = datetime.now(UTC) - timedelta(seconds=time.monotonic() - t)
    return when.isoformat(timespec="seconds")


def find(selection: WatchSelection, job_id: str | None = None) -> Job:
    """The job, chosen as a live call chooses it (by job id once known)."""
    if job_id is not None:
        return discovery.find_job(None, job_id)
    if selection.pid is not None or selection.job_id is not None:
        return discovery.find_job(selection.pid, selection.job_id)
    job, _, choices = discovery.pick_job(None, None, selection.folder)
    if job is None:
        ids = ", ".join(c.job_id for c in choices)
        raise InvalidInput(
            f"several jobs run here and none was started in {selection.folder}: {ids}",
            fix="Pass --job ID (or --pid PID) to choose one; `rankscope ps` lists them.",
        )
    return job


def _pids(job: Job) -> list[int]:
    return sorted(r.pid for r in job.ranks)


def read_timeout(job: Job, given: float | None) -> jt.JobTimeout:
    """The job's collective timeout: given, or read from its ranks' and launcher's argv and env."""
    if given is not None:
        return jt.JobTimeout(given, "args", "given to the watch (--job-timeout)")
    launchers = [p for p in [*job.launcher_pids, job.launcher_pid] if p]
    pids = [*_pids(job), *launchers]
    argvs = [procfs.read_cmdline(p) for p in pids]
    envs = [procfs.read_environ(p) or {} for p in pids]
    first = _pids(job)[:1]
    sources = _scripts(argvs[0], procfs.read_cwd(first[0])) if first and argvs and argvs[0] else []
    return jt.job_timeout(argvs, envs, job.backend, sources)


MAX_SCRIPTS = 30
MAX_SCRIPT_BYTES = 512 * 1024


def _scripts(argv: list[str], cwd: str | None) -> list[tuple[str, str]]:
    """The rank's script and the Python files beside it (where jobs keep their setup code), read
    once at the start so the watch knows a timeout set in ``init_process_group`` before a stall."""
    script = next((a for a in argv[1:] if a.endswith(".py")), None)
    if script is None:
        return []
    path = Path(cwd or ".", script)
    files = [path, *sorted(p for p in path.parent.glob("*.py") if p != path)][:MAX_SCRIPTS]
    out = []
    for f in files:
        try:
            if f.stat().st_size <= MAX_SCRIPT_BYTES:
                out.append((f.name, f.read_text(encoding="utf-8", errors="replace")))
        except OSError:
            continue
    return out


def settings_for(config: WatchConfig, timeout: jt.JobTimeout) -> WatchSettings:
    stall = config.stall_s or jt.stall_threshold(timeout.seconds)
    return WatchSettings(
        interval_s=config.interval_s,
        stall_s=stall,
        busy_stall_s=config.busy_stall_s or jt.busy_threshold(stall, timeout.seconds),
        confirm_s=config.confirm_s if config.confirm_s is not None else config.interval_s,
        job_timeout_s=timeout.seconds,
        job_timeout_source=timeout.source,
        job_timeout_note=timeout.note,
        resume_s=config.resume_s,
        linger_s=config.linger_s,
        max_incidents=config.max_incidents,
        max_incident_bytes=config.max_incident_bytes,
    )


@dataclass
class OpenIncident:
    """The last incident, while the job has neither moved again nor ended."""

    incident: cap.Incident
    pids: list[int]
    moving_since: float | None = None


class Watcher:
    """One watch: the manifest, the current attempt's sampler and samples, the open incident."""

    def __init__(self, config: WatchConfig) -> None:
        self.config = config
        self.folder = wf.make_dir(config.out)
        self.exe = pyspy.check_pyspy()
        job = find(config.selection)
        timeout = read_timeout(job, config.job_timeout_s)
        self.settings = settings_for(config, timeout)
        self.job = job
        self.manifest = WatchManifest(
            selection=config.selection,
            watcher_pid=os.getpid(),
            watcher_host=cap.host_name(),
            started_at=wf.utc_now(),
            state="watching",
            job_id=job.job_id,
            command=job_command(job),
            hosts=[WatchHost(host=cap.host_name())],
            settings=self.settings,
        )
        self.sampler: Sampler = HostSampler(_pids(job), extra=[p for p in job.launcher_pids if p])
        self.detector = StallDetector(self.settings.stall_s, self.settings.busy_stall_s)
        self.open: OpenIncident | None = None
        self.stopping = False
        self.gone_since: float | None = None
        self._new_attempt(job)

    def save(self, **update: object) -> None:
        self.manifest = self.manifest.model_copy(update=update)
        wf.write_watch(self.folder, self.manifest)

    def _new_attempt(self, job: Job) -> None:
        n = len(self.manifest.attempts) + 1
        attempt = WatchAttempt(
            n=n,
            first_seen=wf.utc_now(),
            pids={cap.host_name(): _pids(job)},
            launcher_pids=[p for p in job.launcher_pids if p],
            run_id=str(job.attempt) if job.attempt is not None else None,
        )
        self.job = job
        self.sampler = HostSampler(_pids(job), extra=[p for p in job.launcher_pids if p])
        self.detector = StallDetector(self.settings.stall_s, self.settings.busy_stall_s, time.monotonic())
        self.attempt_epoch = time.time()
        self.rank_envs = {r.rank: procfs.read_environ(r.pid) or {} for r in job.ranks if r.rank is not None}
        self.open = None
        log.info("attempt %d: ranks %s", n, _pids(job))
        self.save(attempts=[*self.manifest.attempts, attempt])

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def run(self) -> WatchManifest:
        """Sample until the job ends (or the watch is stopped); the final manifest."""
        while not self.stopping:
            tick = time.monotonic()
            if not self.sampler.alive():
                if self._ranks_gone():
                    break
            else:
                self.gone_since = None
                self._step()
            time.sleep(max(0.0, self.config.interval_s - (time.monotonic() - tick)))
        if self.stopping and self.manifest.state == "watching":
            self.save(state="stopped", ended_at=wf.utc_now(), note="stopped by a signal")
        return self.manifest

    def _keep(self, sample: JobSample) -> None:
        self.detector.add(sample)

    def _step(self) -> None:
        self._keep(self.sampler.sample())
        if self.open is not None:
            self._follow_open()
            return
        call = self._judge()
        if call.state != "suspect":
            return
        suspected = self.detector.samples[-1].t
        log.info("stall suspected: %s", call.why)
        time.sleep(self.settings.confirm_s)
        self._keep(self.sampler.sample())
        again = self._judge()
        if again.state != "suspect":
            log.info("not confirmed: %s", again.why)
            return
        self._capture(suspected, again)

    def _judge(self) -> StallCall:
        return self.detector.judge()

    def _capture(self, suspected: float, call: StallCall) -> None:
        paths = wf.incident_paths(self.folder)
        number = int(paths[-1].name[:3]) + 1 if paths else 1
        manifest = IncidentManifest(
            name=wf.incident_name(number, wall(suspected)),
            attempt=len(self.manifest.attempts),
            stall_suspected_at=wall(suspected),
            confirmed_at=wf.utc_now(),
            quiet_s=round(call.quiet_s, 1),
            reason=call.why,
            job_timeout_s=self.settings.job_timeout_s,
            job_timeout_source=self.settings.job_timeout_source,
            motion=self._motion(suspected - self.settings.stall_s),
        )
        incident = cap.Incident(self.folder, manifest, self.config.max_incident_bytes)
        log.info("capturing incident %s", manifest.name)
        self._pieces(incident)
        incident.save(captured_at=wf.utc_now(), complete=True)
        self.open = OpenIncident(incident, list(self.sampler.pids))
        dropped = wf.prune_incidents(self.folder, self.config.max_incidents)
        names = [p.name for p in wf.incident_paths(self.folder)]
        self.save(incidents=names, incidents_dropped=self.manifest.incidents_dropped + len(dropped))

    def _motion(self, since: float) -> list[RankMotion]:
        return rank_motion(list(self.detector.samples), self.job, since)

    def _pieces(self, incident: cap.Incident) -> None:
        alive = self.sampler.alive()
        job = self.job.model_copy(update={"ranks": [r for r in self.job.ranks if r.pid in alive]})
        cap.capture_pieces(incident, job, self.config.options, self.exe, self.sampler.files)

    def _follow_open(self) -> None:
        """After an incident: the job moving again for ``resume_s`` with every rank alive and running
        is a slow phase that resumed; a rank that ended (the watchdog, a crash) is not, nor a job whose
        waiting ranks print their timeout while the rank that stalled stands still."""
        if self.open is None:
            return
        samples = self.detector.samples
        last, before = samples[-1], samples[-2] if len(samples) > 1 else None
        if before is None or not moved(before, last) or not set(self.open.pids) <= set(last.ranks):
            return
        if self.open.moving_since is None:
            self.open.moving_since = last.t
            return
        if last.t - self.open.moving_since < self.config.resume_s or self.sampler.alive() != self.open.pids:
            return
        if not every_rank_ran(samples, self.open.pids, self.open.moving_since):
            return
        m = self.open.incident.manifest
        resumed_at = wall(self.open.moving_since)
        after = round(wf.seconds_between(m.stall_suspected_at, resumed_at), 1)
        log.info("incident %s resumed after %.0fs", m.name, after)
        self.open.incident.save(status="resumed", resumed_at=resumed_at, resumed_after_s=after)
        self.open = None

    def _ranks_gone(self) -> bool:
        """The attempt's ranks are gone: a new attempt (True: keep going, False) or the job's end (True)."""
        now = time.monotonic()
        self._end_attempt()
        try:
            job = find(self.manifest.selection, self.manifest.job_id)
        except RankscopeError:
            job = None
        if job is not None and set(_pids(job)) - set(self.sampler.pids):
            if len(job.ranks) >= len(self.sampler.pids):  # every rank of the new attempt has started
                self._new_attempt(job)
            return False
        launchers = [p for p in self.manifest.attempts[-1].launcher_pids if procfs.is_alive(p)]
        if launchers:
            return False  # torchrun is between attempts: its next ranks come
        self.gone_since = self.gone_since or now
        if now - self.gone_since < self.config.linger_s:
            return False
        self._job_ended()
        return True

    def _end_attempt(self) -> None:
        """Mark the current attempt ended once, and its open incident with the time it ended."""
        attempts = self.manifest.attempts
        if not attempts or attempts[-1].ended_at is not None:
            return
        ended = wf.utc_now()
        self.save(attempts=[*attempts[:-1], attempts[-1].model_copy(update={"ended_at": ended})])
        if self.open is not None:
            inc = self.open.incident
            before = round(wf.seconds_between(inc.manifest.captured_at or ended, ended), 1)
            inc.save(job_ended_at=ended, captured_before_end_s=before)
            cap.write_logs(inc, self.sampler.files, name="logs_at_end")
            dumps = cap.recorder_dumps(self.rank_envs, self.attempt_epoch)
            if dumps:
                cap.write_recorder(inc, dumps)
            self.open = None

    def _job_ended(self) -> None:
        ended = self.manifest.attempts[-1].ended_at or wf.utc_now()
        log.info("job ended")
        self.save(
            state="job_ended", job_ended_at=ended, ended_at=wf.utc_now(), note="the job's processes are gone"
        )


def rank_motion(samples: list[JobSample], job: Job, since: float) -> list[RankMotion]:
    """Each rank's motion from ``since`` to the last sample, as the cheap samples saw it."""
    if not samples:
        return []
    start = next((s for s in reversed(samples) if s.t <= since), samples[0])
    end = samples[-1]
    out: list[RankMotion] = []
    for r in job.ranks:
        was, now = start.ranks.get(r.pid), end.ranks.get(r.pid)
        if was is None or now is None:
            continue
        read, written = io_bytes(io_moved([was.io or {}, now.io or {}]))
        out.append(
            RankMotion(
                pid=r.pid,
                host=r.host,
                rank=r.rank,
                cpu_s=round(now.cpu_s - was.cpu_s, 2),
                io_bytes=read + written,
                state=now.state,
                wchan=now.wchan or None,
            )
        )
    return out


def job_command(job: Job) -> list[str]:
    """The launcher's command line (else a rank's), redacted, at most 64 words."""
    launcher = job.launcher_pid or (job.launcher_pids[0] if job.launcher_pids else None)
    argv = procfs.read_cmdline(launcher) if launcher else next((r.cmdline for r in job.ranks), [])
    return Redactor().argv(argv[:64])


def watch(config: WatchConfig, make: Callable[[WatchConfig], Watcher] | None = None) -> WatchManifest:
    """Watch the chosen job until it ends (SIGTERM or SIGINT stop the watch, never the job);
    ``make``: the watcher (by default this host's; every host's from a login node)."""
    log.setLevel(logging.INFO)  # its events (a line each, never one per sample) go to its log
    watcher = (make or Watcher)(config)
    previous = {sig: signal.signal(sig, watcher.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return watcher.run()
    except Exception as exc:
        watcher.save(state="failed", ended_at=wf.utc_now(), note=f"{type(exc).__name__}: {exc}"[:300])
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


__all__ = ["WatchConfig", "Watcher", "find", "read_timeout", "settings_for", "watch"]
