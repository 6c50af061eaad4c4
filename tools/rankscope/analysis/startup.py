"""The verdict on a job that never started: which nodes and ranks joined, which are missing, and why.

Each host hands over what it reads of the job (:class:`~rankscope.models.startup.StartupFacts`:
its launchers' effective settings, who listens at the store's port, where it resolves the master's
name); the ranks' stacks say which of them wait before their first collective. The verdict compares
the launchers across hosts and names, in this order, what decides: a setting one node was given
differently (the store's address or port, its name's resolution, the rendezvous id or backend,
``--nnodes``, ``--nproc_per_node``, the world size), the store's port held by a process of no rank
or launcher of the job, a node of the call that runs no launcher, ranks of the world that never
started; else only who waits, for whom. Each with its fix, at the confidence the evidence holds: a
setting read on both sides is sure, a node or rank not visible from a one-host call is not.
Pure: facts in, a verdict out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rankscope.analysis.launcher_args import max_nodes, store_address
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Confidence, Frame, Job, NextStep, RankStack, Verdict
from rankscope.models.startup import (
    Difference,
    InitWait,
    LauncherFacts,
    Listener,
    StartupFacts,
    StartupFinding,
    StartupState,
)

PLAYBOOK = "skill/multi-node.md#a-job-that-never-started"

RENDEZVOUS: StartupState = "starting: rendezvous"
INIT: StartupState = "starting: init"
"""How a job in start-up says its state: the first words of one of its notes (discovery writes it,
``ps``, ``stacks`` and the MCP tools show it)."""


def job_state(job: Job) -> StartupState | None:
    """The start-up state a job's own notes give it (as discovery found it on one host), or None."""
    for note in job.notes:
        for state in (RENDEZVOUS, INIT):
            if note.startswith(f"{state}:"):
                return state
    return None


COMPARED = (
    "master_addr",
    "master_port",
    "rdzv_endpoint",
    "rdzv_backend",
    "rdzv_id",
    "nnodes",
    "nproc_per_node",
    "world_size",
)
"""The settings compared across launchers, the most decisive first (the store's address before the
sizes it derives from)."""

STORE_SETTINGS = frozenset({"master_addr", "master_port", "rdzv_endpoint"})

FLAGS = {name: f"--{name}" for name in COMPARED}
ENV_FLAGS = {"master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT", "world_size": "WORLD_SIZE"}
"""How a setting is spelled where it was given: torchrun's option, or a rank's environment."""

WHY = {
    "master_addr": "it looks for the store at another address than the others",
    "master_port": "it looks for the store at another port than the others",
    "rdzv_endpoint": "it looks for the rendezvous at another endpoint than the others",
    "rdzv_backend": "the launchers use different rendezvous backends, which never meet",
    "rdzv_id": "a rendezvous admits only launchers of the same id, so each waits for nodes of its own id",
    "nnodes": "the launchers wait for different numbers of nodes",
    "nproc_per_node": "the launchers start different numbers of ranks, so the world sizes differ",
    "world_size": "the ranks wait for worlds of different sizes",
}

INIT_CALLS = (
    "init_device_mesh",
    "init_process_group",
    "_store_based_barrier",
    "_create_c10d_store",
    "_env_rendezvous_handler",
    "_tcp_rendezvous_handler",
    "rendezvous",
    "next_rendezvous",
    "new_group",
)
"""Python functions of torch a rank waits in before its first collective (outermost first: the
first found names the wait)."""

_STORE_NATIVE = ("c10d::TCPStore", "c10d::detail::TCPClient", "c10d::Store::")

STORE_SERVER_WAIT = "the store waiting for the world's ranks to connect (TCPStore::waitForWorkers)"
NCCL_ID_WAIT = "NCCL communicator creation, waiting for rank 0's id in the store (broadcastUniqueNCCLID)"
_NATIVE_DETAIL = (
    ("TCPStore::waitForWorkers", STORE_SERVER_WAIT),
    ("broadcastUniqueNCCLID", NCCL_ID_WAIT),
    ("ncclCommInitRank", "NCCL communicator creation (ncclCommInitRank)"),
)
"""Native frames that say what a start-up wait waits for (real NCCL ranks' stacks: the store's
server of rank 0 blocks in its constructor until WORLD_SIZE ranks connected; the others, past
init_process_group, create their communicator at the first collective, or at init with
``device_id``, and wait in the store for the id rank 0 publishes only after its own init)."""


