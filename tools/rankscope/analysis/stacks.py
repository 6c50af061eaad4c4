"""Pure hang analysis: which operation each rank waits in, who diverged, what next.

Input is what the shell captured (the job, per-rank stacks, per-rank errors), possibly
merged from several hosts; output is a :class:`StacksReport` whose ``verdict`` is a
stable JSON contract. No I/O here: this module is tested against captured py-spy output.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from rankscope.analysis.bound import bound_report
from rankscope.analysis.collectives import (
    BACKWARD_FRAMES,
    NATIVE_STRONG,
    classify_native_frame,
    classify_python_frame,
    frame_key,
)
from rankscope.analysis.p2p import P2P_DIRECTION, Waits, cycle_phrase, find_cycle, is_matched, verb
from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.models.core import (
    CallSite,
    Frame,
    Group,
    Job,
    NextStep,
    ProcState,
    RankError,
    RankStack,
    StacksReport,
    ThreadStack,
    Verdict,
)
from rankscope.models.flight import FlightReport

MAX_GROUP_FRAMES = 60
"""Representative frames kept per group (innermost first)."""

STUCK_STATES: frozenset[str] = frozenset({"stopped", "tracing_stop", "disk_sleep"})
GONE_STATES: frozenset[str] = frozenset({"zombie", "dead"})

DDP_BACKWARD_OP = "ddp.gradient_all_reduce"
BACKWARD_OP = "autograd.backward"
"""A rank inside backward with no communication frame seen: with DDP, the gradient
all-reduce waits in C++ at the end of backward, invisible to Python frames."""

_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/(?!site-packages/|dist-packages/)")
_THIRD_PARTY = ("/site-packages/", "/dist-packages/", "/torch/", "/rankscope/probe/")

_PLAYBOOK = "skill/hangs.md"


# -- frames ------------------------------------------------------------------------------------


GENERATED_MARKER = "/torchinductor_"
"""torch.compile's generated code lives in inductor's cache (``/tmp/torchinductor_<user>/``)."""


def is_generated_frame(frame: Frame) -> bool:
    """True for a frame of code that torch.compile generated (inductor's ``Runner.call``)."""
    return not frame.native and GENERATED_MARKER in frame.file.replace("\\", "/")


def is_user_frame(frame: Frame) -> bool:
    """True for a Python frame in the job's own code (not torch, site-packages, the stdlib, or
    code torch.compile generated)."""
    if frame.native:
        return False
    path = frame.file.replace("\\", "/")
    if not path or path.startswith("<") or GENERATED_MARKER in path:
        return False
    if any(part in path for part in _THIRD_PARTY):
        return False
    return not _STDLIB.search(path)


def main_thread(stack: RankStack) -> ThreadStack | None:
    """The thread the analysis starts from: py-spy's main thread, else MainThread by name."""
    if not stack.threads:
        return None
    picks: tuple[Callable[[ThreadStack], bool], ...] = (
        lambda t: t.is_main,
        lambda t: t.os_thread_id is not None and t.os_thread_id == stack.pid,
        lambda t: t.name == "MainThread",
    )
    for pick in picks:
        for thread in stack.threads:
            if pick(thread):
                return thread
    return stack.threads[0]


def find_call_site(frames: Iterable[Frame]) -> CallSite | None:
    """The innermost user frame: where the job's own code called into the library."""
    for frame in frames:
        if is_user_frame(frame):
            return CallSite(file=frame.file, line=frame.line, function=frame.function)
    return None


def lib_where(frame: Frame) -> str:
    """``torch/distributed/distributed_c10d.py:3252``: a library frame without the install prefix."""
    path = frame.file.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = os.path.basename(path) or path
    return f"{path}:{frame.line}" if frame.line is not None else path


def blocked_in(frames: list[Frame]) -> str | None:
    """The library call the user code is waiting in (``Queue.get``), for a rank in no collective.

    That is the outermost non-user Python frame inside the innermost user frame.
    """
    last: Frame | None = None
    for frame in frames:
        if frame.native:
            continue
        if is_user_frame(frame):
            break
        last = frame
    else:
        return None
    return f"{last.function} ({lib_where(last)})" if last is not None else None


def short_site(site: CallSite | None) -> str:
    """``train.py:21`` (basename and line) for summaries."""
    if site is None:
        return "an unknown site"
    base = os.path.basename(site.file) or site.file
    return f"{base}:{site.line}" if site.line is not None else base


def _ddp_in_use(stacks: list[RankStack]) -> str | None:
    """Evidence that the job uses DDP, from any frame, native frame or local of any rank."""
    for stack in stacks:
        for thread in stack.threads:
            for frame in thread.frames:
                if "c10d::Reducer" in frame.function:
                    return f"native frame {frame.function} on rank {stack.rank}"
                if "DistributedDataParallel" in frame.function:
                    return f"frame {frame.function} on rank {stack.rank}"
                for local in frame.locals or ():
                    if local.repr and "DistributedDataParallel" in local.repr:
                        return f"local {local.name!r} holds a DistributedDataParallel on rank {stack.rank}"
    return None


def recognise_op(frames: list[Frame], ddp_evidence: str | None = None) -> tuple[str | None, str | None]:
    """The torch.distributed operation a main thread is blocked in, and the frames that say so.

    Python frames are read from the innermost frame out to the first user frame: the
    outermost c10d / functional-collective frame there names the op (the API the code
    called: ``all_gather_object``, not the ``all_gather`` it issues internally); FSDP,
    FSDP2, DTensor and DDP frames in between are reported as its context.
    Native frames (``--native``) fill in what Python frames cannot show (Work.wait,
    the DDP Reducer). Returns ``(None, None)`` when no communication is in sight.
    """
    op: str | None = None
    where: Frame | None = None
    context: list[str] = []
    native_marks: list[tuple[str, Frame]] = []
    backward: Frame | None = None
    for frame in frames:
        if frame.native:
            mark = classify_native_frame(frame.function)
            if mark:
                native_marks.append((mark, frame))
            continue
        if is_user_frame(frame):
            break
        kind = classify_python_frame(frame.function, frame.file)
        if kind.op:
            op, where = kind.op, frame
        elif kind.framework and f"{kind.framework} {kind.phase}" not in context:
            context.append(f"{kind.framework} {kind.phase}")
        if backward is None and frame.function in BACKWARD_FRAMES and "torch/" in frame.file:
            backward = frame
    ctx = f" (inside {', '.join(context)})" if context else ""
    if op is not None and where is not None:
        return op, f"{where.function} at {lib_where(where)}{ctx}"
    strong = [(m, f) for m, f in native_marks if m in NATIVE_STRONG]
    if strong:
        mark, frame = strong[0]
        if mark == "Work.wait" and any(m == DDP_BACKWARD_OP for m, _ in native_marks):
            mark, frame = next((m, f) for m, f in native_marks if m == DDP_BACKWARD_OP)
        if mark == "Work.wait" and backward is not None and ddp_evidence:
            mark = DDP_BACKWARD_OP
        return mark, f"native frame {frame.function}{ctx}"
    if context:
        first = context[0].split(" ")
        fw, phase = first[0], first[1]
        if fw != "DDP" or phase != "forward":
            return f"{fw.lower()}.{phase}", f"{context[0]} frames{ctx}"
    if backward is not None:
        if native_marks:
            mark, frame = native_marks[0]
            return DDP_BACKWARD_OP, f"{backward.function} with native {mark} frame {frame.function}"
        if ddp_evidence:
            return (
                DDP_BACKWARD_OP,
                f"{backward.function} at {lib_where(backward)}: DDP is in use ({ddp_evidence}), so this is most "
                "likely the Reducer's gradient all-reduce; Python frames alone cannot show it (use --native)",
            )
        return (
            BACKWARD_OP,
            f"{backward.function} at {lib_where(backward)}: inside backward with no communication frame; with DDP "
            "this is the gradient all-reduce, otherwise compute (uncertain: rerun with --native)",
        )
    if native_marks:
        mark, frame = native_marks[0]
        if mark in ("gloo", "nccl"):
            return f"{mark}.wait", f"native frame {frame.function}"
    return None, None


_C_WAIT = re.compile(r"\.wait\(\s*(timeout\s*=\s*[^)]*)?\)")


_COMPILED_OP = re.compile(
    r"torch\.ops\.(?:_c10d_functional|c10d_functional|_c10d_functional_autograd)\.(\w+)"
)
_COMPILED_NAMES: dict[str, str] = {
    "wait_tensor": "wait_tensor",
    "all_reduce": "functional.all_reduce",
    "all_gather_into_tensor": "functional.all_gather_tensor",
    "reduce_scatter_tensor": "functional.reduce_scatter_tensor",
    "all_to_all_single": "functional.all_to_all_single",
    "broadcast": "functional.broadcast",
}
# Frames between generated code and the C++ op it calls (the op dispatcher).
_DISPATCH_FILES = ("torch/_ops.py", "torch/_library/")


def source_frame(frames: list[Frame]) -> Frame | None:
    """The frame whose source line explains a C++ wait below it, or None.

    That is the innermost Python frame when it is the job's own code (``req.wait()``), or
    generated torch.compile code under nothing but the op dispatcher (``torch.ops...``).
    The shell reads that frame's line and hands it to :func:`op_from_source`.
    """
    python = [f for f in frames if not f.native]
    if python and is_user_frame(python[0]):
        return python[0]
    for frame in python:
        if is_generated_frame(frame):
            return frame
        if not any(d in frame.file.replace("\\", "/") for d in _DISPATCH_FILES):
            return None
    return None


def op_from_source(frames: list[Frame], source_line: str | None) -> tuple[str | None, str | None]:
    """Read the C++ wait a rank sits in from the source line of :func:`source_frame`.

    ``Work.wait`` (after isend/irecv or ``async_op=True``) is a C++ method: with Python
    frames alone, the innermost frame is the user's own line. When that line calls
    ``.wait()`` and nothing Python runs below it, the rank waits in C++ - in practice a
    c10d Work. A torch.compile graph calls its functional collectives as
    ``torch.ops._c10d_functional.<op>`` from generated code, which names the op on its line.
    The shell supplies the line (it can read the file); this stays pure.
    """
    inner = source_frame(frames)
    if inner is None or source_line is None:
        return None, None
    text = source_line.strip()
    if is_generated_frame(inner):
        m = _COMPILED_OP.search(text)
        if m is None:
            return None, None
        name = m.group(1)
        op = _COMPILED_NAMES.get(name.rstrip("_"), f"functional.{name.rstrip('_')}")
        return (
            op,
            f"`{text[:80]}` in code generated by torch.compile ({os.path.basename(inner.file)}:{inner.line}): "
            "a functional collective of a compiled graph",
        )
    if not _C_WAIT.search(text) or text.startswith(("os.", "time.")):
        return None, None
    return (
        "Work.wait",
        f"`{text[:80]}` at {short_site(CallSite(file=inner.file, line=inner.line, function=inner.function))} waits in C++ with no Python frame below it: a c10d Work.wait (isend/irecv or async_op=True)",
    )


_PEER_LOCALS: dict[str, tuple[str, str]] = {"send": ("dst", "group_dst"), "recv": ("src", "group_src")}


def _int_repr(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def p2p_peer(frames: list[Frame]) -> int | None:
    """The other end of the blocking send/recv a main thread waits in, from the call's locals.

    ``src``/``dst`` are global ranks; ``group_src``/``group_dst`` are group ranks, taken only
    when the call ran on the default group (``group`` is None), where the two agree. None when
    locals were not captured, the call receives from any source, or it ran on a subgroup.
    """
    for frame in frames:
        if frame.native:
            continue
        if is_user_frame(frame):
            return None
        if not frame.file.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py"):
            continue
        direction = P2P_DIRECTION.get(frame.function)
        if direction is None or not frame.locals:
            continue
        values = {v.name: v.repr for v in frame.locals}
        global_name, group_name = _PEER_LOCALS[direction]
        peer = _int_repr(values.get(global_name))
        if peer is None and values.get("group") in (None, "None"):
            peer = _int_repr(values.get(group_name))
        if peer is not None and peer >= 0:
            return peer
    return None


def annotate(stack: RankStack, ddp_evidence: str | None = None) -> RankStack:
    """A copy of ``stack`` with ``op``, ``op_evidence``, ``peer`` and ``call_site`` filled in.

    An ``op`` the shell already set (from the source line, see :func:`op_from_source`) is
    kept when the frames themselves name no operation; so is a ``peer`` it set.
    """
    thread = main_thread(stack)
    if thread is None:
        return stack
    op, evidence = recognise_op(thread.frames, ddp_evidence)
    if op is None and stack.op is not None:
        op, evidence = stack.op, stack.op_evidence
    peer: int | None = None
    if op in P2P_DIRECTION:
        # from the locals in these frames, else what the shell read from a second dump with locals
        peer = p2p_peer(thread.frames)
        peer = stack.peer if peer is None else peer
    return stack.model_copy(
        update={"op": op, "op_evidence": evidence, "peer": peer, "call_site": find_call_site(thread.frames)}
    )


# -- grouping ------------------------------------------------------------------------------------


def _site_key(site: CallSite | None) -> tuple[str, int, str]:
    return (site.file, site.line or 0, site.function) if site else ("", 0, "")


def _frame_key(frame: Frame) -> tuple[str, str, int]:
    return frame_key(frame.function, frame.file, frame.line)


def group_by_op(stacks: list[RankStack]) -> list[Group]:
    """Ranks sharing (operation, call site); stopped/stuck/zombie ranks grouped by state."""
    buckets: dict[tuple[object, ...], list[RankStack]] = defaultdict(list)
    for s in stacks:
        if s.rank is None:
            continue
        if s.state in STUCK_STATES or (not s.threads and s.state in GONE_STATES):
            buckets[("state", s.state)].append(s)
        elif s.threads:
            buckets[("op", s.op or "", *_site_key(s.call_site))].append(s)
    groups: list[Group] = []
    for key, members in buckets.items():
        first = members[0]
        thread = main_thread(first)
        state: ProcState | None = first.state if key[0] == "state" else None
        groups.append(
            Group(
                ranks=sorted(m.rank for m in members if m.rank is not None),
                op=first.op if state is None else None,
                call_site=first.call_site if state is None else None,
                state=state,
                frames=_strip(thread.frames[:MAX_GROUP_FRAMES]) if thread else [],
            )
        )
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0] if g.ranks else 0))
    return groups


