"""Dump every rank of a live job at once and hand the stacks to the pure analysis.

py-spy runs on all ranks concurrently (every py-spy started before any is waited for,
all within one deadline; ``--native`` dumps capped by the cores), so the job is paused for
about one dump, not one dump per rank. A rank that is
stopped (T/t) or a zombie is reported by state without ptrace (py-spy cannot suspend a
stopped process); a rank in uninterruptible sleep (D) is read with ``--nonblocking``,
which never pauses it. One rank's failure is recorded in ``errors`` and never hides
the others.
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rankscope.analysis.code_origin import merge_roots
from rankscope.analysis.hang.backend import job_backend
from rankscope.analysis.hang.conditions import LOOK_BACK, USER_FRAMES
from rankscope.analysis.hang.counters import int_locals, on_subgroup
from rankscope.analysis.hang.frames import NO_PTRACE_STATES, is_internal_frame, is_user_frame
from rankscope.analysis.hang.group_members import read_group_locals
from rankscope.analysis.hang.locks import LOCK_LOOK_BACK, lock_frames, lock_names
from rankscope.analysis.hang.loops import LOOP_LOOK_AHEAD, LOOP_LOOK_BACK
from rankscope.analysis.hang.progress import RankWatch, judge, place_lines, watch_rank, with_recorder
from rankscope.analysis.hang.stacks import op_from_source, p2p_peer, recognise_op, source_frame
from rankscope.analysis.hang.waits import creating_communicator
from rankscope.analysis.p2p import P2P_DIRECTION
from rankscope.analysis.redact import Redactor
from rankscope.analysis.startup import init_waits, job_state
from rankscope.capabilities import discovery
from rankscope.capabilities.gpu_read import gpu_utilisation
from rankscope.capabilities.judge import judge_look
from rankscope.capabilities.progress_watch import Window, main_frames
from rankscope.capabilities.ras_read import read_ras
from rankscope.capabilities.recorder.pickup import (
    ask_again,
    find_probes,
    has_channel,
    pick_up,
    pick_up_fresh,
    recorder_plan,
    worker_servers,
)
from rankscope.capabilities.startup import startup_facts
from rankscope.capabilities.workers import worker_notes
from rankscope.errors import DUMP_FIXES, InvalidInput, NoJobsFound, PermissionDenied, ProcessNotFound
from rankscope.models.core import (
    Job,
    LocalVar,
    ProcState,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
    ThreadStack,
)
from rankscope.models.flight import FlightReport
from rankscope.models.look import HostLook, SourceLine
from rankscope.models.progress import Progress, RankMotion
from rankscope.models.ras import RasFinding
from rankscope.options import DEFAULTS, DumpOptions
from rankscope.runtime import procfs, pyspy

log = logging.getLogger("rankscope.capabilities.stacks")


MAX_DUMPS = 32
"""Concurrent py-spy processes at most (Python frames only: each is small and brief)."""


def _workers(n: int, native: bool) -> int:
    """How many dumps run at once: all ranks of a node, but a ``--native`` py-spy loads the
    symbols of libtorch & co. (about 100 MB resident each, or more), so those are capped by
    the cores."""
    cap = max(2, 2 * len(os.sched_getaffinity(0))) if native else MAX_DUMPS
    return max(1, min(n, cap))


SPAWN_WRAP = "_wrap"
"""torch.multiprocessing.spawn's per-child entry: ``_wrap(fn, i, args, error_file)``."""


def _spawn_index(threads: list[ThreadStack]) -> int | None:
    """The ``i`` argument of torch.multiprocessing.spawn._wrap, when locals were captured."""
    for thread in threads:
        for frame in thread.frames:
            if frame.function == SPAWN_WRAP and frame.file.endswith("multiprocessing/spawn.py"):
                for local in frame.locals or ():
                    if local.name == "i" and local.repr is not None:
                        try:
                            return int(local.repr)
                        except ValueError:
                            return None
    return None


def _nprocs_from(threads: list[ThreadStack]) -> int | None:
    """``nprocs`` from the spawn parent's ``start_processes`` frame: the world size of an mp.spawn job."""
    for thread in threads:
        for frame in thread.frames:
            if frame.function in ("start_processes", "spawn") and frame.file.endswith(
                "multiprocessing/spawn.py"
            ):
                for local in frame.locals or ():
                    if local.name == "nprocs" and local.repr and local.repr.isdigit():
                        return int(local.repr)
    return None