def _native_detail(frames: Sequence[Frame]) -> str | None:
    for frame in frames[:16]:
        if frame.native:
            for needle, detail in _NATIVE_DETAIL:
                if needle in frame.function:
                    return detail
    return None


def init_wait(stack: RankStack) -> str | None:
    """The start-up call ``stack``'s main thread waits in (``init_process_group``, a TCPStore
    connect or wait, the rendezvous, an NCCL communicator's creation at the first collective),
    with what it waits for when native frames say it; None when it is past them."""
    main = next((t for t in stack.threads if t.is_main), stack.threads[0] if stack.threads else None)
    if main is None:
        return None
    detail = _native_detail(main.frames)
    names = {f.function for f in main.frames if not f.native}
    for call in INIT_CALLS:
        if call in names:
            return f"{call}: {detail}" if detail else call
    if detail is not None:
        return detail
    if any(f.native and any(n in f.function for n in _STORE_NATIVE) for f in main.frames[:12]):
        return "TCPStore"
    return None


def init_waits(stacks: Sequence[RankStack]) -> list[InitWait]:
    """Every rank that waits before its first collective, and where."""
    out = []
    for s in stacks:
        where = init_wait(s)
        if where is not None and s.rank is not None:
            out.append(InitWait(rank=s.rank, host=s.host, where=where))
    return out


@dataclass(frozen=True)
class _Seen:
    """What the facts of every host say, read once."""

    job: Job
    hosts: list[str]
    launchers: list[LauncherFacts]
    listeners: list[Listener]
    waits: list[InitWait]
    remote: bool

    @property
    def joined(self) -> list[str]:
        have = {lf.host for lf in self.launchers} | {r.host for r in self.job.ranks}
        return [h for h in self.hosts if h in have] + sorted(have - set(self.hosts))

    @property
    def state(self) -> StartupState:
        return "starting: init" if self.job.ranks else "starting: rendezvous"


def _who(lf: LauncherFacts, several: bool) -> str:
    return f"{lf.host} (pid {lf.pid})" if several else lf.host


def _reference(setting: str, values: dict[str, str], seen: _Seen) -> tuple[str | None, bool]:
    """The value the odd hosts should have taken, and whether the evidence decides it: the store
    the job's own process listens at, else node 0's, else the value most launchers share."""
    if setting in STORE_SETTINGS:
        ports = {lt.port for lt in seen.listeners if lt.of_job}
        served = {
            lf.settings[setting]
            for lf in seen.launchers
            if setting in lf.settings and (a := store_address(lf.settings)) is not None and a[1] in ports
        }
        if len(served) == 1:
            return served.pop(), True
        zero = {lf.settings[setting] for lf in seen.launchers if lf.settings.get("node_rank") == "0"}
        if len(zero) == 1:
            return zero.pop(), True
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] > counts[1][1]:
        return counts[0][0], True
    return None, False


def differences(seen: _Seen) -> list[Difference]:
    """Each compared setting the launchers disagree on, with the odd hosts when the evidence names them."""
    several = len({lf.host for lf in seen.launchers}) < len(seen.launchers)
    out: list[Difference] = []
    for setting in COMPARED:
        values = {_who(lf, several): lf.settings.get(setting, "default") for lf in seen.launchers}
        if len(set(values.values())) <= 1:
            continue
        if setting == "world_size" and out:
            continue  # it follows from --nnodes or --nproc_per_node, already named
        ref, sure = _reference(setting, values, seen)
        odd = [h for h, v in values.items() if v != ref] if sure else []
        out.append(Difference(setting=setting, values=values, odd_hosts=odd, reference=ref))
    return out


def resolution_differences(facts: Sequence[StartupFacts]) -> list[Difference]:
    """A master or endpoint name the hosts resolve to different addresses (no address in common)."""
    names = sorted({n for f in facts for n in f.resolved})
    out = []
    for name in names:
        got = {f.host: f.resolved[name] for f in facts if name in f.resolved}
        sets = [frozenset(v) for v in got.values()]
        if len(sets) > 1 and not frozenset.intersection(*sets):
            values = {h: ",".join(v) or "unresolved" for h, v in got.items()}
            counts = Counter(values.values()).most_common()
            ref = counts[0][0] if counts[0][1] > counts[1][1] else None
            odd = [h for h, v in values.items() if v != ref] if ref else []
            out.append(Difference(setting=f"{name} resolves to", values=values, odd_hosts=odd, reference=ref))
    return out