def _strip(frames: list[Frame]) -> list[Frame]:
    """Frames without locals (groups are shared by many ranks; locals are per rank)."""
    return [f.model_copy(update={"locals": None}) if f.locals else f for f in frames]


def group_by_stack(stacks: list[RankStack]) -> list[Group]:
    """Ranks whose whole main-thread stacks are identical, for the collapsed display."""
    buckets: dict[tuple[tuple[str, str, int], ...], list[RankStack]] = defaultdict(list)
    for s in stacks:
        thread = main_thread(s)
        if s.rank is None or thread is None:
            continue
        buckets[tuple(_frame_key(f) for f in thread.frames)].append(s)
    groups: list[Group] = []
    for members in buckets.values():
        first = members[0]
        thread = main_thread(first)
        groups.append(
            Group(
                ranks=sorted(m.rank for m in members if m.rank is not None),
                op=first.op,
                call_site=first.call_site,
                frames=_strip(thread.frames[:MAX_GROUP_FRAMES]) if thread else [],
            )
        )
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0] if g.ranks else 0))
    return groups


# -- verdict -------------------------------------------------------------------------------------


def _describe(group: Group, verb: str = "wait") -> str:
    who = ranks_phrase(group.ranks)
    plural = len(group.ranks) > 1
    if group.op:
        return f"{who} {verb if plural else verb + 's'} in {group.op} at {short_site(group.call_site)}"
    be = "are" if plural else "is"
    inner = blocked_in(group.frames)
    return f"{who} {be} in no collective, at {short_site(group.call_site)}" + (
        f" blocked in {inner}" if inner else ""
    )