def _with_source_op(stack: RankStack, getline: Callable[[str, int], str] = linecache.getline) -> RankStack:
    """Let the analysis see a C++ wait that only a source line names: ``req.wait()`` right
    under user code, or ``torch.ops._c10d_functional.wait_tensor`` in a compiled graph."""
    frames = main_frames(stack.threads)
    inner = source_frame(frames)
    if inner is None or inner.line is None:
        return stack
    line = getline(inner.file, inner.line)
    op, evidence = op_from_source(frames, line or None)
    return stack.model_copy(update={"op": op, "op_evidence": evidence}) if op else stack


def source_lines(
    stacks: list[RankStack], getline: Callable[[str, int], str] = linecache.getline
) -> dict[tuple[str, int], str]:
    """Source text the analysis reads, by (file, line), indentation kept.

    Each rank's innermost Python line: ``loss.item()`` has no Python frame of its own, so on NCCL
    the line itself says the CPU waits for the GPU there. And the lines above its innermost user
    frames: the ``if rank == 0:`` a collective is called under, the loop one rank has left (in the
    job's code or a training library's, never torch's or the standard library's); and the rest of
    that loop's body below them, where the ``break`` one rank took alone stands. Read
    from the files on this host; a line that cannot be read is left out.
    """
    wanted: set[tuple[str, int]] = set()
    for stack in stacks:
        frames = [f for f in main_frames(stack.threads) if not f.native]
        if frames and frames[0].line is not None:
            wanted.add((frames[0].file, frames[0].line))
        user = [(f.file, f.line) for f in frames if is_user_frame(f) and f.line is not None][:USER_FRAMES]
        # a training library's loop (a Trainer's fit) is where ranks part as often as the job's own
        loops = [(f.file, f.line) for f in frames if f.line is not None and not is_internal_frame(f)]
        for file, line in [*user, *loops[:USER_FRAMES]]:
            end = line or 0
            start = max(1, end - max(LOOK_BACK, LOOP_LOOK_BACK))
            wanted.update((file, n) for n in range(start, end + LOOP_LOOK_AHEAD + 1))
        wanted |= _lock_lines(stack, getline)
    lines: dict[tuple[str, int], str] = {}
    for key in sorted(wanted):
        text = getline(*key)
        if text:
            lines[key] = text.rstrip("\r\n")
    return lines


def _lock_lines(stack: RankStack, getline: Callable[[str, int], str]) -> set[tuple[str, int]]:
    """The lines a lock cycle is read from: for each thread blocked at a line that takes a lock
    (``with b:``, ``b.acquire()``), the lines above it and above its callers' lines, where the locks
    it still holds were taken. A thread at any other line costs one line read and adds none."""
    wanted: set[tuple[str, int]] = set()
    for thread in stack.threads:
        frames = lock_frames(thread)
        if not frames or frames[0].line is None or not lock_names(getline(frames[0].file, frames[0].line)):
            continue
        for frame in frames:
            end = frame.line or 0
            wanted.update((frame.file, n) for n in range(max(1, end - LOCK_LOOK_BACK), end + 1))
    return wanted


def _p2p_peers(dumps: list[_Dump], exe: str) -> dict[int, int]:
    """pid -> peer rank, for the ranks blocked in a send/recv.

    Which rank a recv waits for is only in its locals (``src``), and without it a cycle of
    receiving ranks cannot be named. A dump taken with locals (mp.spawn ranks) is read as it
    is; the other ranks found in a send/recv are dumped once more, with locals, and only the
    peer is kept: the locals themselves are dropped here and never reach the report unless
    asked for. A rank that moved on in between gives no peer.
    """
    peers: dict[int, int] = {}
    again: list[_Dump] = []

    def read(d: _Dump) -> None:
        frames = main_frames(d.threads or [])
        peer = p2p_peer(frames) if recognise_op(frames)[0] in P2P_DIRECTION else None
        if peer is not None:
            peers[d.pid] = peer

    for d in dumps:
        if d.rank is None:
            continue
        if d.options.locals:
            read(d)  # the op is recognised once, by read itself
        elif recognise_op(main_frames(d.threads or []))[0] in P2P_DIRECTION:
            again.append(_Dump(pid=d.pid, rank=d.rank, options=_with_locals(d.options), state=d.state))
    if again:
        _run_dumps(again, exe, lambda: None)
        for d in again:
            if d.failure is not None:
                log.info("no send/recv peer for pid %d: %s", d.pid, d.failure)
            read(d)
    return peers


def _redact_threads(threads: list[ThreadStack], redactor: Redactor, keep_locals: bool) -> list[ThreadStack]:
    out: list[ThreadStack] = []
    for thread in threads:
        frames = []
        for frame in thread.frames:
            if frame.locals is None:
                frames.append(frame)
                continue
            new_locals = (
                [
                    LocalVar(name=v.name, repr=redactor.value(v.name, v.repr or ""), arg=v.arg)
                    for v in frame.locals
                ]
                if keep_locals
                else None
            )
            frames.append(frame.model_copy(update={"locals": new_locals}))
        out.append(thread.model_copy(update={"frames": frames}))
    return out


