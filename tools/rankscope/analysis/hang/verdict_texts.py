"""The words of the hang verdict: its next steps and its sentences, in tables beside the rules.

A rule (analysis/hang/verdict_rules.py and its kin) decides who is suspect and how sure it is, and
names its sentence and its next steps by key; this module holds what those keys say. A next
step's tool arguments are data here (``args``, and whether the call names the verdict's
suspects), so a step's words can change without changing the call it asks for, and no code
reads a step's words back to find its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rankscope.analysis.recorder.flight import NATIVE_STACK_STEP
from rankscope.models.core import NextStep

PLAYBOOK = "skill/hangs.md"
"""The playbook every step of the verdict points into (``skill/hangs.md#<section>``)."""

MAX_FULL_RANKS = 4
"""Suspects a stacks call names in ``full_ranks`` at most: their stacks in full, the others' bounded."""


@dataclass(frozen=True)
class StepText:
    """One next step: what to do, the tool that does it, the playbook section that explains it.

    ``args`` are the fixed arguments of the tool call; ``full_ranks``: the call names the
    verdict's suspects (their stacks in full), whoever they turn out to be, tie-breaks included.
    ``action`` may hold ``{fields}`` that the rule fills when it names the step.
    """

    action: str
    tool: str | None
    skill_section: str
    args: Mapping[str, Any] = field(default_factory=dict)
    full_ranks: bool = False


def _step(action: str, tool: str | None, section: str, **args: Any) -> StepText:
    """A step that points into the hangs playbook at ``section``."""
    return StepText(action, tool, f"{PLAYBOOK}#{section}", MappingProxyType(args))


def _dump(action: str, section: str, **args: Any) -> StepText:
    """A stacks call aimed at the suspects."""
    return StepText(action, "dump_stacks", f"{PLAYBOOK}#{section}", MappingProxyType(args), full_ranks=True)


RECORDER_HOWTO = (
    "Read the flight recorder: each rank dumps it on the watchdog timeout (default 10 min) to "
    "$TORCH_FR_DUMP_TEMP_FILE<rank> or ~/.cache/torch/comm_lib_trace_rank_<rank>; analyze those files. If the "
    "job opened TORCH_NCCL_DEBUG_INFO_PIPE_FILE, write to <that path><rank>.pipe to get a dump now. For the "
    "next run keep TORCH_FR_BUFFER_SIZE>0 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (the defaults in torch 2.13)."
)
"""Where the recorder's dumps are when the capture did not find this job's own plan for them."""

STEPS: Mapping[str, StepText] = MappingProxyType(
    {
        # nothing captured
        "fix_capture": _dump(
            "Fix the capture errors listed in `errors` and run dump_stacks again.", "inconclusive"
        ),
        "job_alive": _step(
            "Check that the job is still alive and which ranks run here.", "list_jobs", "inconclusive"
        ),
        "logs_if_dead": _step("If the job already died, read its logs.", "triage_logs", "inconclusive"),
        # the collective state: recorder, counters, logs, RAS
        "recorder_of_job": _step("{recorder}", "analyze_flight_recorder", "nccl-hangs"),
        "recorder_howto": _step(RECORDER_HOWTO, "analyze_flight_recorder", "nccl-hangs"),
        "dump_locals_counters": _dump(
            "Dump again with locals: progress counters (step, epoch) that differ between ranks name the laggard.",
            "progress-counters",
            locals=True,
        ),
        "logs_watchdog_seq": _step(
            "Read the logs for the watchdog's last enqueued/completed sequence numbers per rank.",
            "triage_logs",
            "nccl-hangs",
        ),
        "ask_ras": _step(
            "Ask NCCL RAS (NCCL >= 2.24) for each rank's launch counts: the rank behind is the one that never "
            "enqueued the collective. Off by default: querying RAS has crashed jobs on NCCL 2.26-2.29.",
            "dump_stacks",
            "nccl-hangs",
            ras=True,
        ),
        # RAS
        "recorder_enqueued_none_completed": _step(
            "Read the flight recorder: the collective every rank enqueued and none completed, and its group.",
            "analyze_flight_recorder",
            "nccl-hangs",
        ),
        "env_nccl": _step("Collect NCCL and network settings of every rank.", "collect_env", "nccl-hangs"),
        "logs_nccl_warn": _step(
            "Read the logs for NCCL WARN lines, Xid errors and watchdog timeouts.",
            "triage_logs",
            "nccl-hangs",
        ),
        "dump_native_locals_launch": _dump(
            "Dump the suspects' stacks with native frames and locals: what they do instead of launching.",
            "nccl-hangs",
            native=True,
            locals=True,
        ),
        "recorder_never_enqueued": _step(
            "Confirm with the flight recorder which collective the suspects never enqueued.",
            "analyze_flight_recorder",
            "nccl-hangs",
        ),
        # progress counters
        "read_counter_loop": _step(
            "Read the loop at the counter's frame: what lets the suspects run more (or fewer) iterations "
            "(uneven data shards, a rank-dependent `continue`/`break`, a caught exception).",
            None,
            "progress-counters",
        ),
        "dump_native_counters": _dump(
            "Dump again with native frames for the suspects.", "progress-counters", native=True
        ),
        "repro_divergent": _step(
            "Reduce it to a minimal repro once the cause is known.",
            "generate_repro",
            "divergent-ranks",
            from_last_stacks=True,
        ),
        # NCCL: a rank elsewhere, an idle GPU, a lone collective
        "read_suspects_stack": _step(
            "Read the suspects' stack: a DataLoader worker, a lock, I/O, a checkpoint save or an evaluation loop "
            "that only they run.",
            None,
            "nccl-hangs",
        ),
        "confirm_native": _dump(
            "Confirm with native frames (GPU waits vs compute).", "nccl-hangs", native=True
        ),
        "recorder_laggard": _step(
            "Read the flight recorder dumps: the laggard's last enqueued collective is below the others'.",
            "analyze_flight_recorder",
            "nccl-hangs",
        ),
        "dump_native_not_launching": _dump(
            "Dump the suspects with native frames: what their CPU does instead of launching the collective.",
            "nccl-hangs",
            native=True,
        ),
        "recorder_suspects_below": _step(
            "Read the flight recorder dumps: the suspects' last enqueued collective is below the others'.",
            "analyze_flight_recorder",
            "nccl-hangs",
        ),
        "read_lone_site": _step(
            "Read the suspects' call site: a {op} under a rank- or data-dependent branch (evaluation, logging, "
            "checkpointing) that the other ranks skip. Call it on every rank, or not at all.",
            None,
            "mismatched-collectives",
        ),
        "recorder_lone": _step(
            "Confirm with the flight recorder: the suspects' last entry is that collective, the others' is "
            "another one at the same sequence number.",
            "analyze_flight_recorder",
            "nccl-hangs",
        ),
        # divergent ranks
        "resume_stuck": _step(
            "Find out why {who} is not running "
            "(SIGCONT a stopped process, detach a debugger, check the kernel/driver for D state).",
            None,
            "stopped-ranks",
        ),
        "read_divergent_sites": _step(
            "Read the suspects' call sites: a rank-dependent branch, an early exit from the loop, an exception "
            "caught and swallowed, or a blocking wait (queue, lock, I/O) that only some ranks reach.",
            None,
            "divergent-ranks",
        ),
        "dump_native_locals_divergent": _dump(
            "Dump again with native frames and locals for the suspects to see what they wait on.",
            "divergent-ranks",
            native=True,
            locals=True,
        ),
        # mismatched collectives, a subgroup left waiting
        "open_mismatch_site": _step(
            "Open the suspects' call site: look for a collective inside a rank- or data-dependent branch, "
            "an early `continue`/`break`, or collectives issued in a different order on some ranks.",
            None,
            "mismatched-collectives",
        ),
        "fix_rank_guard": _step(
            "Fix: every rank must reach the {op} at {site}: move it out of the branch at {guard_at} (keep only the "
            "rank's own work inside), or call it on no rank.",
            None,
            "mismatched-collectives",
        ),
        "fix_uneven_loop": _step(
            "Fix: give every rank the same number of batches for the loop at {loop_at} (filter records before "
            "sharding, pad or trim each shard to one length as DistributedSampler(drop_last=True) does, or DDP's "
            "join() for uneven inputs), or make every rank take the same `continue`/`break`/`return`.",
            None,
            "mismatched-collectives",
        ),
        "fix_loop_exit": _step(
            "Fix: {remedy} (the branch at {guard_at}), or skip only the work that is not a collective.",
            None,
            "mismatched-collectives",
        ),
        "fix_library_call": _step(
            "Fix: call {call} ({site}) on every rank of its group, not only on {who}{under}: it is a collective; "
            "keep only the rank's own work (the file write) on {who}.",
            None,
            "mismatched-collectives",
        ),
        "fix_data_guard": _step(
            "Fix: make every rank take the same branch at {guard_at} (all_reduce the flag first), or call the {op} at "
            "{site} outside it.",
            None,
            "mismatched-collectives",
        ),
        "recorder_mismatch_seq": _step(
            "On NCCL jobs, confirm with the flight recorder which collective sequence number diverged.",
            "analyze_flight_recorder",
            "mismatched-collectives",
        ),
        "repro_mismatch": _step(
            "Verify the fix on a minimal repro of the mismatch.",
            "generate_repro",
            "mismatched-collectives",
            from_last_stacks=True,
        ),
        "open_group_loop": _step(
            "Open {who}'s loop around the group's collective: a rank- or data-dependent "
            "branch, an early `continue`/`break`, that skips it on that rank.",
            None,
            "mismatched-collectives",
        ),
        "find_group_members": _step(
            "Find the members of the waiting ranks' group where it is built (new_group / DeviceMesh), then "
            "which of them skipped the collective: a rank- or data-dependent branch around it.",
            None,
            "mismatched-collectives",
        ),
        "recorder_group_members": _step(
            "Read the flight recorder: its entries name each collective's process group and members.",
            "analyze_flight_recorder",
            "mismatched-collectives",
        ),
        "repro_skipped": _step(
            "Write a minimal repro of the skipped collective.",
            "generate_repro",
            "mismatched-collectives",
            from_last_stacks=True,
        ),
        # missing ranks
        "collect_other_hosts": _dump(
            "Collect stacks from the other hosts (rankscope stacks --hosts ... / dump_stacks with hosts).",
            "missing-ranks",
        ),
        "logs_exited": _step(
            "Read the logs of the exited ranks for their exception or exit code.",
            "triage_logs",
            "missing-ranks",
        ),
        "jobs_here": _step("Check which jobs and ranks run on this host.", "list_jobs", "missing-ranks"),
        # all in the same collective
        "other_hosts_too": _dump(
            "If the job spans hosts, collect the other hosts' ranks too.", "all-in-same-collective"
        ),
        "env_comm": _step(
            "Check the communication environment (the backend's variables, interfaces, versions).",
            "collect_env",
            "all-in-same-collective",
        ),
        "recorder_not_completed": _step(
            "Read the flight recorder dumps (NCCL) to see which rank did not complete the collective.",
            "analyze_flight_recorder",
            "all-in-same-collective",
        ),
        "logs_transport": _step(
            "Search the logs for transport errors and watchdog messages.",
            "triage_logs",
            "all-in-same-collective",
        ),
        # send/recv
        "order_p2p": _step(
            "Order the point-to-point calls so one side of each pair sends while the other receives: alternate "
            "send/recv by rank parity, or post both with batch_isend_irecv (or isend + irecv, then wait on both).",
            None,
            "point-to-point-deadlock",
        ),
        "dump_locals_p2p": _dump(
            "Dump with locals (--locals / locals=True) to read the arguments of the send/recv calls whose "
            "peer could not be read (src/dst, group): a recv from any source or on a subgroup.",
            "point-to-point-deadlock",
            locals=True,
        ),
        "env_if_isend": _step(
            "If the sends were posted earlier with isend, check the transport: the environment and the logs.",
            "collect_env",
            "all-in-same-collective",
        ),
        "recorder_p2p": _step(
            "On NCCL, read the flight recorder: its send/recv entries show which pairs were posted and never "
            "matched.",
            "analyze_flight_recorder",
            "point-to-point-deadlock",
        ),
        "repro_p2p": _step(
            "Verify the diagnosis with a minimal repro of the exchange (generate_repro from this report).",
            "generate_repro",
            "point-to-point-deadlock",
            from_last_stacks=True,
        ),
        # stopped ranks
        "resume": _step(
            "Resume the job (SIGCONT, `fg`, detach the debugger) or check the kernel/driver for D state.",
            None,
            "stopped-ranks",
        ),
        "dump_when_running": _dump("Dump again once the ranks run.", "stopped-ranks"),
        # no collective
        "dump_again_soon": _dump(
            "Dump again in a few seconds: if the stacks move, the job is slow, not hung.", "no-collective"
        ),
        "dump_native_main": _dump(
            "Dump with --native and --locals to see what the main thread waits on (DataLoader workers, locks, "
            "the GPU).",
            "no-collective",
            native=True,
            locals=True,
        ),
        "inspect_memory": _step(
            "Check the memory of the ranks if they may be swapping or near OOM.",
            "inspect_memory",
            "no-collective",
        ),
    }
)
"""Every next step of the hang verdict, by the key a rule names it with."""


STATE_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "stopped": "stopped (state T: SIGSTOP, Ctrl-Z or a debugger)",
        "tracing_stop": "stopped by a tracer (state t: a debugger is attached)",
        "disk_sleep": "in uninterruptible sleep (state D: stuck in the kernel, often I/O or a driver)",
        "zombie": "a zombie (exited, not yet reaped)",
        "dead": "dead",
    }
)
"""What a process state means, as the verdict says it."""

