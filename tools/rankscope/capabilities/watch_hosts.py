"""One watch over every host of a job, from a login node: `rankscope watch --hosts ... | --via srun`.

Each host runs one sampler, started once (``rankscope watch --sampler`` over ssh, or in an
``srun --overlap`` step of the job's allocation) that streams its ranks' /proc counters back
(:mod:`rankscope.capabilities.watch_stream`): nothing pauses a rank, and no connection is made per
sample. The watcher merges the hosts' latest samples into one sample of the whole job, so the one
stall detector judges the job's progress, not a host's. On a stall every host is captured as a
multi-host live call captures it (``rankscope stacks --local --json`` there), and each host's look
is kept as ``look-<host>.json``, for triage to merge and judge later. A host whose sampler ends
(its node went away, its step was cancelled) or goes quiet is marked gone in the manifest, with
why, and the watch goes on with the others; a host that gives no look at a stall is named in the
incident's ``hosts_missing``. Nothing is ever silently left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from rankscope.analysis.hang import job_timeout as jt
from rankscope.analysis.hang.stall import JobSample, RankSample, StallDetector
from rankscope.capabilities import remote
from rankscope.capabilities import watch_capture as cap
from rankscope.capabilities import watch_folder as wf
from rankscope.capabilities.watch import WatchConfig, Watcher, rank_motion, settings_for
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess
from rankscope.models.look import HostLook
from rankscope.models.watch import (
    HostSample,
    HostState,
    RankMotion,
    WatchAttempt,
    WatchHost,
    WatchManifest,
    WatchSelection,
)
from rankscope.options import StacksTarget
from rankscope.runtime import subproc
from rankscope.runtime.proctree import reap_tree

log = logging.getLogger("rankscope.capabilities.watch_hosts")

START_S = 60.0
"""Seconds a host's sampler may take to find the job and send its first sample."""

SSH_KEEPALIVE = ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
"""A sampler's ssh notices a node that went away within about 15 s."""

PID_BITS = 22
"""pids are below 2**22 (the kernel's pid_max limit): a host's index above them keys its ranks apart."""


def stale_after(interval_s: float) -> float:
    """Seconds without a line after which a host's sampler counts as gone."""
    return max(20.0, 5 * interval_s)


def sampler_flags(selection: WatchSelection, interval_s: float, job_timeout_s: float | None) -> list[str]:
    """The arguments of each host's ``rankscope watch --sampler``: the job as the watch chose it."""
    flags = ["watch", "--sampler", "--interval", f"{interval_s:g}"]
    if selection.job_id:
        flags += ["--job", selection.job_id]
    elif selection.slurm_job:
        flags += ["--job", selection.slurm_job]  # the ranks that run in this Slurm job
    elif selection.folder:
        flags += ["--here", selection.folder]
    if job_timeout_s is not None:
        flags += ["--job-timeout", f"{job_timeout_s:g}"]
    return flags


def sampler_argv(host: str, selection: WatchSelection, flags: list[str]) -> list[str]:
    """How one host's sampler starts: over ssh (BatchMode, keep-alives), or one ``srun --overlap``
    task on that node of the Slurm job; rankscope found there as a live call finds it."""
    command = remote.find_rankscope_argv(flags, remote.own_command())
    if selection.via == "srun":
        return [
            "srun",
            "--overlap",
            f"--jobid={selection.slurm_job}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={host}",
            "--kill-on-bad-exit=0",
            *command,
        ]
    return remote.ssh_argv(host, command, timeout=10.0, ssh_options=SSH_KEEPALIVE)