def _exited(proc: RankProcess) -> tuple[RankStack, RankError]:
    err = RankError(
        rank=proc.rank,
        pid=proc.pid,
        host=proc.host,
        kind="process_exited",
        message=f"pid {proc.pid} exited before its stack could be captured",
        fix=DUMP_FIXES["process_exited"],
    )
    return RankStack(rank=proc.rank, pid=proc.pid, host=proc.host, state="dead", error=err), err


def _with_locals(options: DumpOptions) -> DumpOptions:
    """A dump that reads locals only for what they say of the rank (peers, counters, groups, the
    spawn index): Python frames, so it costs no symbol loading."""
    return dataclasses.replace(options, locals=True, native=False)


@dataclass
class _Dump:
    """One py-spy dump to run: the rank it is for (None: the spawn parent) and its options (the
    capture's, with locals or nonblocking turned on where this rank needs them)."""

    pid: int
    rank: RankProcess | None
    options: DumpOptions
    state: ProcState = "unknown"
    proc: pyspy.StartedDump | None = None
    threads: list[ThreadStack] | None = None
    failure: pyspy.DumpFailed | None = None


def _run_dumps(dumps: list[_Dump], exe: str, meanwhile: Callable[[], None]) -> None:
    """Run the dumps side by side, at most ``_workers`` at once, each within its options' timeout.

    Every py-spy is started before any is waited for (no thread per rank: starting eight
    threads costs more than the eight dumps of a small job), then ``meanwhile`` runs while
    they work; each dump is collected as it ends, whichever ends first, and its slot goes at
    once to the next waiting one (a slow rank never holds the others' slots idle). Each dump's
    result or failure is stored on it.
    """
    limit = _workers(len(dumps), any(d.options.native for d in dumps))
    waiting = list(dumps)
    running: dict[int, _Dump] = {}  # by id of its started py-spy

    def start_next() -> None:
        while waiting and len(running) < limit:
            d = waiting.pop(0)
            try:
                d.proc = pyspy.start_dump(d.pid, d.options, exe)
            except pyspy.DumpFailed as exc:
                d.failure = exc
                continue
            running[id(d.proc)] = d

    try:
        start_next()
        meanwhile()
        while running:
            started = pyspy.wait_first([d.proc for d in running.values() if d.proc is not None])
            d = running.pop(id(started))
            raw: list[dict[str, Any]] | None = None
            try:
                raw = pyspy.finish_dump(started)
            except pyspy.DumpFailed as exc:
                d.failure = exc
            start_next()  # before parsing: py-spy works while this one is parsed
            if raw is not None:
                d.threads = pyspy.parse_dump(raw, d.pid, procfs.code_roots(d.pid))
    finally:
        for d in running.values():  # only on an exception (e.g. KeyboardInterrupt): leave no py-spy behind
            if d.proc is not None:
                pyspy.abandon(d.proc)


def _result(d: _Dump) -> tuple[RankStack, RankError | None]:
    proc = d.rank
    if proc is None:  # pragma: no cover - the spawn parent is not a rank
        raise ValueError("the spawn parent's dump has no rank")
    base = RankStack(rank=proc.rank, pid=proc.pid, host=proc.host, state=d.state)
    if d.failure is not None:
        exc = d.failure
        now = discovery.proc_state(proc.pid) or "dead"
        err = RankError(
            rank=proc.rank, pid=proc.pid, host=proc.host, kind=exc.kind, message=exc.message, fix=exc.fix
        )
        return base.model_copy(update={"state": now, "error": err}), err
    if d.threads is None:
        return base, None  # reported by state: ptrace would block on a stopped process
    return base.model_copy(update={"threads": d.threads}), None


def _renumber_spawn_rank(
    stack: RankStack, proc: RankProcess, ranks: list[RankProcess]
) -> tuple[RankStack, list[RankProcess]]:
    """An mp.spawn rank numbered by its ``_wrap(fn, i, ...)`` index, read from its stack."""
    index = _spawn_index(stack.threads)
    if index is None:
        return stack, ranks
    update: dict[str, object] = {"rank_source": "spawn_index"}
    if index != stack.rank:
        stack = stack.model_copy(update={"rank": index})
        update.update(rank=index, local_rank=index)
    return stack, [r.model_copy(update=update) if r.pid == proc.pid else r for r in ranks]