_STATE_WORDS: dict[str, str] = {
    "stopped": "stopped (state T: SIGSTOP, Ctrl-Z or a debugger)",
    "tracing_stop": "stopped by a tracer (state t: a debugger is attached)",
    "disk_sleep": "in uninterruptible sleep (state D: stuck in the kernel, often I/O or a driver)",
    "zombie": "a zombie (exited, not yet reaped)",
    "dead": "dead",
}


# -- point-to-point ----------------------------------------------------------------------------


MAX_P2P_LINES = 8
"""Evidence lines about send/recv peers at most: an answer for 256 ranks stays short."""


def _p2p_waits(live: list[RankStack]) -> Waits:
    """rank -> (direction, peer) for every live rank blocked in a send/recv whose peer is known."""
    return {
        s.rank: (P2P_DIRECTION[s.op], s.peer)
        for s in live
        if s.rank is not None and s.op in P2P_DIRECTION and s.peer is not None
    }


def _p2p_lines(waits: Waits, all_stacks: list[RankStack]) -> list[str]:
    """Evidence: for each rank in a send/recv with a known peer, what that peer is doing."""
    by_rank = {s.rank: s for s in all_stacks if s.rank is not None}
    lines: list[str] = []
    for rank, (direction, peer) in sorted(waits.items()):
        other = by_rank.get(peer)
        if other is None:
            doing = "which was not captured"
        elif other.state in STUCK_STATES or other.state in GONE_STATES:
            doing = f"which is {_STATE_WORDS.get(other.state, other.state)}"
        elif peer in waits:
            o_dir, o_peer = waits[peer]
            pair = " (a matching pair)" if is_matched(rank, waits) else ""
            doing = f"which {verb(o_dir)} rank {o_peer}{pair}"
        elif other.op:
            doing = f"which waits in {other.op} at {short_site(other.call_site)}"
        elif other.threads:
            doing = f"which is in no collective, at {short_site(other.call_site)}"
        else:
            doing = "whose stack was not captured"
        lines.append(f"rank {rank} {verb(direction)} rank {peer}, {doing}")
    if len(lines) > MAX_P2P_LINES:
        more = len(lines) - MAX_P2P_LINES + 1
        lines = [
            *lines[: MAX_P2P_LINES - 1],
            f"... {more} more ranks in send/recv (each rank's `peer` in `stacks`)",
        ]
    return lines