RAN_OUT_EARLY = "issued fewer collectives there earlier"
"""The words of a parting for a suspect past the others' block (``past_the_block``); the repro
chooser (analysis/templates.py) reads a verdict for them."""

SAY: Mapping[str, str] = MappingProxyType(
    {
        # nothing captured
        "nothing_captured": "no rank's stack could be captured",
        "capture_errors": " ({n} capture error(s): {kind})",
        # the recorder and RAS decide
        "recorder_decides": "flight recorder: {summary}; the CPU stacks show only where each rank waits for the GPU",
        "recorder_line": "flight recorder: {line}",
        "ras_agree": "{summary}; look at the network, NCCL and the GPUs, not at the ranks' code",
        "ras_decides": "{summary}; the CPU stacks show only where each rank waits for the GPU",
        # progress counters, and the ties they break
        "counters": "{split}: {who} left the common path (a skipped or extra step, an uneven number of batches, "
        "or a rank-dependent branch){gpu_note}",
        "counters_gpu_note": "; the ranks that wait for the GPU are queued behind the collective the suspects never "
        "issued",
        "counters_decide": "{summary}; the progress counters decide: {split}",
        "counters_lead": "{summary}; the only lead, weak: {split}",
        # NCCL: a rank elsewhere, an idle GPU, a lone collective, the CPU side cannot tell
        "rank_elsewhere": "{parts} while {waiting}: on NCCL the waiting ranks are queued behind a collective that "
        "{who} never issued; the suspects' own stack shows what they do instead",
        "gpu_idle": "{text}: on NCCL the spinning GPUs wait in a collective that {who} never launched",
        "lone": "{who} {are} inside {op} at {sites}, which no other rank is in, while {others}: on NCCL the others "
        "ran on past their last collective and are queued behind one that {who} never issued; {who} issued a "
        "collective the others did not{story}",
        "cannot_tell": "{where}: on NCCL a rank that waits for the GPU is queued behind a stuck collective, so where "
        "the CPUs stop says nothing about which rank is stuck; the CPU side cannot tell, the collective state can",
        "nccl_same_line": "all {n} ranks stand in {op} at {site}: on NCCL that does not show they are in the same "
        "collective (a rank that issued fewer collectives earlier reaches the same line behind the others), so "
        "the CPU side cannot tell; the collective state can",
        # divergent ranks
        "divergent": "{parts} while {waiting}: {who} never reached the collective the others wait in",
        "cpu_not_where_stuck": " ({groups}: their CPU position is not where they are stuck)",
        "backend_unknown_in_c": "; the backend is not known and {who} {are} in C code called from the job's own "
        "line: if this job runs NCCL that may be a wait for the GPU instead (backend=nccl, native frames or the "
        "line itself decide)",
        # mismatched collectives, a subgroup left waiting
        "mismatched": "{minority} while {majority}: {who} {are} in a different collective than the others (a "
        "collective skipped, added or reordered on those ranks)",
        "library_call": "{who} alone called {call} ({site}: `{line}`), a collective every rank of its group must "
        "call: {how}, while {others}",
        "inside_call": "{who} {be} inside {call} ({site}: `{line}`), a collective every rank of its group must "
        "call: {how}",
        "cpu_not_where_stuck_call": " (on NCCL the call's collective is enqueued and the CPU stops at the next GPU "
        "wait: the others are not stuck where their CPU is)",
        "mismatched_because": "{minority} while {majority}: {who} {are} in a different collective than the others",
        "even_split_ruled": "{described}: the ranks split evenly, but {phrase}: {who} {run} a collective under a "
        "rank condition that the others never call (call it on every rank, or guard only the work that is not a "
        "collective)",
        "even_split_loop": "{described}: the ranks split evenly, but {phrase}",
        "even_split": "{described}: the ranks split evenly between different collectives, so no majority names the "
        "culprit; compare the call sites for a rank-dependent branch",
        "subgroup_where": "{minority} on a subgroup while {majority}: a subgroup collective completes only when "
        "every member of that group calls it",
        "subgroup_named": "{where}; {culprits}, of {who}'s group, {has} gone on to {next} with the others: {they} "
        "skipped the group's collective (or {who} called one its group does not)",
        "the_next_collective": "the next collective",
        "subgroup_recorder": "{where}; flight recorder: {summary}",
        "subgroup_unnamed": "{where}, so {who} {are} left waiting by a member of its group that went on with "
        "{others} (or {who} called a collective its group does not): the stacks do not show the group's "
        "members, so they name no culprit",
        # where a suspect's stack leaves the others'
        "part_below": "{who} and {they} part below {where} line {line}",
        "parting": "{who} {leaves} {they} in {where}: at line {line}, they at line {their_line}",
        "left_the_loop": "{who} {has} left the loop at {loop_at} `{header}` that {they} {are} still in{count}, so "
        "it {ran_out_early}: {why}",
        "skipped_in_body": "{who} {be} at a later collective of the same body of the loop at {loop_at} `{header}` "
        "than {they}{count}: {who} issued fewer collectives earlier in that body; {why}",
        "left_uneven": "fewer batches than the others (uneven inputs), or a `continue`, `break` or `return` only it "
        "took",
        "left_by_exit": "`{cond}` ({guard_at}) sends some ranks to the `{statement}` at {exit_at}",
        "still_in_the_loop": "{who} {be} still in the loop at {loop_at} `{header}` that {they} {have} left{count}: it "
        "runs more iterations than they do: more batches than the others (uneven inputs), or a `continue`, "
        "`break` or `return` only they took",
        "past_the_block": " (later in the same function: {who} got past the block the others are still in, so it "
        "most likely {ran_out_early}: a skipped batch, an early continue or return; read that block, not only "
        "where it waits)",
        # missing ranks
        "in_no_collective": "{who} {are} in no collective",
        "exited": "{who} exited",
        "not_found_loopback": "{who} not found, though MASTER_ADDR {addr} is this host's loopback so every rank "
        "runs here: never started or already gone",
        "not_found_merged": "{who} not found on any of {hosts} hosts",
        "not_found_here": "{who} not found on this host (not visible from here)",
        "missing_suspect": "{what}; {parts}: {who} is the suspect",
        "missing_suspects": "{what}; {parts}: {who} are the suspects",
        "missing_elsewhere": "{what}; {parts}: a rank on another host cannot be blamed from here; collect the "
        "other hosts' stacks",
        # every rank in the same collective, or send/recv
        "all_in_same": "all {n} ranks wait in {op} at {site}: the ranks agree, so the hang is elsewhere (a rank on "
        "another host, {transport}{or_gpu})",
        "or_a_gpu": ", or a GPU",
        "p2p_where": "all {n} ranks wait in {op} at {site}",
        "p2p_unmatched": "{where}, so no rank {others}: a blocking {direction} returns only when its peer {other}s, "
        "so unless the matching {other}s were posted earlier (isend/irecv) this is a send/recv ordering deadlock "
        "in the program; otherwise {transport} is stuck",
        # stopped ranks, no collective
        "stopped": "{who} {are} not running ({states}): the job is stopped, not hung in a collective",
        "no_collective": "{sites}: no rank waits in a collective, so the job is stuck (or slow) in its own code: "
        "compute, data loading, a lock, a queue or I/O{hint}",
        "no_rank_in_collective": "no rank is in a collective",
        "native_hint": " (on an NCCL job, dump with --native: a CPU waiting for the GPU looks like this)",
    }
)
"""The sentences of the hang verdict, by key; a rule fills their ``{fields}`` with what it found."""