def _plan_dumps(
    procs: list[RankProcess], options: DumpOptions, watching: bool
) -> tuple[dict[int, tuple[RankStack, RankError | None]], list[_Dump]]:
    """Ranks settled by their state alone (gone, stopped: no ptrace), and the dumps to run.
    ``watching``: the first look of a progress window, which reads locals (integers kept).
    A ``--native`` dump reads locals too: they add almost nothing to its symbol loading, and the
    counters and send/recv peers are then read from it instead of a second round of dumps."""
    settled: dict[int, tuple[RankStack, RankError | None]] = {}
    dumps: list[_Dump] = []
    for r in procs:
        state = discovery.proc_state(r.pid)
        if state is None:
            settled[r.pid] = _exited(r)
        elif state in NO_PTRACE_STATES:
            settled[r.pid] = (RankStack(rank=r.rank, pid=r.pid, host=r.host, state=state), None)
        else:
            own = dataclasses.replace(
                options,
                # spawn ranks carry no RANK variable: `i` is read from _wrap's locals
                locals=options.locals or watching or options.native or r.launcher == "mp_spawn",
                nonblocking=options.nonblocking or state == "disk_sleep",
            )
            dumps.append(_Dump(pid=r.pid, rank=r, options=own, state=state))
    return settled, dumps


def _parent_nprocs(parent: _Dump | None) -> int | None:
    """The world size an mp.spawn parent's dump shows, if it was dumped and shows one."""
    if parent is None:
        return None
    if parent.failure is not None:
        log.info("cannot read nprocs from spawn parent %d: %s", parent.pid, parent.failure)
        return None
    return _nprocs_from(parent.threads) if parent.threads is not None else None


def _hand_over(dumps: list[_Dump], window: Window | None, looks: dict[int, list[ThreadStack]] | None) -> None:
    """Each rank's threads as dumped, locals not yet dropped: to the window's first look, and to
    ``looks`` where the dump took locals (they serve the counters then, with no other pass)."""
    for d in dumps:
        if d.rank is not None and d.threads is not None:
            if window is not None:
                window.first_look(d.pid, d.threads)
            if looks is not None and d.options.locals:
                looks[d.pid] = d.threads


def capture_job(
    job: Job,
    options: DumpOptions = DEFAULTS,
    *,
    ranks: list[int] | None = None,
    exe: str | None = None,
    environs: dict[int, dict[str, str]] | None = None,
    during: Callable[[], None] | None = None,
    window: Window | None = None,
    looks: dict[int, list[ThreadStack]] | None = None,
) -> tuple[Job, list[RankStack], list[RankError]]:
    """Dump the job's ranks concurrently; return the job (spawn ranks fixed), stacks and errors.

    ``options``: how each rank is dumped (native, locals, nonblocking, timeout).
    ``exe``: a py-spy already checked by :func:`pyspy.check_pyspy` (default: check now).
    ``environs``, when given, receives each rank's environment (pid -> variables), read once
    while the dumps run, for the callers that need it after (recorder paths, RAS address);
    ``during`` runs then too (nvidia-smi), so that neither adds to the pause. ``window``, when
    given, is the first look of a progress window: the dumps take locals (only their integers are
    kept, unless ``locals``) and each rank's main thread is handed to it before anything is dropped.
    ``looks``, when given, receives each rank's threads as dumped (pid -> threads, locals not yet
    dropped), so that a dump taken with locals serves the counters without another pass.
    """
    exe = exe or pyspy.check_pyspy()
    procs = [r for r in job.ranks if ranks is None or r.rank in ranks]
    # spawn ranks carry no RANK variable: read `i` from _wrap's locals, so locals are always taken.
    dumps: list[_Dump] = []
    parent: _Dump | None = None
    if job.launcher == "mp_spawn" and job.world_size is None and job.launcher_pid and procs:
        parent = _Dump(job.launcher_pid, None, dataclasses.replace(options, locals=True, nonblocking=False))
        dumps.append(parent)
    settled, planned = _plan_dumps(procs, options, window is not None)
    dumps += planned
    redactor = Redactor()

    def meanwhile() -> None:
        # while the dumps run: the redactor needs the ranks' environments to scrub them
        for r in procs:
            env = discovery.read_environ(r.pid)
            if env:
                redactor.learn_env(env)
                if environs is not None:
                    environs[r.pid] = env
        if during is not None:
            during()

    _run_dumps(dumps, exe, meanwhile)
    _hand_over(dumps, window, looks)
    peers = {} if options.locals else _p2p_peers(dumps, exe)
    by_pid = {d.pid: d for d in dumps if d.rank is not None}
    results = [settled[r.pid] if r.pid in settled else _result(by_pid[r.pid]) for r in procs]
    nprocs = _parent_nprocs(parent)
    stacks: list[RankStack] = []
    errors: list[RankError] = []
    new_ranks = list(job.ranks)
    for stack, err in results:
        proc = next(r for r in procs if r.pid == stack.pid)
        if proc.launcher == "mp_spawn":
            stack, new_ranks = _renumber_spawn_rank(stack, proc, new_ranks)
        stack = _with_source_op(stack).model_copy(update={"backend": proc.backend})
        if stack.pid in peers:
            stack = stack.model_copy(update={"peer": peers[stack.pid]})
        stack = stack.model_copy(update={"threads": _redact_threads(stack.threads, redactor, options.locals)})
        stacks.append(stack)
        if err is not None:
            errors.append(err)
    update: dict[str, object] = {
        "ranks": sorted(new_ranks, key=lambda r: (r.rank is None, r.rank or 0, r.pid))
    }
    if nprocs is not None:
        update["world_size"] = nprocs
        update["notes"] = [
            *job.notes,
            f"world size {nprocs} read from the spawn parent's start_processes(nprocs=...)",
        ]
    job = job.model_copy(update=update)
    return job, stacks, errors


