"""Environment checks, pure: node facts and per-rank environments in, findings out.

What is checked, and why (checked against the PyTorch ProcessGroupNCCL and NCCL
environment-variable documentation):

* variables that must agree across ranks (NCCL_*, TORCH_NCCL_*, MASTER_*,
  WORLD_SIZE, TORCHELASTIC_RUN_ID, ...): NCCL picks protocols, algorithms and
  transports from them on each rank independently, so a difference can hang
  the first collective or make ranks disagree on the group;
* two ranks of one host on the same physical GPU;
* ranks on different interpreters or torch builds;
* settings that hide or cause failures: flight recorder off, async error
  handling off, CUDA_LAUNCH_BLOCKING on, P2P/IB disabled, a socket interface
  name that matches no interface (NCCL: ``^`` excludes, ``=`` exact match,
  otherwise prefix match), a small /dev/shm for the DataLoader workers in use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from rankscope.analysis.gpu_parsers import non_nvlink_gpu_pairs
from rankscope.models.core import Finding, NextStep, Severity
from rankscope.models.env import EnvDifference, NodeInfo, RankEnv

_CE = "skill/communication-errors.md"
_CR = "skill/crashes.md"
_HANGS = "skill/hangs.md"

DIST_PREFIXES: tuple[str, ...] = (
    "NCCL_",
    "TORCH_",
    "TORCHELASTIC_",
    "GLOO_",
    "MASTER_",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "UCX_",
)
DIST_NAMES: frozenset[str] = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
        "OMP_NUM_THREADS",
        "LD_PRELOAD",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_JOB_ID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
    }
)
PER_RANK: frozenset[str] = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "NODE_RANK",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
        "TORCHELASTIC_ERROR_FILE",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "LOCAL_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_FR_DUMP_TEMP_FILE",
    }
)
"""Variables that legitimately differ between ranks (or nodes)."""
_PER_NODE_SUFFIXES = ("_SOCKET_IFNAME", "_IB_HCA")
"""Interface / HCA names may differ between heterogeneous nodes: a difference is only a warning."""
_CRITICAL_MATCH = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def is_dist_var(name: str) -> bool:
    """True for the variables rankscope reports per rank."""
    return name in DIST_NAMES or name.startswith(DIST_PREFIXES)


def _rank_key(r: RankEnv) -> str:
    return str(r.rank) if r.rank is not None else f"pid{r.pid}"


def _ranks(rs: list[RankEnv]) -> list[int]:
    return sorted(r.rank for r in rs if r.rank is not None)


def diff_ranks(ranks: list[RankEnv]) -> list[EnvDifference]:
    """Variables whose value differs between ranks (unset counts as a value)."""
    if len(ranks) < 2:
        return []
    names = sorted({n for r in ranks for n in r.env})
    out: list[EnvDifference] = []
    for name in names:
        if name in PER_RANK:
            continue
        values = {_rank_key(r): r.env.get(name) for r in ranks}
        if len(set(values.values())) > 1:
            out.append(EnvDifference(name=name, values=values, must_match=True))
    return out


def _finding(
    kind: str,
    severity: Severity,
    message: str,
    explanation: str,
    fix: str,
    section: str,
    ranks: list[int] | None = None,
    tool: str | None = None,
    **facts: object,
) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        ranks=ranks or [],
        message=message,
        explanation=explanation,
        fix=fix,
        facts=dict(facts),
        next_steps=[NextStep(action=fix, tool=tool, skill_section=section)],
    )


def _difference_findings(diffs: list[EnvDifference]) -> list[Finding]:
    out: list[Finding] = []
    for d in diffs:
        ranks = sorted(int(k) for k in d.values if k.isdigit())
        critical = d.name in _CRITICAL_MATCH
        severity: Severity = (
            "critical"
            if critical
            else "error"
            if d.name.startswith(("NCCL_", "TORCH_NCCL_", "GLOO_"))
            and not d.name.endswith(_PER_NODE_SUFFIXES)
            else "warning"
        )
        shown = ", ".join(
            f"rank {k}: {v if v is not None else '<unset>'}" for k, v in sorted(d.values.items())
        )
        out.append(
            _finding(
                "env_mismatch",
                severity,
                f"{d.name} differs between ranks ({shown})",
                "Each rank reads these variables on its own; NCCL and c10d assume they agree. A rank with a different "
                "NCCL setting can choose another algorithm, protocol or transport and hang or fail the first collective; "
                "a different MASTER_*/WORLD_SIZE/run id puts the rank in another rendezvous.",
                f"Set {d.name} identically for every rank (in the launcher's environment, not per node scripts).",
                f"{_CE}#environment-mismatch",
                ranks,
                "collect_env",
                variable=d.name,
                values=d.values,
            )
        )
    return out


def _physical_gpu(r: RankEnv) -> str | None:
    cvd = r.env.get("CUDA_VISIBLE_DEVICES")
    local = r.local_rank
    if local is None and r.env.get("LOCAL_RANK", "").isdigit():
        local = int(r.env["LOCAL_RANK"])
    if cvd is None:
        return str(local) if local is not None else None
    devices = [d.strip() for d in cvd.split(",") if d.strip()]
    if not devices:
        return None  # no GPU visible
    if len(devices) == 1:
        return devices[0]
    if local is not None and local < len(devices):
        return devices[local]
    return None


def _gpu_sharing(ranks: list[RankEnv], has_gpus: bool) -> list[Finding]:
    by_dev: dict[tuple[str, str], list[RankEnv]] = defaultdict(list)
    for r in ranks:
        dev = _physical_gpu(r)
        if dev is not None and "CUDA_VISIBLE_DEVICES" in r.env:
            by_dev[(r.host, dev)].append(r)
        elif dev is not None and has_gpus:
            by_dev[(r.host, dev)].append(r)
    out: list[Finding] = []
    for (host, dev), rs in sorted(by_dev.items()):
        if len(rs) < 2:
            continue
        out.append(
            _finding(
                "gpu_shared",
                "error",
                f"ranks {', '.join(map(str, _ranks(rs)))} on {host} map to the same GPU {dev}",
                "With the same CUDA_VISIBLE_DEVICES and LOCAL_RANK mapping, these ranks compute on one physical GPU: "
                "NCCL refuses duplicate GPUs in a communicator ('Duplicate GPU detected') or the ranks run out of memory.",
                "Give each local rank its own GPU: do not set CUDA_VISIBLE_DEVICES per rank by hand under torchrun; call "
                "torch.cuda.set_device(LOCAL_RANK).",
                f"{_CE}#gpu-shared",
                _ranks(rs),
                "collect_env",
                host=host,
                gpu=dev,
                cuda_visible_devices={_rank_key(r): r.env.get("CUDA_VISIBLE_DEVICES") for r in rs},
            )
        )
    return out


def _mixed(ranks: list[RankEnv], attr: str, kind: str, what: str) -> list[Finding]:
    values = {_rank_key(r): getattr(r, attr) for r in ranks if getattr(r, attr)}
    if len(set(values.values())) < 2:
        return []
    return [
        _finding(
            kind,
            "error",
            f"ranks run different {what}: " + ", ".join(f"rank {k}: {v}" for k, v in sorted(values.items())),
            f"Ranks built from different {what} can disagree on pickling, collective implementations and NCCL "
            "versions, which fails or hangs in ways that look like application bugs.",
            "Launch every rank from the same environment (same venv/container image on every node).",
            f"{_CE}#environment-mismatch",
            sorted(int(k) for k in values if k.isdigit()),
            "collect_env",
            values=values,
        )
    ]


def _ifname_matches(spec: str, interfaces: list[str]) -> tuple[bool, list[str]]:
    """NCCL_SOCKET_IFNAME semantics: '^a,b' excludes, '=a' exact, otherwise prefixes."""
    spec = spec.strip()
    if not spec:
        return True, interfaces
    if spec.startswith("^"):
        excl = spec[1:]
        exact = excl.startswith("=")
        parts = [p for p in (excl[1:] if exact else excl).split(",") if p]
        left = [i for i in interfaces if not any((i == p) if exact else i.startswith(p) for p in parts)]
        return bool(left), left
    exact = spec.startswith("=")
    parts = [p for p in (spec[1:] if exact else spec).split(",") if p]
    hits = [i for i in interfaces if any((i == p) if exact else i.startswith(p) for p in parts)]
    return bool(hits), hits


def uses_nccl(r: RankEnv) -> bool:
    """The rank runs NCCL: read from the process, else NCCL/TORCH_NCCL variables set at launch."""
    if r.backend is not None and r.backend != "unknown":
        return r.backend in ("nccl", "mixed")
    return any(k.startswith(("NCCL_", "TORCH_NCCL_")) for k in r.env)


_OFF = ("0", "false", "False", "FALSE", "no", "off")
_ON = ("1", "true", "True", "TRUE", "yes", "on")
_AT_LAUNCH = (
    " (Read from the environment given at launch: a value set in code through os.environ, as torchtitan does, "
    "is not visible here.)"
)


def recorder_off(env: Mapping[str, str]) -> bool:
    """TORCH_FR_BUFFER_SIZE (or its older name) is 0: the NCCL flight recorder keeps nothing."""
    return (env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "").strip() == "0"


def dump_on_timeout_off(env: Mapping[str, str]) -> bool:
    """TORCH_NCCL_DUMP_ON_TIMEOUT is off: a watchdog timeout writes no recorder dump."""
    return env.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "").strip() in _OFF


def blocking_wait_on(env: Mapping[str, str]) -> bool:
    """TORCH_NCCL_BLOCKING_WAIT is on: no watchdog, so no timeout and no dump."""
    return env.get("TORCH_NCCL_BLOCKING_WAIT", "").strip() in _ON


def nccl_recorder_findings(ranks: list[RankEnv]) -> list[Finding]:
    """Settings that take away what an NCCL hang is diagnosed with: the recorder, its dump, the watchdog.

    torch 2.13 defaults: TORCH_FR_BUFFER_SIZE=2000 (on), TORCH_NCCL_DUMP_ON_TIMEOUT=1,
    TORCH_NCCL_BLOCKING_WAIT=0. Only ranks that run NCCL are checked: gloo has no watchdog dump.
    """
    nccl = [r for r in ranks if uses_nccl(r)]
    out: list[Finding] = []
    fr_off = [r for r in nccl if recorder_off(r.env)]
    if fr_off:
        out.append(
            _finding(
                "flight_recorder_off",
                "warning",
                "NCCL flight recorder turned off (TORCH_FR_BUFFER_SIZE=0)",
                "The recorder is what names the rank that never issued a collective on NCCL, where every rank's CPU "
                "stops at some GPU wait; with it off a hang leaves no record." + _AT_LAUNCH,
                "Unset TORCH_FR_BUFFER_SIZE (default 2000 entries in torch 2.13) for the next run; the cost is a "
                "ring buffer of recent collectives per process group, a few percent at most.",
                f"{_HANGS}#nccl-hangs",
                _ranks(fr_off),
                "analyze_flight_recorder",
            )
        )
    no_dump = [r for r in nccl if dump_on_timeout_off(r.env)]
    if no_dump:
        out.append(
            _finding(
                "fr_dump_on_timeout_off",
                "warning",
                "TORCH_NCCL_DUMP_ON_TIMEOUT=0: a watchdog timeout writes no flight-recorder dump",
                "On a collective timeout each rank normally writes its recorder to TORCH_FR_DUMP_TEMP_FILE<rank> "
                "(default ~/.cache/torch/comm_lib_trace_rank_<rank>); with this off the evidence is lost when the "
                "job dies." + _AT_LAUNCH,
                "Unset TORCH_NCCL_DUMP_ON_TIMEOUT (default 1) for the next run; it costs nothing until a timeout, then "
                "up to a minute of dump window.",
                f"{_HANGS}#nccl-hangs",
                _ranks(no_dump),
                "analyze_flight_recorder",
            )
        )
    blocking = [r for r in nccl if blocking_wait_on(r.env)]
    if blocking:
        out.append(
            _finding(
                "nccl_blocking_wait",
                "warning",
                "TORCH_NCCL_BLOCKING_WAIT=1: no NCCL watchdog, and no timeout for synchronous collectives",
                "Since torch 2.8 blocking wait starts no watchdog thread: synchronous collectives return no work to "
                "wait on, so a stuck one never times out, the recorder is never dumped on a timeout and its "
                "last_enqueued status is not kept; only explicit work.wait() calls poll. It no longer makes "
                "collectives visible on the CPU." + _AT_LAUNCH,
                "Unset TORCH_NCCL_BLOCKING_WAIT; keep the watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, the default) and "
                "pass timeout= to init_process_group. Costs nothing; restores timeouts and dumps.",
                f"{_HANGS}#nccl-hangs",
                _ranks(blocking),
                "collect_env",
            )
        )
    return out


def _setting_findings(node: NodeInfo, ranks: list[RankEnv], live: bool) -> list[Finding]:
    """Settings that cause or hide failures, one small check each."""
    if not ranks:
        return []
    return [
        *nccl_recorder_findings(ranks),
        *_async_error_findings(ranks),
        *_launch_blocking_findings(ranks),
        *_transport_findings(ranks),
        *_ifname_findings(node, ranks),
        *_nccl_debug_findings(node, ranks, live),
        *_shm_findings(node, ranks),
        *_limit_findings(node, ranks),
    ]


def _async_error_findings(ranks: list[RankEnv]) -> list[Finding]:
    out: list[Finding] = []
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        off = [r for r in ranks if r.env.get(name, "").strip() == "0"]
        if off:
            out.append(
                _finding(
                    "async_error_handling_off",
                    "warning",
                    f"{name}=0: NCCL errors and timeouts are not acted upon",
                    "With async error handling off, the watchdog does not tear down a rank whose collective failed or timed "
                    "out, so a failure becomes an endless hang (the default, 3, tears the process down).",
                    f"Unset {name} (default 3) or set it to 1 or 3.",
                    f"{_CE}#collective-timeout",
                    _ranks(off),
                    "collect_env",
                )
            )
    return out


def _launch_blocking_findings(ranks: list[RankEnv]) -> list[Finding]:
    out: list[Finding] = []
    blocking = [r for r in ranks if r.env.get("CUDA_LAUNCH_BLOCKING", "").strip() not in ("", "0")]
    if blocking:
        out.append(
            _finding(
                "cuda_launch_blocking",
                "warning",
                "CUDA_LAUNCH_BLOCKING is on",
                "It serialises every kernel launch: a debugging aid that makes training much slower and changes timing; "
                "with NCCL it can even deadlock when one rank blocks on a kernel that waits for another.",
                "Unset CUDA_LAUNCH_BLOCKING outside a focused debugging run.",
                f"{_CR}#cuda-error",
                _ranks(blocking),
            )
        )
    return out


def _transport_findings(ranks: list[RankEnv]) -> list[Finding]:
    out: list[Finding] = []
    for name, what in (
        ("NCCL_P2P_DISABLE", "GPU peer-to-peer (NVLink/PCIe P2P)"),
        ("NCCL_IB_DISABLE", "InfiniBand/RoCE"),
    ):
        on = [r for r in ranks if r.env.get(name, "").strip() not in ("", "0")]
        if on:
            out.append(
                _finding(
                    name.lower(),
                    "warning",
                    f"{name} is set: NCCL will not use {what}",
                    "Usually left over from a workaround; NCCL falls back to slower paths (shared memory or host "
                    "sockets), which can also change which failures happen and how long collectives take.",
                    f"Unset {name} unless you have confirmed that transport is broken on this cluster.",
                    f"{_CE}#nccl-error",
                    _ranks(on),
                )
            )
    return out


def _ifname_findings(node: NodeInfo, ranks: list[RankEnv]) -> list[Finding]:
    out: list[Finding] = []
    iface_names = [i.name for i in node.interfaces]
    if iface_names:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            by_value: dict[str, list[RankEnv]] = defaultdict(list)
            for r in ranks:
                if r.env.get(var) is not None:
                    by_value[r.env[var]].append(r)
            for spec, holders in sorted(by_value.items()):
                ok, _ = _ifname_matches(spec, iface_names)
                if ok:
                    continue
                out.append(
                    _finding(
                        "socket_ifname_missing",
                        "error",
                        f"{var}={spec} matches no interface on {node.hostname}",
                        f"{'NCCL' if var.startswith('NCCL') else 'gloo'} binds its sockets to the named interface; "
                        "when none matches, initialisation fails ('no socket interface found' / 'Bootstrap : no "
                        "socket interface') or hangs. In NCCL's syntax a leading '^' excludes, '=' asks for an "
                        "exact name, otherwise names are prefixes.",
                        f"Set {var} to one of: {', '.join(iface_names)} (or unset it to let the library choose).",
                        f"{_CE}#nccl-error",
                        _ranks(holders),
                        "collect_env",
                        variable=var,
                        value=spec,
                        interfaces=iface_names,
                    )
                )
    return out


def _nccl_debug_findings(node: NodeInfo, ranks: list[RankEnv], live: bool) -> list[Finding]:
    out: list[Finding] = []
    everyone = _ranks(ranks)
    if (
        live
        and all("NCCL_DEBUG" not in r.env for r in ranks)
        and (node.gpus or any("NCCL_" in n for r in ranks for n in r.env))
    ):
        out.append(
            _finding(
                "nccl_debug_unset",
                "info",
                "NCCL_DEBUG is not set",
                "NCCL prints nothing about its transports, interfaces and errors unless NCCL_DEBUG is set.",
                "While debugging, launch with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET to keep it short); use WARN in production.",
                f"{_CE}#nccl-error",
                everyone,
            )
        )
    return out


def _shm_findings(node: NodeInfo, ranks: list[RankEnv]) -> list[Finding]:
    out: list[Finding] = []
    everyone = _ranks(ranks)
    workers = sum(r.children for r in ranks)
    shm = node.shm
    if shm.size_bytes is not None:
        free = shm.size_bytes - (shm.used_bytes or 0)
        small = shm.size_bytes < 1024**3
        if workers and (small or free < 256 * 1024**2):
            out.append(
                _finding(
                    "shm_too_small",
                    "error" if shm.size_bytes <= 256 * 1024**2 or free < 64 * 1024**2 else "warning",
                    f"/dev/shm is {shm.size_bytes // 1024**2} MiB ({free // 1024**2} MiB free) for {workers} DataLoader worker(s)",
                    "DataLoader workers hand batches to the rank through /dev/shm; a container's default 64 MiB runs out "
                    "with a few workers ('No space left on device', bus errors, killed workers).",
                    "Run the container with a larger /dev/shm (docker --shm-size=16g; Kubernetes: an emptyDir with "
                    "medium: Memory mounted at /dev/shm), or lower num_workers.",
                    f"{_CR}#shm-exhausted",
                    everyone,
                    "collect_env",
                    shm_size_bytes=shm.size_bytes,
                    shm_free_bytes=free,
                    workers=workers,
                )
            )
    return out


def _limit_findings(node: NodeInfo, ranks: list[RankEnv]) -> list[Finding]:
    out: list[Finding] = []
    everyone = _ranks(ranks)
    lim = node.limits
    if node.infiniband and lim.locked_memory_soft is not None and lim.locked_memory_soft < 64 * 1024**2:
        out.append(
            _finding(
                "memlock_limited",
                "warning",
                f"locked-memory limit is {lim.locked_memory_soft // 1024} KiB with InfiniBand devices present",
                "RDMA registers (pins) communication buffers; a small RLIMIT_MEMLOCK makes NCCL's IB transport fail to "
                "register memory and fall back or fail.",
                "Raise the memlock limit to unlimited (ulimit -l unlimited; docker --ulimit memlock=-1).",
                f"{_CE}#nccl-error",
                everyone,
                "collect_env",
            )
        )
    if lim.open_files_soft is not None and lim.open_files_soft < 4096:
        out.append(
            _finding(
                "open_files_low",
                "warning",
                f"open-files limit is {lim.open_files_soft}",
                "Each rank opens sockets to its peers and the store, and DataLoader workers share tensors through file "
                "descriptors: a low limit fails with 'Too many open files' at scale.",
                "Raise it (ulimit -n 65536; docker --ulimit nofile=65536).",
                f"{_CR}#dataloader-worker-killed",
                everyone,
            )
        )
    return out


def _node_findings(node: NodeInfo) -> list[Finding]:
    out: list[Finding] = []
    for ev in node.xid_events:
        out.append(
            _finding(
                "gpu_xid",
                "critical",
                f"GPU Xid {ev.xid} on {ev.pci}: {ev.detail[:120]}",
                ev.meaning,
                "Hardware Xids (48, 63, 64, 74, 79, 92, 94, 95) need the node drained and the GPU checked; others usually "
                "follow an application fault.",
                f"{_CR}#gpu-xid",
                None,
                "collect_env",
                xid=ev.xid,
                pci=ev.pci,
            )
        )
    for g in node.gpus:
        if g.ecc_uncorrected_volatile:
            out.append(
                _finding(
                    "gpu_ecc_errors",
                    "critical",
                    f"GPU {g.index} reports {g.ecc_uncorrected_volatile} uncorrected ECC errors",
                    "Uncorrected ECC errors corrupt data or kill kernels; collectives on this GPU fail with CUDA or NCCL errors.",
                    "Drain the node and reset or replace the GPU.",
                    f"{_CR}#gpu-xid",
                    None,
                    "collect_env",
                    gpu=g.index,
                )
            )
    if node.topology is not None:
        pairs = non_nvlink_gpu_pairs(node.topology)
        if pairs:
            out.append(
                Finding(
                    kind="gpu_topology",
                    severity="info",
                    message=f"{len(pairs)} GPU pair(s) connected without NVLink (e.g. {pairs[0][0]}-{pairs[0][1]}: {pairs[0][2]})",
                    explanation="Collectives between these GPUs go over PCIe/host memory: slower, and NCCL_P2P_LEVEL matters.",
                    facts={"pairs": [list(p) for p in pairs[:32]]},
                )
            )
    return out


_ORDER = {"critical": 0, "error": 1, "warning": 2, "info": 3}


def check_env(
    node: NodeInfo, ranks: list[RankEnv], *, live: bool = True
) -> tuple[list[EnvDifference], list[Finding]]:
    """All cross-rank differences and findings, most severe first. ``live``: ranks are processes of a job."""
    diffs = diff_ranks(ranks)
    findings = _difference_findings(diffs)
    findings += _gpu_sharing(ranks, bool(node.gpus))
    findings += _mixed(ranks, "python", "mixed_interpreters", "Python interpreters")
    findings += _mixed(ranks, "torch_version", "mixed_torch_versions", "torch versions")
    findings += _setting_findings(node, ranks, live)
    findings += _node_findings(node)
    findings.sort(key=lambda f: _ORDER[f.severity])
    return diffs, findings