def _flag(setting: str, seen: _Seen) -> str:
    torchrun = any(lf.kind == "torchrun" for lf in seen.launchers)
    return FLAGS.get(setting, setting) if torchrun else ENV_FLAGS.get(setting, setting)


def _difference_ruling(d: Difference, seen: _Seen) -> tuple[str, str, Confidence]:
    """(summary, fix, confidence) for the first setting that differs."""
    if d.setting.endswith(" resolves to"):
        name = d.setting.removesuffix(" resolves to")
        told = "; ".join(f"{h}: {v}" for h, v in d.values.items())
        who = ", ".join(d.odd_hosts) or "the nodes"
        return (
            f"{name} resolves to different addresses on the nodes ({told}): {who} looks for the store elsewhere.",
            f"Make {name} resolve to the store's node everywhere (fix /etc/hosts or DNS on {who}), or pass its "
            "IP address as the master address.",
            "high" if d.odd_hosts else "medium",
        )
    flag = _flag(d.setting, seen)
    if d.odd_hosts and d.reference is not None:
        odd = ", ".join(d.odd_hosts)
        theirs = ", ".join(sorted({d.values[h] for h in d.odd_hosts}))
        others = [h for h in d.values if h not in d.odd_hosts]
        summary = (
            f"{odd} was launched with {flag}={theirs}, {', '.join(others)} with {flag}={d.reference}: "
            f"{WHY.get(d.setting, 'the launchers disagree')}."
        )
        return (
            summary,
            f"Relaunch {odd} with {flag}={d.reference}: every node must pass the same {flag}.",
            "high",
        )
    told = ", ".join(f"{h} {flag}={v}" for h, v in d.values.items())
    return (
        f"the launchers disagree on {flag} ({told}): {WHY.get(d.setting, 'they never meet')}.",
        f"Relaunch every node with the same {flag} (the value your job needs).",
        "high",
    )


def _store_port(seen: _Seen) -> tuple[str, int] | None:
    stores = [store_address(lf.settings) for lf in seen.launchers]
    known = [s for s in stores if s is not None]
    return Counter(known).most_common(1)[0][0] if known else None


def _held(seen: _Seen) -> Listener | None:
    """A visible process of no launcher or rank of the job listening at the job's store port."""
    store = _store_port(seen)
    if store is None:
        return None
    return next(
        (lt for lt in seen.listeners if lt.port == store[1] and lt.pid is not None and not lt.of_job), None
    )


def _held_ruling(held: Listener, seen: _Seen) -> tuple[str, str, Confidence]:
    gone = [h for h in seen.hosts if h not in seen.joined]
    also = (
        f"; {', '.join(gone)} runs no launcher of the job (the store's node could not listen)" if gone else ""
    )
    summary = (
        f"the store's port {held.port} on {held.host} is held by pid {held.pid} ({held.command or '?'}), "
        f"no launcher or rank of this job: another job or a previous run{also}."
    )
    fix = (
        f"Stop pid {held.pid} on {held.host} if it is a leftover, or relaunch every node with another port "
        "(--master_port / --rdzv_endpoint)."
    )
    return summary, fix, "high"


def _node_ranks(seen: _Seen) -> tuple[int | None, list[int]]:
    """The number of nodes the launchers wait for, and the static node ranks none of them has."""
    torchrun = [lf for lf in seen.launchers if lf.kind == "torchrun"]
    if not torchrun:
        return None, []
    expected = max(max_nodes(lf.settings.get("nnodes", "1")) for lf in torchrun)
    have = {int(v) for lf in torchrun if (v := lf.settings.get("node_rank", "")).isdigit()}
    static = all(lf.settings.get("rdzv_backend") == "static" for lf in torchrun)
    return expected, sorted(set(range(expected)) - have) if static else []