def _step(action: str, tool: str | None, section: str) -> NextStep:
    return NextStep(action=action, tool=tool, skill_section=f"{_PLAYBOOK}#{section}")


def _verdict(
    job: Job,
    annotated: list[RankStack],
    groups: list[Group],
    errors: list[RankError],
    missing: list[int],
    exited: list[int],
) -> Verdict:
    stuck = [s for s in annotated if s.state in STUCK_STATES and s.rank is not None]
    live = [s for s in annotated if s.threads and s.rank is not None and s.state not in STUCK_STATES]
    in_coll = [s for s in live if s.op]
    idle = [s for s in live if not s.op]
    op_groups = [g for g in groups if g.state is None and g.op]
    none_groups = [g for g in groups if g.state is None and not g.op]
    evidence: list[str] = []
    for g in groups:
        if g.state is not None:
            evidence.append(f"{ranks_phrase(g.ranks)}: process {_STATE_WORDS.get(g.state, g.state)}")
        else:
            lead = next((s for s in annotated if s.rank == g.ranks[0]), None)
            why = f" [{lead.op_evidence}]" if lead and lead.op_evidence else ""
            evidence.append(_describe(g) + why)
    for e in errors:
        if e.rank is not None:
            who = f"rank {e.rank} (pid {e.pid})"
        else:
            who = f"host {e.host}" if e.host else f"pid {e.pid}"
        evidence.append(f"{who}: capture failed: {e.kind}: {e.message}")
    if missing:
        evidence.append(
            f"{ranks_phrase(missing)} of world size {job.world_size} not found on {', '.join(job.hosts) or 'this host'}"
        )
    if exited:
        evidence.append(f"{ranks_phrase(exited)} exited")
    waits = _p2p_waits(live)
    evidence.extend(_p2p_lines(waits, annotated))
    if any(s.op == BACKWARD_OP for s in live):
        evidence.append(
            "some ranks are inside autograd backward with no communication frame visible; if the model is wrapped "
            "in DDP they wait for the gradient all-reduce (confirm with --native)"
        )

    if not live and not stuck:
        return Verdict(
            kind="inconclusive",
            summary="no rank's stack could be captured"
            + (f" ({len(errors)} capture error(s): {errors[0].kind})" if errors else ""),
            evidence=evidence,
            next_steps=[
                _step(
                    "Fix the capture errors listed in `errors` and run dump_stacks again.",
                    "dump_stacks",
                    "inconclusive",
                ),
                _step(
                    "Check that the job is still alive and which ranks run here.", "list_jobs", "inconclusive"
                ),
                _step("If the job already died, read its logs.", "triage_logs", "inconclusive"),
            ],
        )

    # Stopped / D-state ranks, or ranks in no collective, among peers waiting in one.
    if in_coll and (idle or stuck):
        suspects = sorted(
            {s.rank for s in idle if s.rank is not None} | {s.rank for s in stuck if s.rank is not None}
        )
        parts: list[str] = []
        for g in groups:
            if g.state in STUCK_STATES:
                parts.append(
                    f"{ranks_phrase(g.ranks)} {'are' if len(g.ranks) > 1 else 'is'} {_STATE_WORDS[g.state]}"
                )
        parts.extend(_describe(g) for g in none_groups)
        waiting = "; ".join(_describe(g) for g in op_groups)
        summary = (
            f"{'; '.join(parts)} while {waiting}: "
            f"{ranks_phrase(suspects)} never reached the collective the others wait in"
        )
        steps = []
        if stuck:
            steps.append(
                _step(
                    f"Find out why {ranks_phrase([s.rank for s in stuck if s.rank is not None])} is not running "
                    "(SIGCONT a stopped process, detach a debugger, check the kernel/driver for D state).",
                    None,
                    "stopped-ranks",
                )
            )
        if idle:
            steps.append(
                _step(
                    "Read the suspects' call sites: a rank-dependent branch, an early exit from the loop, an exception "
                    "caught and swallowed, or a blocking wait (queue, lock, I/O) that only some ranks reach.",
                    None,
                    "divergent-ranks",
                )
            )
            steps.append(
                _step(
                    "Dump again with native frames and locals for the suspects to see what they wait on.",
                    "dump_stacks",
                    "divergent-ranks",
                )
            )
        steps.append(
            _step(
                "Reduce it to a minimal repro once the cause is known.", "generate_repro", "divergent-ranks"
            )
        )
        return Verdict(
            kind="divergent_ranks",
            suspect_ranks=suspects,
            summary=summary,
            evidence=evidence,
            next_steps=steps,
        )

    if len(op_groups) > 1:
        sizes = Counter(len(g.ranks) for g in op_groups)
        largest = max(len(g.ranks) for g in op_groups)
        if sizes[largest] == 1:
            majority = next(g for g in op_groups if len(g.ranks) == largest)
            minority = [g for g in op_groups if g is not majority]
            suspects = sorted(r for g in minority for r in g.ranks)
            summary = (
                f"{'; '.join(_describe(g) for g in minority)} while {_describe(majority)}: "
                f"{ranks_phrase(suspects)} {'are' if len(suspects) > 1 else 'is'} in a different collective than the "
                "others (a collective skipped, added or reordered on those ranks)"
            )
        else:
            suspects = sorted(r for g in op_groups for r in g.ranks)
            summary = (
                f"{'; '.join(_describe(g) for g in op_groups)}: the ranks split evenly between different collectives, so "
                "no majority names the culprit; compare the call sites for a rank-dependent branch"
            )
        cycle = find_cycle(waits)
        if cycle is not None:
            summary += f"; {cycle_phrase(cycle, waits)}"
        return Verdict(
            kind="mismatched_collectives",
            suspect_ranks=suspects,
            summary=summary,
            evidence=evidence,
            next_steps=[
                _step(
                    "Open the suspects' call site: look for a collective inside a rank- or data-dependent branch, "
                    "an early `continue`/`break`, or collectives issued in a different order on some ranks.",
                    None,
                    "mismatched-collectives",
                ),
                _step(
                    "On NCCL jobs, confirm with the flight recorder which collective sequence number diverged.",
                    "analyze_flight_recorder",
                    "mismatched-collectives",
                ),
                _step(
                    "Write a minimal repro of the mismatch to verify the fix.",
                    "generate_repro",
                    "mismatched-collectives",
                ),
            ],
        )

    gone = sorted(set(missing) | set(exited))
    if gone:
        here = f"{ranks_phrase(sorted({s.rank for s in live if s.rank is not None}))}"
        what = (
            _describe(op_groups[0])
            if op_groups
            else f"{here} {'are' if len(live) > 1 else 'is'} in no collective"
        )
        exited_part = f"{ranks_phrase(exited)} exited" if exited else ""
        away = sorted(set(missing) - set(exited))
        away_part = f"{ranks_phrase(away)} not found on this host" if away else ""
        summary = f"{what}; {'; '.join(p for p in (exited_part, away_part) if p)}: the missing ranks are the suspects"
        steps = []
        if exited:
            steps.append(
                _step(
                    "Read the logs of the exited ranks for their exception or exit code.",
                    "triage_logs",
                    "missing-ranks",
                )
            )
        if away:
            steps.append(
                _step(
                    "Collect stacks from the other hosts (rankscope stacks --hosts ... / dump_stacks with hosts).",
                    "dump_stacks",
                    "missing-ranks",
                )
            )
        steps.append(_step("Check which jobs and ranks run on this host.", "list_jobs", "missing-ranks"))
        return Verdict(
            kind="missing_ranks", suspect_ranks=gone, summary=summary, evidence=evidence, next_steps=steps
        )

    if len(op_groups) == 1 and not idle:
        g = op_groups[0]
        if g.op in P2P_DIRECTION:
            return _all_in_same_p2p(g, waits, evidence)
        summary = (
            f"all {len(g.ranks)} ranks wait in {g.op} at {short_site(g.call_site)}: the ranks agree, so the hang is "
            "elsewhere (a rank on another host, the network or NCCL transport, or a GPU)"
        )
        return Verdict(
            kind="all_in_same_collective",
            suspect_ranks=[],
            summary=summary,
            evidence=evidence,
            next_steps=[
                _step(
                    "If the job spans hosts, collect the other hosts' ranks too.",
                    "dump_stacks",
                    "all-in-same-collective",
                ),
                _step(
                    "Check the communication environment (NCCL/Gloo variables, interfaces, versions).",
                    "collect_env",
                    "all-in-same-collective",
                ),
                _step(
                    "Read the flight recorder dumps (NCCL) to see which rank did not complete the collective.",
                    "analyze_flight_recorder",
                    "all-in-same-collective",
                ),
                _step(
                    "Search the logs for NCCL/Gloo transport errors and watchdog messages.",
                    "triage_logs",
                    "all-in-same-collective",
                ),
            ],
        )

    if stuck and not live:
        who = ranks_phrase([s.rank for s in stuck if s.rank is not None])
        return Verdict(
            kind="no_collective",
            suspect_ranks=sorted(s.rank for s in stuck if s.rank is not None),
            summary=f"{who} {'are' if len(stuck) > 1 else 'is'} not running "
            f"({', '.join(sorted({_STATE_WORDS[s.state] for s in stuck}))}): the job is stopped, not hung in a collective",
            evidence=evidence,
            next_steps=[
                _step(
                    "Resume the job (SIGCONT, `fg`, detach the debugger) or check the kernel/driver for D state.",
                    None,
                    "stopped-ranks",
                ),
                _step("Dump again once the ranks run.", "dump_stacks", "stopped-ranks"),
            ],
        )
    sites = "; ".join(_describe(g) for g in none_groups) or "no rank is in a collective"
    return Verdict(
        kind="no_collective",
        suspect_ranks=[],
        summary=f"{sites}: no rank waits in a collective, so the job is stuck (or slow) in its own code: "
        "compute, data loading, a lock, a queue or I/O",
        evidence=evidence,
        next_steps=[
            _step(
                "Dump again in a few seconds: if the stacks move, the job is slow, not hung.",
                "dump_stacks",
                "no-collective",
            ),
            _step(
                "Dump with --native and --locals to see what the main thread waits on (DataLoader workers, locks).",
                "dump_stacks",
                "no-collective",
            ),
            _step(
                "Check the memory of the ranks if they may be swapping or near OOM.",
                "inspect_memory",
                "no-collective",
            ),
        ],
    )