@dataclass
class HostStream:
    """One host's sampler: its process, its latest line, and its state in the watch."""

    host: str
    via: str
    proc: subprocess.Popen[bytes]
    first: HostSample | None = None
    latest: HostSample | None = None
    last_line: float = field(default_factory=time.monotonic)
    eof: bool = False
    stderr: str = ""
    state: HostState = "watching"
    note: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start_reading(self) -> None:
        threading.Thread(target=self._read_out, daemon=True, name=f"sampler-{self.host}").start()
        threading.Thread(target=self._read_err, daemon=True, name=f"sampler-err-{self.host}").start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None  # piped by subproc.start_stream
        for raw in self.proc.stdout:
            start = raw.find(b"{")
            if start < 0:
                continue
            try:
                got = HostSample.model_validate_json(raw[start:])
            except ValidationError:
                continue
            with self.lock:
                self.first = self.first or got
                self.latest, self.last_line = got, time.monotonic()
        self.eof = True

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr = (self.stderr + raw.decode(errors="replace"))[-4000:]

    def why_gone(self) -> str:
        """Why its sampler ended, in one line (the remote failure's message when it says one)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2.0)
        rc = self.proc.returncode
        said = [ln for ln in self.stderr.splitlines() if ln.strip() and not ln.startswith(remote.FOUND)]
        what = "its srun step" if self.via == "srun" else "its sampler over ssh"
        if said:
            ours = [ln for ln in said if "rankscope" in ln and "error" in ln]
            return f"{what} ended (exit {rc}): {(ours or said)[-1].strip()}"[:300]
        if self.via == "ssh" and rc == 255:
            return f"{what} ended (ssh exit 255): the connection dropped or the sampler was killed"
        return f"{what} ended (exit {rc}) and said nothing"

    def close(self) -> None:
        if self.proc.poll() is None:
            reap_tree(self.proc, grace=2.0)


def start_streams(hosts: Sequence[str], selection: WatchSelection, flags: list[str]) -> list[HostStream]:
    """One sampler per host, all started at once."""
    env = None
    if selection.via == "srun":
        from rankscope.capabilities.slurm import srun_env

        env = srun_env()
    streams = []
    for host in hosts:
        argv = sampler_argv(host, selection, flags)
        try:
            proc = subproc.start_stream(argv, env)
        except OSError as exc:
            raise InvalidInput(
                f"could not start {argv[0]} for {host}: {exc}",
                fix="Run the watch where ssh (or Slurm's srun) works, as for `rankscope stacks --hosts`.",
            ) from exc
        stream = HostStream(host=host, via=selection.via or "ssh", proc=proc)
        stream.start_reading()
        streams.append(stream)
    return streams


def wait_first(streams: list[HostStream], limit: float) -> None:
    """Until every host sent its first sample, its sampler ended, or ``limit`` seconds passed; a host
    with no first sample is unreachable, with why."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(s.first is None and not s.eof for s in streams):
        time.sleep(0.1)
    for s in streams:
        if s.first is None:
            s.state = "unreachable"
            s.note = s.why_gone() if s.eof else f"no sample within {limit:g}s"
            s.close()