def _missing_hosts_ruling(seen: _Seen, gone: list[str]) -> tuple[str, str, Confidence]:
    expected, node_ranks = _node_ranks(seen)
    joined = seen.joined
    count = f"{len(joined)} of {expected} nodes" if expected else f"{len(joined)} of {len(seen.hosts)} hosts"
    which = f" (node_rank {', '.join(map(str, node_ranks))})" if node_ranks else ""
    summary = (
        f"{count} joined ({', '.join(joined)}); {', '.join(gone)}{which} runs no launcher or rank of this job: "
        "never launched (or its step did not start there), or it exited."
    )
    fix = (
        f"Launch the job on {', '.join(gone)} with the same command"
        + (f" (--node_rank={node_ranks[0]})" if len(node_ranks) == 1 else "")
        + ", or read its launcher's log for why it exited."
    )
    return summary, fix, "high"


def _init_ruling(seen: _Seen) -> tuple[str, str, Confidence] | None:
    missing = seen.job.missing_ranks
    if not missing or not seen.waits:
        return None
    where = Counter(w.where for w in seen.waits).most_common(1)[0][0]
    waiting = sorted(w.rank for w in seen.waits)
    world = seen.job.world_size
    hosts = ", ".join(seen.hosts)
    summary = (
        f"{ranks_phrase(waiting)} wait in {where} for {ranks_phrase(missing)} of world size {world}, which never "
        f"started: no process of {'it' if len(missing) == 1 else 'them'} on {hosts}."
    )
    fix = (
        f"Start {ranks_phrase(missing)} with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE={world}, or launch "
        f"with WORLD_SIZE={world - len(missing) if world else '?'} (the ranks you start)."
    )
    if not seen.remote:
        fix += " If they run on another host, collect every host in one call (--hosts)."
    return summary, fix, "high" if seen.remote else "medium"


def _waiting_ruling(seen: _Seen) -> tuple[str, str, Confidence]:
    expected, node_ranks = _node_ranks(seen)
    store = _store_port(seen)
    at = f" at {store[0]}:{store[1]}" if store else ""
    who = ", ".join(seen.joined) or "this host"
    if seen.state == "starting: rendezvous":
        more = (
            f" for {expected - len(seen.joined)} more node(s)"
            if expected and expected > len(seen.joined)
            else ""
        )
        which = f" (node_rank {', '.join(map(str, node_ranks))})" if node_ranks else ""
        summary = f"the launchers on {who} wait in rendezvous{at}{more}{which}; no rank has started."
    else:
        waiting = sorted(w.rank for w in seen.waits)
        summary = (
            f"{ranks_phrase(waiting) or 'the ranks'} wait in start-up{at}, before their first collective."
        )
        server = sorted(w.rank for w in seen.waits if STORE_SERVER_WAIT in w.where)
        if server:
            summary += (
                f" {ranks_phrase(server)}'s store still waits for ranks of the world to connect: a rank never "
                "started, died before it connected, or looks for another MASTER_ADDR/MASTER_PORT; the others "
                "wait for it."
            )
        world = seen.job.world_size
        if world and not seen.job.missing_ranks and len(waiting) >= world:
            return (
                f"every rank of world size {world} runs, and all wait in start-up{at}: they reached the store "
                "but not each other.",
                "Check the interface and ports the backend connects over (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, "
                "a firewall between the nodes): rankscope env (collect_env).",
                "low",
            )
    if seen.remote:
        return (
            summary,
            "Look at the launchers' logs on every node for a rendezvous error, or wait if a node is still starting.",
            "low",
        )
    return (
        summary,
        "Collect every node of the job in one call (rankscope stacks --hosts NODE1,NODE2 or --via srun --job ID): "
        "their launchers' settings are compared.",
        "medium",
    )


def _ruling(seen: _Seen, facts: Sequence[StartupFacts]) -> tuple[str, str, Confidence, list[Difference]]:
    diffs = [*differences(seen), *resolution_differences(facts)]
    ordered = sorted(diffs, key=lambda d: (not d.odd_hosts, _rank_of(d.setting)))
    if ordered:
        return (*_difference_ruling(ordered[0], seen), diffs)
    held = _held(seen)
    if held is not None:
        return (*_held_ruling(held, seen), diffs)
    gone = [h for h in seen.hosts if h not in seen.joined] if seen.remote else []
    if gone:
        return (*_missing_hosts_ruling(seen, gone), diffs)
    init = _init_ruling(seen)
    if init is not None:
        return (*init, diffs)
    return (*_waiting_ruling(seen), diffs)