def say(key: str, **fields: object) -> str:
    """``say("exited", who="rank 3")``: a sentence of :data:`SAY` with its fields filled."""
    return SAY[key].format(**fields)


@dataclass(frozen=True)
class Step:
    """A row of :data:`STEPS` as a rule names it, with the values of its ``{fields}``."""

    key: str
    fields: Mapping[str, str] = field(default_factory=dict)


def step(key: str, **fields: str) -> Step:
    """``step("read_lone_site", op="barrier")``: a rule's next step, its words left to :data:`STEPS`."""
    if key not in STEPS:
        raise KeyError(f"no next step {key!r} in verdict_texts.STEPS")
    return Step(key, fields)


def next_steps(steps: Sequence[Step | NextStep], suspects: Sequence[int]) -> list[NextStep]:
    """The steps in words, each call with its arguments: the table's, and the suspects for the
    calls that name them. A :class:`NextStep` is one passed on from the flight recorder's answer."""
    return [_passed_on(s, suspects) if isinstance(s, NextStep) else _said(s, suspects) for s in steps]


def _said(ref: Step, suspects: Sequence[int]) -> NextStep:
    text = STEPS[ref.key]
    args = dict(text.args)
    if text.full_ranks and suspects:
        args["full_ranks"] = list(suspects[:MAX_FULL_RANKS])
    return NextStep(
        action=text.action.format(**ref.fields),
        tool=text.tool,
        skill_section=text.skill_section,
        args=args or None,
    )


def _passed_on(passed: NextStep, suspects: Sequence[int]) -> NextStep:
    """A recorder step as the verdict offers it: the recorder's own answer gives its calls no
    arguments, the verdict names its suspects (and native frames where the step reads them)."""
    if passed.args is not None:
        return passed
    args: dict[str, Any] = {}
    if passed.tool == "generate_repro":
        args = {"from_last_stacks": True}  # a repro of the stacks this very answer came from
    elif passed.tool == "dump_stacks":
        args = {"native": True} if passed == NATIVE_STACK_STEP else {}
        if suspects:
            args["full_ranks"] = list(suspects[:MAX_FULL_RANKS])
    return passed.model_copy(update={"args": args}) if args else passed


__all__ = [
    "MAX_FULL_RANKS",
    "PLAYBOOK",
    "RAN_OUT_EARLY",
    "RECORDER_HOWTO",
    "SAY",
    "STATE_WORDS",
    "STEPS",
    "Step",
    "StepText",
    "next_steps",
    "say",
    "step",
]