def counter_pass(
    stacks: list[RankStack],
    procs: list[RankProcess],
    exe: str,
    options: DumpOptions,
    only: set[int] | None = None,
    world: int | None = None,
) -> list[RankStack]:
    """``stacks`` with each live rank's progress counters, whether its collective runs on a
    subgroup and what its locals say of the groups' members, read in one more pass with locals.

    Only integers (:func:`int_locals`), that one fact (:func:`on_subgroup`) and the group
    tables (:func:`read_group_locals`) are kept; every
    other local is dropped here and never reaches the report. A rank whose Python stack changed between the passes moved on: its
    counters would not belong to the stack analysed, so it gets none.
    """
    known = {p.pid for p in procs}
    pids = {s.pid for s in stacks if s.pid in known and (only is None or s.rank in only)}
    if not pids:
        return stacks
    return locals_read(stacks, dump_locals(stacks, pids, exe, options), procs, world)


def dump_locals(
    stacks: list[RankStack], pids: set[int], exe: str, options: DumpOptions
) -> dict[int, list[ThreadStack]]:
    """One more dump, with locals, of each rank of ``pids`` that py-spy may attach to: pid -> threads.
    The locals are not redacted: the callers keep only integers and group facts."""
    todo = [
        _Dump(pid=s.pid, rank=None, options=_with_locals(options), state=s.state)
        for s in stacks
        if s.pid in pids and s.threads and s.state not in NO_PTRACE_STATES
    ]
    _run_dumps(todo, exe, lambda: None)
    return {d.pid: d.threads for d in todo if d.threads is not None}


def locals_read(
    stacks: list[RankStack],
    dumped: dict[int, list[ThreadStack]],
    procs: list[RankProcess],
    world: int | None,
    only: set[int] | None = None,
) -> list[RankStack]:
    """``stacks`` with the counters, subgroup and group tables read from dumps taken with locals
    (``dumped``: pid -> threads), for the ranks whose Python stack did not change in between."""
    by_pid = {p.pid: p for p in procs}
    read: dict[int, dict[str, object]] = {}
    for pid, threads in dumped.items():
        if pid not in by_pid or (only is not None and by_pid[pid].rank not in only):
            continue
        stack = next((s for s in stacks if s.pid == pid), None)
        if stack is None or not stack.threads:
            continue
        before = [(f.function, f.file) for f in main_frames(stack.threads) if not f.native]
        after = main_frames(threads)
        if [(f.function, f.file) for f in after if not f.native] == before:
            read[pid] = {
                "counters": int_locals(after),
                "subgroup": on_subgroup(after),
                "group_locals": read_group_locals(after, by_pid[pid].rank, world),
            }
    return [s.model_copy(update=read[s.pid]) if s.pid in read else s for s in stacks]


def _ras(
    job: Job, stacks: list[RankStack], environs: dict[int, dict[str, str]]
) -> tuple[RasFinding | None, str]:
    creating = sorted(
        s.rank
        for s in stacks
        if s.rank is not None and any(t.is_main and creating_communicator(t.frames) for t in s.threads)
    )
    if creating:
        return None, (
            f"NCCL RAS not read: ranks {creating} are creating a communicator, when a status query has crashed "
            "jobs (NVIDIA/nccl#2346); ask again once they are past it"
        )
    return read_ras(job, environs)


def _needs_group_tables(stacks: list[RankStack]) -> bool:
    return any(s.subgroup and s.group_locals is not None and s.group_locals.slot is not None for s in stacks)