def _rank_of(setting: str) -> int:
    name = setting.removesuffix(" resolves to")
    return COMPARED.index(name) if name in COMPARED else 1


def _evidence(seen: _Seen, facts: Sequence[StartupFacts]) -> list[str]:
    lines = []
    for lf in seen.launchers[:6]:
        told = " ".join(f"{k}={v}" for k, v in lf.settings.items() if k not in ("store",))
        what = f"{lf.kind} pid {lf.pid}" if lf.kind != "ranks" else f"rank environment (pid {lf.pid})"
        lines.append(f"{lf.host}: {what}: {told}; {lf.ranks} rank(s) started")
    store = _store_port(seen)
    placed = {lt.port for lt in seen.listeners if lt.pid is not None}
    for lt in seen.listeners[:4]:
        if (store is not None and lt.port != store[1]) or (lt.pid is None and lt.port in placed):
            continue  # another port, or a socket whose process another host named
        owner = f"pid {lt.pid} ({lt.command or '?'})" if lt.pid is not None else "a process not visible there"
        mine = "this job's" if lt.of_job else ("not this job's" if lt.pid is not None else "owner unknown")
        address = f"[{lt.address}]" if ":" in lt.address else lt.address
        lines.append(
            f"{lt.host}: {owner} listens at {address}:{lt.port}, {mine}; {lt.connections} connection(s)"
        )
    if store is not None and not any(lt.port == store[1] for lt in seen.listeners):
        lines.append(
            f"nothing listens at the store's port {store[1]} on {', '.join(f.host for f in facts) or 'this host'}"
        )
    lines.extend(line for f in facts for line in f.exited[:2])
    by_where: dict[str, list[int]] = {}
    for w in seen.waits:
        by_where.setdefault(w.where, []).append(w.rank)
    lines.extend(
        f"{ranks_phrase(sorted(r))} {'waits' if len(r) == 1 else 'wait'} in {where}"
        for where, r in list(by_where.items())[:3]
    )
    logs = {lf.log_line for lf in seen.launchers if lf.log_line}
    lines.extend(f"log: {line}" for line in sorted(logs)[:2])
    return lines[:10]


def startup_verdict(
    job: Job, facts: Sequence[StartupFacts], stacks: Sequence[RankStack], *, remote: bool
) -> tuple[Verdict, StartupFinding] | None:
    """The verdict on ``job`` in start-up from every host's ``facts`` and its ranks' ``stacks``;
    None when it is not in start-up (ranks past their first collective, or no launcher read).
    ``remote``: the facts cover every host of the call (a missing host is then named)."""
    waits = init_waits(stacks)
    launchers = [lf for f in facts for lf in f.launchers]
    if job.ranks and (not waits or len(waits) < len([s for s in stacks if s.error is None])):
        return None  # some rank is past start-up: the hang rules decide
    if not job.ranks and not launchers:
        return None
    seen = _Seen(
        job=job,
        hosts=[f.host for f in facts],
        launchers=launchers,
        listeners=[lt for f in facts for lt in f.listeners],
        waits=waits,
        remote=remote,
    )
    summary, fix, confidence, diffs = _ruling(seen, facts)
    expected, _ = _node_ranks(seen)
    finding = StartupFinding(
        state=seen.state,
        joined_hosts=seen.joined,
        missing_hosts=[h for h in seen.hosts if h not in seen.joined] if remote else [],
        expected_nodes=expected,
        missing_ranks=list(job.missing_ranks),
        differences=diffs,
        listeners=seen.listeners[:8],
        waiting=waits,
    )
    steps = [
        NextStep(action=fix, skill_section=PLAYBOOK),
        NextStep(action="Once relaunched, check that every node's ranks started.", tool="list_jobs"),
    ]
    head = f"{seen.state}: "
    verdict = Verdict(
        kind="startup",
        suspect_ranks=list(job.missing_ranks) if seen.state == "starting: init" else [],
        confidence=confidence,
        summary=head + summary,
        evidence=_evidence(seen, facts),
        next_steps=steps,
    )
    return verdict, finding


__all__ = ["INIT", "PLAYBOOK", "RENDEZVOUS", "init_wait", "init_waits", "job_state", "startup_verdict"]
