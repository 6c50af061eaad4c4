"""Pure hang analysis: which operation each rank waits in, who diverged, what next.

Input is what the shell captured (the job, per-rank stacks, per-rank errors), possibly
merged from several hosts; output is a :class:`StacksReport` whose ``verdict`` is a
stable JSON contract. No I/O here: this module is tested against captured py-spy output.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping

from rankscope.analysis.code_origin import frame_origin
from rankscope.analysis.hang.backend import job_backend
from rankscope.analysis.hang.collectives import (
    BACKWARD_FRAMES,
    NATIVE_STRONG,
    classify_native_frame,
    classify_python_frame,
    frame_key,
)
from rankscope.analysis.hang.counters import int_locals, on_subgroup
from rankscope.analysis.hang.frames import (
    GONE_STATES,
    STUCK_STATES,
    find_call_site,
    is_generated_frame,
    is_user_frame,
    lib_where,
    main_thread,
    short_site,
)
from rankscope.analysis.hang.group_members import read_group_locals
from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS, progress_verdict
from rankscope.analysis.hang.progress_verdict import evidence as progress_evidence
from rankscope.analysis.hang.verdict import BACKWARD_OP, decide, with_evidence
from rankscope.analysis.hang.verdict_facts import sort_ranks
from rankscope.analysis.hang.waits import GPU_LIKE, classify_wait
from rankscope.analysis.p2p import P2P_DIRECTION
from rankscope.analysis.ranges import rank_ranges
from rankscope.analysis.sizing.bound import bound_report
from rankscope.models.core import (
    Backend,
    CallSite,
    Frame,
    Group,
    Job,
    ProcState,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
)
from rankscope.models.flight import FlightReport
from rankscope.models.progress import Progress
from rankscope.models.ras import RasFinding

MAX_GROUP_FRAMES = 60
"""Representative frames kept per group (innermost first)."""


DDP_BACKWARD_OP = "ddp.gradient_all_reduce"
"""A rank inside backward with no communication frame seen: with DDP, the gradient
all-reduce waits in C++ at the end of backward, invisible to Python frames (BACKWARD_OP,
from the verdict, when DDP is not known to be in use)."""


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
        if backward is None and frame.function in BACKWARD_FRAMES and frame_origin(frame) == "torch":
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


_DEFAULT_GROUP = re.compile(
    r"\bgroup\s*=\s*(?:None\b|(?:\w+\.)*group\.WORLD\b|(?:\w+\.)*_get_default_group\(\))"
)
"""A call's line that passes the default group by name (``group=dist.group.WORLD``): no subgroup."""

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


def annotate(
    stack: RankStack,
    ddp_evidence: str | None = None,
    *,
    backend: Backend | None = None,
    source: Mapping[tuple[str, int], str] | None = None,
    world: int | None = None,
) -> RankStack:
    """A copy of ``stack`` with ``op``, ``peer``, ``call_site``, ``wait``, ``counters`` and what its
    locals say of its process groups filled in.

    An ``op`` the shell already set (from the source line, see :func:`op_from_source`) is
    kept when the frames themselves name no operation; so is a ``peer`` it set, and
    ``counters`` it read from a locals pass. ``source`` maps (file, line) to the text of that
    line, for the GPU waits a user line shows (``loss.item()``) without native frames.
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
    site = find_call_site(thread.frames)
    line = _innermost_user_line(thread.frames, site, source)
    wait, wait_evidence = classify_wait(
        thread.frames,
        op,
        backend=stack.backend or backend,
        has_native=any(f.native for f in thread.frames),
        user_line=line,
        user_site=short_site(site) if site is not None else None,
    )
    counters = stack.counters or int_locals(thread.frames)
    subgroup = stack.subgroup if stack.subgroup is not None else on_subgroup(thread.frames)
    if (
        subgroup
        and site is not None
        and _DEFAULT_GROUP.search((source or {}).get((site.file, site.line or 0), ""))
    ):
        subgroup = False  # the job's line passes the default group itself: every rank's group
    groups = stack.group_locals or read_group_locals(thread.frames, stack.rank, world)
    return stack.model_copy(
        update={
            "op": op,
            "op_evidence": evidence,
            "peer": peer,
            "call_site": site,
            "wait": wait,
            "wait_evidence": wait_evidence,
            "counters": counters,
            "subgroup": subgroup,
            "group_locals": groups,
        }
    )


def _innermost_user_line(
    frames: list[Frame], site: CallSite | None, source: Mapping[tuple[str, int], str] | None
) -> str | None:
    """The source text of the user's line when nothing Python runs below it (else None).

    Only then can the line itself be where the CPU waits (``loss.item()``); with library
    frames below it, the CPU is in those frames.
    """
    python = [f for f in frames if not f.native]
    if source is None or site is None or not site.line or not python:
        return None
    if (python[0].file, python[0].line) != (site.file, site.line):
        return None
    return source.get((site.file, site.line))


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
            gpu = s.wait if s.wait in GPU_LIKE else ""
            buckets[("op", s.op or "", gpu, *_site_key(s.call_site))].append(s)
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
                wait=first.wait if state is None else None,
                frames=_strip(thread.frames[:MAX_GROUP_FRAMES]) if thread else [],
            )
        )
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0] if g.ranks else 0))
    return groups


def _strip(frames: list[Frame]) -> list[Frame]:
    """Frames without locals (groups are shared by many ranks; locals are per rank)."""
    return [f.model_copy(update={"locals": None}) if f.locals else f for f in frames]


def _stack_key(frame: Frame) -> tuple[str, str, int]:
    """A frame's identity for whole-stack groups: the user's frames by line, library frames by
    function only, so two ranks stopped on different lines inside one torch function (all_reduce
    at distributed_c10d.py:3230 and :3252) are one group, as they are one collective."""
    key = _frame_key(frame)
    return key if is_user_frame(frame) else (key[0], key[1], 0)


def group_by_stack(stacks: list[RankStack]) -> list[Group]:
    """Ranks whose main-thread stacks are the same in the job's own frames, for the collapsed display."""
    buckets: dict[tuple[tuple[str, str, int], ...], list[RankStack]] = defaultdict(list)
    for s in stacks:
        thread = main_thread(s)
        if s.rank is None or thread is None:
            continue
        buckets[tuple(_stack_key(f) for f in thread.frames)].append(s)
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