def _all_in_same_p2p(g: Group, waits: Waits, evidence: list[str]) -> Verdict:
    """Every rank blocked in the same send (or recv) at the same line.

    Unlike a collective, this is rarely the transport: a blocking recv returns only once
    its peer sends, so when every rank receives, nobody sends, unless the sends were
    posted earlier with isend. The peers (``waits``, read from the calls' locals) turn that
    into a named cycle.
    """
    direction = P2P_DIRECTION[g.op or ""]
    cycle = find_cycle(waits)
    where = f"all {len(g.ranks)} ranks wait in {g.op} at {short_site(g.call_site)}"
    other = "sends" if direction == "recv" else "receives"
    if cycle is not None:
        summary = f"{where}; {cycle_phrase(cycle, waits)}"
    else:
        summary = (
            f"{where}, so no rank {other}: a blocking {direction} returns only when its peer {other[:-1]}s, so "
            f"unless the matching {other[:-1]}s were posted earlier (isend/irecv) this is a send/recv ordering "
            "deadlock in the program; otherwise the transport (network or NCCL) is stuck"
        )
    steps = [
        _step(
            "Order the point-to-point calls so one side of each pair sends while the other receives: alternate "
            "send/recv by rank parity, or post both with batch_isend_irecv (or isend + irecv, then wait on both).",
            None,
            "point-to-point-deadlock",
        )
    ]
    if cycle is None and len(waits) < len(g.ranks):
        steps.append(
            _step(
                "Dump with locals (--locals / locals=True) to read the arguments of the send/recv calls whose "
                "peer could not be read (src/dst, group): a recv from any source or on a subgroup.",
                "dump_stacks",
                "point-to-point-deadlock",
            )
        )
    steps += [
        _step(
            "If the sends were posted earlier with isend, check the transport: the environment and the logs.",
            "collect_env",
            "all-in-same-collective",
        ),
        _step(
            "On NCCL, read the flight recorder: its send/recv entries show which pairs were posted and never matched.",
            "analyze_flight_recorder",
            "point-to-point-deadlock",
        ),
        _step(
            "Verify the diagnosis with a minimal repro of the exchange (generate_repro from this report).",
            "generate_repro",
            "point-to-point-deadlock",
        ),
    ]
    return Verdict(
        kind="all_in_same_collective", suspect_ranks=[], summary=summary, evidence=evidence, next_steps=steps
    )