def _check_ranks(job: Job, ranks: list[int] | None) -> None:
    if ranks is None:
        return
    known = {r.rank for r in job.ranks}
    unknown = [r for r in ranks if r not in known]
    if unknown and len(unknown) == len(ranks):
        raise InvalidInput(
            f"ranks {unknown} are not among the ranks found here ({sorted(k for k in known if k is not None)}).",
            fix="Pass --only-rank (MCP: ranks) with a rank listed by `rankscope ps`.",
        )


@dataclass(frozen=True)
class _Evidence:
    """What one host's capture found besides the stacks, as it is gathered: the job (with its
    notes), the recorder, RAS, the source lines, the window's progress."""

    job: Job
    errors: list[RankError]
    flight: FlightReport | None
    ras: RasFinding | None
    source: dict[tuple[str, int], str]
    options: DumpOptions = DEFAULTS
    progress: Progress | None = None
    channel: Callable[[], FlightReport | None] | None = None
    """Asks the ranks for a fresh recorder dump, where they opened a channel for one (the window's last end)."""
    recorder_start: FlightReport | None = None
    """The fresh dump asked for at the start of the window."""

    def noting(self, note: str) -> _Evidence:
        """The same evidence with one more job note."""
        return dataclasses.replace(self, job=self.job.model_copy(update={"notes": [*self.job.notes, note]}))


def dump_stacks(
    pid: int | None = None,
    options: DumpOptions = DEFAULTS,
    *,
    ranks: list[int] | None = None,
    job_id: str | None = None,
) -> StacksReport:
    """Discover the job of ``pid`` (or the job ``job_id``, or the only job here), capture it
    (:func:`capture`: only ``ranks``, when given) and judge the evidence
    (:func:`~rankscope.capabilities.judge.judge_look`), as the collecting host of a multi-host call
    judges every host's.

    ``options`` (:class:`DumpOptions`) says how: ``window``, how long the job is watched (0: one
    look, as a saved dump); a job that moves in that time gets a progress verdict (progressing,
    straggler, busy), never a hang one. ``counters``: read the ranks' integer locals (step, epoch)
    (from the window's last look, or one more pass). ``flight_recorder``: analyse the recorder
    dumps the ranks already wrote in this run, ask the ranks that opened a channel for it (a debug
    pipe, rankscope.probe's signal, a worker socket) for one, and, when the verdict is still unsure,
    the job's store and debug server. ``ras``: read NCCL RAS's launch counts twice (never by
    default: querying it has crashed jobs on some NCCL versions).
    Raises PermissionDenied when no rank at all could be attached for lack of permission;
    any other per-rank failure stays inside the report's ``errors``.
    """
    exe = pyspy.check_pyspy()  # fail fast, before touching the job
    with procfs.reading_once():  # discovery's reads of environ, fds, maps serve the capture too
        job = discovery.find_job(pid, job_id)
        _check_ranks(job, ranks)
        look = _capture_or_startup(job, options, ranks, exe)
    return judge_look(look, options)


def _capture_or_startup(job: Job, options: DumpOptions, ranks: list[int] | None, exe: str) -> HostLook:
    """:func:`capture`, with this host's start-up facts for a job in start-up: launchers with no
    rank yet (no stack to capture: their facts alone), or ranks that all wait before their first
    collective."""
    look = capture(job, options, ranks, exe) if job.ranks else HostLook(host=discovery.this_host(), job=job)
    if job_state(job) is None and not (look.stacks and len(init_waits(look.stacks)) == len(look.stacks)):
        return look  # some rank is past start-up: its stacks say the rest
    return look.model_copy(update={"startup": [startup_facts(look.job)]})


def look_here(
    pid: int | None = None,
    options: DumpOptions = DEFAULTS,
    *,
    job_id: str | None = None,
    here: str | None = None,
) -> HostLook:
    """This host's evidence for a multi-host call (``stacks --local``): :func:`capture`, the same
    pass :func:`dump_stacks` makes, and no verdict: the collecting host judges every host's ranks
    together. The job is picked by ``pid`` or ``job_id``, else the one started in ``here`` (the
    caller's folder), else the only one; several and none picked: the jobs, as choices."""
    exe = pyspy.check_pyspy()
    with procfs.reading_once():
        try:
            job, chosen_by, choices = discovery.pick_job(pid, job_id, here)
        except (NoJobsFound, ProcessNotFound) as exc:
            if pid is not None:
                raise  # the pid was named on this host: it must be here
            # no rank of it here: the collecting host counts its ranks on the others (and, for a job
            # in start-up, which process here listens where its store should)
            return HostLook(host=discovery.this_host(), absent=exc.message, startup=[startup_facts(None)])
        if job is None:
            return HostLook(host=discovery.this_host(), choices=choices)
        return _capture_or_startup(job, options, None, exe).model_copy(update={"chosen_by": chosen_by})