class HostsSampler:
    """Every host's latest sample, merged into one sample of the job (its ranks keyed apart by
    host, since pids repeat across hosts). Reading it also notices a sampler that ended or went quiet."""

    def __init__(
        self,
        streams: list[HostStream],
        stale_s: float,
        changed: Callable[[], None],
        job_over: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.streams = streams
        self.stale_s = stale_s
        self.changed = changed
        self.job_over = job_over
        """Why the whole job is over (a Slurm job no longer running), else None: a sampler step
        that Slurm ended with its job went with the job, not away from it."""
        self.files = sorted({f for s in streams if s.first for f in s.first.files})

    @staticmethod
    def key(index: int, pid: int) -> int:
        return ((index + 1) << PID_BITS) | pid

    def where(self, key: int) -> tuple[str, int]:
        return self.streams[(key >> PID_BITS) - 1].host, key & ((1 << PID_BITS) - 1)

    def refresh(self) -> None:
        """Mark the hosts whose sampler ended (its ranks ended, or it went away) or went quiet."""
        now, moved = time.monotonic(), False
        for s in self.streams:
            if s.state != "watching":
                continue
            if s.eof:
                over = None if s.latest is not None and s.latest.ended else self.job_over()
                if s.latest is not None and s.latest.ended:
                    s.state, s.note = "ended", "its ranks ended"
                elif over is not None:
                    s.state, s.note = "ended", over
                else:
                    s.state, s.note = "gone", s.why_gone()
            elif now - s.last_line > self.stale_s:
                s.state, s.note = "gone", f"no sample for {now - s.last_line:.0f}s (node or network gone?)"
                s.close()
            else:
                continue
            moved = True
            log.info("host %s: %s (%s)", s.host, s.state, s.note)
        if moved:
            self.changed()

    def _watching(self) -> list[tuple[int, HostSample]]:
        return [(i, s.latest) for i, s in enumerate(self.streams) if s.state == "watching" and s.latest]

    @property
    def pids(self) -> list[int]:
        return self.alive()

    def alive(self) -> list[int]:
        self.refresh()
        return sorted(self.key(i, p) for i, got in self._watching() for p in got.rank_pids)

    def sample(self) -> JobSample:
        ranks: dict[int, RankSample] = {}
        output = 0
        for i, got in self._watching():
            output += got.output
            for r in got.ranks:
                ranks[self.key(i, r.pid)] = RankSample(r.pid, r.cpu_s, r.state, r.wchan, r.io)
        return JobSample(t=time.monotonic(), ranks=ranks, output=output)

    def job(self) -> Job:
        """The job's ranks as the samples name them, keyed as :meth:`sample` keys them."""
        ranks = [
            RankProcess(rank=r.rank, pid=self.key(i, r.pid), host=self.streams[i].host)
            for i, got in self._watching()
            for r in got.ranks
            if r.pid in got.rank_pids
        ]
        first = next((s.first for s in self.streams if s.first), None)
        return Job(
            job_id=first.job_id if first and first.job_id else "unknown", launcher="unknown", ranks=ranks
        )


def _hosts(selection: WatchSelection) -> list[str]:
    if selection.hosts:
        return list(selection.hosts)
    if selection.via == "srun" and selection.slurm_job:
        from rankscope.capabilities.slurm import slurm_job_id, slurm_job_nodes

        return slurm_job_nodes(slurm_job_id(selection.slurm_job))
    raise InvalidInput(
        "a watch over other hosts needs them: --hosts node1,node2, or --via srun --job SLURM_JOB_ID.",
        fix="Pass --hosts (ssh) or --via srun --job ID; without either the watch watches this host.",
    )


def _timeout(firsts: list[HostSample], given: float | None) -> jt.JobTimeout:
    """The job's timeout as the hosts read it (the shortest read from the job), else the default."""
    if given is not None:
        return jt.JobTimeout(given, "args", "given to the watch (--job-timeout)")
    read = [f for f in firsts if f.job_timeout_s is not None and f.job_timeout_source != "default"]
    best = min(read, key=lambda f: f.job_timeout_s or 0.0) if read else (firsts[0] if firsts else None)
    if best is None or best.job_timeout_s is None:
        return jt.job_timeout([], [], None)
    return jt.JobTimeout(best.job_timeout_s, best.job_timeout_source, best.job_timeout_note or "")


class HostsWatcher(Watcher):
    """A watch whose ranks run on other hosts: the same loop, detector and incidents as one host's
    (:class:`~rankscope.capabilities.watch.Watcher`), fed by every host's sampler, captured by a
    multi-host call."""

    def __init__(self, config: WatchConfig) -> None:
        self.config = config
        self.folder = wf.make_dir(config.out)
        selection = config.selection
        self.target = StacksTarget(
            hosts=tuple(_hosts(selection)),
            via="srun" if selection.via == "srun" else "ssh",
            job=selection.slurm_job,
        )
        hosts = list(self.target.hosts or ())
        flags = sampler_flags(selection, config.interval_s, config.job_timeout_s)
        self.streams = start_streams(hosts, selection, flags)
        try:
            wait_first(self.streams, START_S)
            self._start(config, hosts)
        except BaseException:
            self.close()
            raise

    def _start(self, config: WatchConfig, hosts: list[str]) -> None:
        firsts = [s.first for s in self.streams if s.first is not None]
        if not firsts:
            said = "; ".join(f"{s.host}: {s.note}" for s in self.streams)
            raise InvalidInput(
                f"no host answered the watch: {said}",
                fix="Check that `rankscope stacks --hosts ...` (or --via srun --job ID) reaches the job first.",
            )
        self.settings = settings_for(config, _timeout(firsts, config.job_timeout_s))
        self.sampler = self.hosts = HostsSampler(
            self.streams, stale_after(config.interval_s), self._hosts_changed, self._slurm_job_over
        )
        self.job = self.hosts.job()
        first = firsts[0]
        self.manifest = WatchManifest(
            selection=config.selection,
            watcher_pid=os.getpid(),
            watcher_host=cap.host_name(),
            started_at=wf.utc_now(),
            state="watching",
            job_id=first.job_id,
            command=first.command,
            hosts=self._host_states(),
            settings=self.settings,
            attempts=[
                WatchAttempt(
                    n=1,
                    first_seen=wf.utc_now(),
                    pids={s.host: s.first.rank_pids for s in self.streams if s.first is not None},
                )
            ],
        )
        self.detector = StallDetector(self.settings.stall_s, self.settings.busy_stall_s, time.monotonic())
        self.open = None
        self.stopping = False
        self.gone_since = None
        self.rank_envs = {}
        self.attempt_epoch = time.time()
        self.exe = ""
        wf.write_watch(self.folder, self.manifest)
        log.info("watching %s on %s", first.job_id, ", ".join(hosts))

    def _slurm_job_over(self) -> str | None:
        """Why the Slurm job is over (its state), or None while it runs (or without Slurm)."""
        if self.target.via != "srun" or not self.target.job:
            return None
        from rankscope.capabilities.slurm import slurm_job_nodes
        from rankscope.errors import RankscopeError

        try:
            slurm_job_nodes(self.target.job)
        except RankscopeError as exc:
            return f"the Slurm job ended ({exc.message.splitlines()[0][:200]})"
        return None

    def _host_states(self) -> list[WatchHost]:
        return [WatchHost(host=s.host, state=s.state, note=s.note) for s in self.streams]

    def _hosts_changed(self) -> None:
        self.save(hosts=self._host_states())

    def close(self) -> None:
        for s in self.streams:
            s.close()

    def run(self) -> WatchManifest:
        try:
            return super().run()
        finally:
            self.close()

    def _step(self) -> None:
        self._follow_restart()
        super()._step()

    def _follow_restart(self) -> None:
        """Every host that shows ranks shows new ones (torchelastic restarted them, Slurm requeued the
        job; each host's sampler follows the job by its id): the next attempt of the same job. A host
        that shows its first ranks of an attempt late is added to it."""
        attempt = self.manifest.attempts[-1]
        now = {
            s.host: list(s.latest.rank_pids)
            for s in self.streams
            if s.state == "watching" and s.latest is not None and s.latest.rank_pids
        }
        known = {h: p for h, p in now.items() if attempt.pids.get(h)}
        if not now or not known or any(set(p) & set(attempt.pids[h]) for h, p in known.items()):
            if set(now) - set(attempt.pids):
                pids = {**attempt.pids, **{h: p for h, p in now.items() if h not in attempt.pids}}
                self.save(attempts=[*self.manifest.attempts[:-1], attempt.model_copy(update={"pids": pids})])
            return
        self._end_attempt()
        log.info("attempt %d: new ranks on %s", attempt.n + 1, ", ".join(now))
        self.detector = StallDetector(self.settings.stall_s, self.settings.busy_stall_s, time.monotonic())
        self.attempt_epoch = time.time()
        self.open = None
        self.save(
            attempts=[
                *self.manifest.attempts,
                WatchAttempt(n=attempt.n + 1, first_seen=wf.utc_now(), pids=now),
            ]
        )

    def _motion(self, since: float) -> list[RankMotion]:
        out = []
        for m in rank_motion(list(self.detector.samples), self.hosts.job(), since):
            host, pid = self.hosts.where(m.pid)
            out.append(m.model_copy(update={"pid": pid, "host": host}))
        return out

    def _pieces(self, incident: cap.Incident) -> None:
        """Every host's look, taken at once as a multi-host call takes them (a host whose sampler is
        gone is asked too: the node may still answer); the hosts with none named, with why."""
        latest = {s.host: s.latest for s in self.streams}

        def pick_for(host: str) -> remote.Pick:
            got = latest.get(host) or next((s.latest for s in self.streams if s.latest), None)
            if self.target.via != "srun" and got is not None and got.rank_pids and latest.get(host):
                return remote.Pick(pid=got.rank_pids[0])  # its own rank: the job, whatever else runs there
            return remote.Pick(job_id=(got.job_id if got else None) or self.config.selection.job_id)

        hosts = list(self.target.hosts or ())
        unseen = [s.host for s in self.streams if s.state in ("gone", "unreachable")]
        if unseen:  # the detector judged the other hosts' samples only: say so beside its evidence
            said = f"; judged without the samples of {', '.join(unseen)} (sampler gone or never reached)"
            incident.save(reason=incident.manifest.reason + said)
        results = remote.host_looks(self.target, self.config.options, hosts, pick_for)
        missing: list[WatchHost] = []
        state = {s.host: s.state for s in self.streams}
        for host in hosts:
            got = results.get(host)
            if isinstance(got, HostLook) and got.job is not None:
                cap.write_look(incident, got.model_copy(update={"host": host}))
                continue
            if isinstance(got, HostLook):
                why = f"no rank of the job found: {got.absent or 'its answer named no job'}"[:300]
            else:
                why = got.message if got is not None else "no answer"
            was = state.get(host, "watching")
            missing.append(WatchHost(host=host, state="gone" if was == "gone" else "unreachable", note=why))
        if missing:
            incident.save(hosts_missing=missing)
        cap.write_logs(incident, self.hosts.files)

    def _ranks_gone(self) -> bool:
        """No host shows a rank: the job's end once no sampler still watches (a host between two
        attempts of the job keeps its sampler, and the watch waits for it)."""
        if any(s.state == "watching" for s in self.streams):
            return False
        self._end_attempt()
        if any(s.state == "ended" for s in self.streams):
            self._job_ended()
        else:
            said = "; ".join(f"{s.host}: {s.note}" for s in self.streams)
            self.save(
                state="failed", ended_at=wf.utc_now(), note=f"every host's sampler is gone: {said}"[:300]
            )
        return True