def analyze(
    job: Job, stacks: list[RankStack], errors: list[RankError], flight: FlightReport | None = None
) -> StacksReport:
    """Annotate every rank's stack, group the ranks and reach a verdict.

    ``job`` and ``stacks`` may be merged from several hosts: any rank of the world that no
    host reported is counted as missing. ``flight`` is the job's flight-recorder analysis when
    dumps were found: on NCCL its sequence numbers outrank the CPU positions.
    """
    ddp = _ddp_in_use(stacks)
    annotated = [annotate(s, ddp) for s in stacks]
    annotated.sort(key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0, s.host, s.pid))

    seen = {r.rank for r in job.ranks if r.rank is not None} | {
        s.rank for s in annotated if s.rank is not None
    }
    exited = set(job.exited_ranks) | {
        s.rank for s in annotated if s.rank is not None and s.state in GONE_STATES
    }
    exited |= {e.rank for e in errors if e.rank is not None and e.kind == "process_exited"}
    if job.world_size:
        missing = set(range(job.world_size)) - seen
        missing |= {r for r in job.missing_ranks if r not in seen or r in exited}
    else:
        missing = set(job.missing_ranks)
    missing |= exited
    job = job.model_copy(update={"missing_ranks": sorted(missing), "exited_ranks": sorted(exited)})

    groups = group_by_op(annotated)
    stack_groups = group_by_stack(annotated)
    verdict = _verdict(job, annotated, groups, errors, sorted(missing), sorted(exited))
    return StacksReport(
        job=job,
        groups=groups,
        stack_groups=stack_groups,
        verdict=verdict,
        stacks=annotated,
        errors=list(errors),
    )


__all__ = [
    "P2P_DIRECTION",
    "analyze",
    "annotate",
    "bound_report",
    "find_call_site",
    "group_by_op",
    "group_by_stack",
    "is_user_frame",
    "main_thread",
    "op_from_source",
    "p2p_peer",
    "rank_ranges",
    "recognise_op",
    "source_frame",
]