SAME_DUMP_COUNTERS = "progress counters read from the capture's own dump, taken with locals (integers only)"
"""The note of a single ``--native`` look: its dumps took locals, so no second pass was needed."""


def capture(job: Job, options: DumpOptions, ranks: list[int] | None, exe: str) -> HostLook:
    """One host's capture of ``job``, in one pass, as evidence: the window and the stacks (only
    ``ranks``, when given), the recorder asked once at each end of the window, RAS, the source lines
    the frames need, the counters (from the window's last look, or one more pass), and the busy
    workers of the ranks that wait on them; unless the job moved, when counters and workers say
    nothing a verdict needs."""
    evidence, stacks, last = _look(job, options, ranks, exe)
    moving = evidence.progress is not None and evidence.progress.motion == "moving"
    if options.counters and not options.locals and not moving:
        stacks, evidence = _locals_pass(stacks, evidence, exe, None, last)
        if evidence.progress is None and last is not None and any(s.counters for s in stacks):
            evidence = evidence.noting(SAME_DUMP_COUNTERS)
    job = evidence.job
    return HostLook(
        host=discovery.this_host(),
        job=job,
        stacks=stacks,
        errors=evidence.errors,
        progress=evidence.progress,
        flight=evidence.flight,
        ras=evidence.ras,
        source=[SourceLine(file=f, line=n, text=t) for (f, n), t in sorted(evidence.source.items())],
        workers=[] if moving else worker_notes(job, stacks, exe, options),
        worker_servers=options.flight_recorder and evidence.flight is None and worker_servers(job),
        code_roots=merge_roots(procfs.code_roots(r.pid) for r in job.ranks),
    )


def _look(
    job: Job, options: DumpOptions, ranks: list[int] | None, exe: str
) -> tuple[_Evidence, list[RankStack], dict[int, list[ThreadStack]] | None]:
    """Watch ``job`` for the options' window and capture its ranks (only ``ranks``, when given):
    the evidence, the stacks, and the window's last look (taken with locals), before any verdict.
    With no window, a ``--native`` capture's own dumps (taken with locals) stand for that last look."""
    environs: dict[int, dict[str, str]] = {}
    looks: dict[int, list[ThreadStack]] | None = {} if options.native and options.window == 0 else None
    util: dict[int, int] = {}  # by pid: mp.spawn ranks may be renumbered by the capture
    pid_of = {r.rank: r.pid for r in job.ranks if r.rank is not None}
    watch = (
        Window.open([r.pid for r in job.ranks if ranks is None or r.rank in ranks], exe)
        if options.window > 0
        else None
    )
    try:
        job, stacks, errors = capture_job(
            job,
            options,
            ranks=ranks,
            exe=exe,
            environs=environs,
            during=lambda: util.update(
                {pid_of[r]: u for r, u in gpu_utilisation(job).items() if r in pid_of}
            ),
            window=watch,
            looks=looks,
        )
        if errors and all(e.kind == "permission_denied" for e in errors) and len(errors) == len(stacks):
            raise PermissionDenied(errors[0].message)
        if ranks is not None:
            stacks = [s for s in stacks if s.rank in ranks]
        if util:
            stacks = [s.model_copy(update={"gpu_util": util[s.pid]}) if s.pid in util else s for s in stacks]
        if watch is not None:
            watch.sample(job.ranks, {s.pid: s.state for s in stacks})
        analysis = _gather(job, stacks, errors, environs, options, ranks=ranks, watching=watch is not None)
        last = looks
        if watch is not None:
            analysis, last = _close_window(watch, analysis, stacks, exe)
    finally:
        if watch is not None:
            watch.stop()
    return analysis, stacks, last


def _close_window(
    watch: Window, analysis: _Evidence, stacks: list[RankStack], exe: str
) -> tuple[_Evidence, dict[int, list[ThreadStack]]]:
    """End the window: the last look with locals, then what moved (with the source of every place seen)."""

    def last_look(pids: list[int]) -> dict[int, list[ThreadStack]]:
        return dump_locals(stacks, set(pids), exe, analysis.options)

    watches, last = watch.close(watch.started + analysis.options.window, last_look)
    if analysis.channel is not None and analysis.recorder_start is not None:
        # the recorder's completed collectives at both ends of the window, too
        with_recorder(watches, analysis.recorder_start, analysis.channel())
    source = dict(analysis.source)
    for key in sorted(place_lines(watches) - source.keys()):
        text = linecache.getline(*key)
        if text:
            source[key] = text.rstrip("\r\n")
    backend = job_backend(analysis.job, stacks)
    window_s = time.monotonic() - watch.started
    progress = judge(watches, backend=backend, source=source, window_s=window_s)
    straggler = next((r for r in progress.ranks if r.rank == progress.straggler), None)
    if straggler is not None and straggler.hot and not straggler.hot_locals:
        look = functools.partial(watch_rank, backend=backend, source=source)
        if _look_again(straggler.rank, watches, stacks, exe, analysis.options, look):
            progress = judge(watches, backend=backend, source=source, window_s=window_s)
    return dataclasses.replace(analysis, source=source, progress=progress), last