def one_state(ranks: list[RankProcess], stacks: list[RankStack]) -> list[RankProcess]:
    """``job.ranks`` with each rank's state as read at dump time, the state its stack reports.

    Discovery reads a state too, earlier; one answer saying a rank is ``running`` in ``job.ranks``
    and ``sleeping`` in ``stacks`` makes a reader wonder which to trust, so the later one wins.
    """
    seen = {s.pid: s.state for s in stacks if s.state != "unknown"}
    return [
        r.model_copy(update={"state": seen[r.pid]}) if seen.get(r.pid, r.state) != r.state else r
        for r in ranks
    ]


def analyze(
    job: Job,
    stacks: list[RankStack],
    errors: list[RankError],
    flight: FlightReport | None = None,
    *,
    source: Mapping[tuple[str, int], str] | None = None,
    ras: RasFinding | None = None,
    progress: Progress | None = None,
) -> StacksReport:
    """Annotate every rank's stack, group the ranks and reach a verdict.

    ``job`` and ``stacks`` may be merged from several hosts: any rank of the world that no
    host reported is counted as missing. ``flight`` is the job's flight-recorder analysis when
    dumps were found: on NCCL its sequence numbers outrank the CPU positions. ``source`` holds
    the text of the ranks' innermost user lines, read by the shell. ``ras`` is what NCCL RAS's
    launch counts said, when it was asked (``--ras``). ``progress`` is what the window of looks
    saw (live captures): a job that moved gets its verdict from it and no hang rule runs.
    """
    ddp = _ddp_in_use(stacks)
    backend = job_backend(job, stacks)
    annotated = [annotate(s, ddp, backend=backend, source=source, world=job.world_size) for s in stacks]
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
    job = job.model_copy(
        update={
            "missing_ranks": sorted(missing),
            "exited_ranks": sorted(exited),
            "ranks": one_state(job.ranks, annotated),
        }
    )
    if backend is not None and job.backend is None:
        job = job.model_copy(update={"backend": backend})

    groups = group_by_op(annotated)
    stack_groups = group_by_stack(annotated)
    verdict = progress_verdict(progress, annotated) or decide(
        with_evidence(
            sort_ranks(
                job,
                annotated,
                groups,
                errors,
                sorted(missing),
                sorted(exited),
                backend=backend,
                flight=flight,
                source=source,
                ras=ras,
            )
        )
    )
    if progress is not None and verdict.kind not in PROGRESS_KINDS and progress.motion != "unknown":
        # nothing moved: the window's one line says so; the ranks' motions are in ``progress``
        verdict = verdict.model_copy(
            update={"evidence": [*progress_evidence(progress)[:1], *verdict.evidence]}
        )
    return StacksReport(
        job=job,
        progress=progress,
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