STRAGGLER_LOOKS = 3
"""Extra looks (with locals) at a straggler whose window never caught it in its hot functions."""


def _look_again(
    rank: int,
    watches: list[RankWatch],
    stacks: list[RankStack],
    exe: str,
    options: DumpOptions,
    look: Callable[[RankWatch], RankMotion],
) -> bool:
    """Dump the straggler with locals again, a few times at most, until its watch holds the
    integer locals of the functions its time goes to (``side=448``: why its work is larger), as
    ``look`` reads them. True when a look was added to its watch."""
    watch = next((w for w in watches if w.rank == rank), None)
    stack = next((s for s in stacks if s.rank == rank), None)
    if watch is None or stack is None:
        return False
    added = False
    for _ in range(STRAGGLER_LOOKS):
        frames = main_frames(dump_locals(stacks, {stack.pid}, exe, options).get(stack.pid))
        if not frames:
            break
        watch.later.append(int_locals(frames))
        added = True
        if look(watch).hot_locals:
            break
    return added


def _gather(
    job: Job,
    stacks: list[RankStack],
    errors: list[RankError],
    environs: dict[int, dict[str, str]],
    options: DumpOptions,
    *,
    ranks: list[int] | None,
    watching: bool = False,
) -> _Evidence:
    """The evidence besides the stacks: the recorder, RAS, source lines. ``watching``: a progress
    window is open; where the job opened a recorder channel, a fresh dump is asked for now and
    another at the window's end (an older dump would make a hung job look as if it moved)."""
    notes = list(job.notes)
    if ranks is not None:
        notes.append(f"only ranks {sorted(ranks)} were captured (--only-rank): the verdict covers them alone")
    # read once: the pickup looks for their dumps and asks them, the NCCL recorder plan names them
    probes = find_probes(job) if options.flight_recorder or job.backend in ("nccl", "mixed") else {}
    channel = options.flight_recorder and watching and has_channel(job, environs, probes)
    start: FlightReport | None = None
    if channel:  # asked once now, for the capture and the window's first end alike
        flight, start = pick_up_fresh(job, environs=environs, probes=probes)
    else:
        flight = pick_up(job, environs=environs, probes=probes) if options.flight_recorder else None
    if flight is not None:
        notes.append(f"flight recorder: {len(flight.dumps)} dump(s) this run wrote, analysed with the stacks")
    ras_finding = None
    if options.ras:
        ras_finding, note = _ras(job, stacks, environs)
        notes.append(note)
    job = job.model_copy(update={"notes": notes, "recorder": recorder_plan(job, environs, probes)})
    again = functools.partial(ask_again, job, environs=environs, probes=probes) if channel else None
    return _Evidence(
        job, errors, flight, ras_finding, source_lines(stacks), options, channel=again, recorder_start=start
    )


def _locals_pass(
    stacks: list[RankStack],
    analysis: _Evidence,
    exe: str,
    only: set[int] | None,
    last: dict[int, list[ThreadStack]] | None = None,
) -> tuple[list[RankStack], _Evidence]:
    """One more pass with locals: counters, subgroups, group tables (of every rank when a suspect's
    group is in one). ``last``: the window's last look, taken with locals: read instead of a pass."""
    job = analysis.job
    if last is not None:
        stacks = locals_read(stacks, last, job.ranks, job.world_size, only)
        if only is not None and _needs_group_tables(stacks):
            rest = {s.rank for s in stacks if s.rank is not None} - only
            stacks = locals_read(stacks, last, job.ranks, job.world_size, rest)
        return stacks, analysis  # the window's own evidence already says its looks took locals
    stacks = counter_pass(stacks, job.ranks, exe, analysis.options, only, job.world_size)
    if only is not None and _needs_group_tables(stacks):
        rest = {s.rank for s in stacks if s.rank is not None} - only
        stacks = counter_pass(stacks, job.ranks, exe, analysis.options, rest, job.world_size)
    if any(s.counters for s in stacks):
        analysis = analysis.noting("progress counters read in a second pass with locals (integers only)")
    return stacks, analysis


__all__ = ["capture_job", "dump_stacks", "look_here"]
