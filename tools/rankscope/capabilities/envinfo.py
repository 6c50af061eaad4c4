"""`rankscope env`: facts about this node and each live rank's environment.

The shell around ``rankscope.analysis.env_checks``. Everything here is
read-only and bounded: external commands (nvidia-smi, dmesg, the torch probe)
run with timeouts and are reaped; /proc and /sys are read, never written; a
missing tool or driver becomes a note, not an error. Values pass through one
``Redactor`` that first learns every rank's whole environment, so a secret
cannot leak through another variable or a command line.

The torch facts come from ``torch.utils.collect_env`` run in a subprocess of
the job's own interpreter (or this one), because rankscope itself must not
import torch and the job's torch may differ from ours. The torch version a
rank actually loaded is read from /proc/PID/maps (the mapped libtorch / torch
package) and that package's version.py: no ptrace, no import.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import resource
import shutil
import socket
import sys
from pathlib import Path

from rankscope.analysis.env_checks import check_env, is_dist_var
from rankscope.analysis.gpu_parsers import QUERY_FIELDS, parse_gpu_query, parse_topology, parse_xid_lines
from rankscope.analysis.redact import Redactor
from rankscope.capabilities.discovery import find_job, list_jobs
from rankscope.errors import RankscopeError
from rankscope.models.core import Job
from rankscope.models.env import (
    EnvReport,
    IbDevice,
    IbPort,
    Limits,
    NetInterface,
    NodeInfo,
    RankEnv,
    ShmInfo,
    TorchInfo,
)
from rankscope.options import check_pid
from rankscope.runtime import net, procfs, subproc
from rankscope.runtime.proctree import children_map

log = logging.getLogger("rankscope.env")

SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")
TORCH_PROBE_TIMEOUT = 90.0
SMI_TIMEOUT = 20.0
DMESG_TIMEOUT = 5.0

_COLLECT_ENV_FIELDS = (
    "torch_version",
    "is_debug_build",
    "cuda_compiled_version",
    "cuda_runtime_version",
    "nvidia_driver_version",
    "nvidia_gpu_models",
    "cudnn_version",
    "os",
    "libc_version",
    "python_version",
    "python_platform",
    "gcc_version",
    "caching_allocator_config",
    "is_cuda_available",
    "hip_compiled_version",
)

_TORCH_PROBE = r"""
import json, sys
out = {"python": sys.executable}
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}))
    raise SystemExit(0)
out["version"] = torch.__version__
out["cuda"] = torch.version.cuda
try:
    out["cudnn"] = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
except Exception:
    out["cudnn"] = None
try:
    import torch.cuda.nccl as _nccl
    v = _nccl.version()
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception:
    out["nccl"] = None
try:
    import torch.distributed as dist
    out["backends"] = {n: bool(getattr(dist, "is_%s_available" % n, lambda: False)()) for n in ("gloo", "nccl", "mpi", "ucc", "xccl")}
except Exception:
    out["backends"] = {}
out["cuda_available"] = bool(torch.cuda.is_available())
out["gpu_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
try:
    from torch.utils import collect_env as ce
    info = ce.get_env_info()._asdict()
    out["collect_env"] = {k: str(info.get(k)) for k in FIELDS if info.get(k) is not None}
except Exception as exc:
    out["collect_env"] = {"error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
"""


# -- small readers -----------------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _run(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr); exit code None when it could not start or timed out."""
    try:
        res = subproc.run(argv, timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except OSError as exc:
        return None, "", str(exc)
    if res.timed_out:
        return None, "", f"timed out after {timeout:.0f}s"
    return res.rc, res.stdout, res.stderr


def parse_limits(text: str) -> Limits:
    """/proc/PID/limits -> open files and locked memory (None = unlimited)."""
    lim = Limits()

    def num(v: str) -> int | None:
        return None if v == "unlimited" else int(v) if v.isdigit() else None

    for line in text.splitlines():
        m = re.match(r"^(Max open files|Max locked memory)\s+(\S+)\s+(\S+)", line)
        if not m:
            continue
        if m.group(1) == "Max open files":
            lim.open_files_soft, lim.open_files_hard = num(m.group(2)), num(m.group(3))
        else:
            lim.locked_memory_soft, lim.locked_memory_hard = num(m.group(2)), num(m.group(3))
    return lim


def _own_limits() -> Limits:
    def conv(v: int) -> int | None:
        return None if v == resource.RLIM_INFINITY else int(v)

    nf = resource.getrlimit(resource.RLIMIT_NOFILE)
    ml = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return Limits(
        open_files_soft=conv(nf[0]),
        open_files_hard=conv(nf[1]),
        locked_memory_soft=conv(ml[0]),
        locked_memory_hard=conv(ml[1]),
    )


# -- node --------------------------------------------------------------------------------------------------


def _meminfo() -> tuple[int | None, int | None]:
    text = procfs.host_text("meminfo") or ""
    vals: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\s+(\d+) kB", line)
        if m:
            vals[m.group(1)] = int(m.group(2)) * 1024
    return vals.get("MemTotal"), vals.get("MemAvailable")


def _shm() -> ShmInfo:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return ShmInfo()
    return ShmInfo(size_bytes=st.f_blocks * st.f_frsize, used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize)


def _os_name() -> str | None:
    text = _read(Path("/etc/os-release")) or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.MULTILINE)
    return m.group(1) if m else platform.system()


def _ipv6() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (procfs.host_text("net/if_inet6") or "").splitlines():
        parts = line.split()
        if len(parts) >= 6:
            raw = parts[0]
            addr = ":".join(raw[i : i + 4] for i in range(0, 32, 4))
            with contextlib.suppress(OSError, ValueError):
                addr = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, addr))
            out.setdefault(parts[5], []).append(addr)
    return out


def network_interfaces() -> list[NetInterface]:
    """Interfaces from /sys/class/net with IPv4 (ioctl) and IPv6 (/proc/net/if_inet6) addresses."""
    v6 = _ipv6()
    out: list[NetInterface] = []
    try:
        names = sorted(p.name for p in SYS_NET.iterdir())
    except OSError:
        names = sorted(name for _, name in socket.if_nameindex())
    for name in names:
        base = SYS_NET / name
        mtu = (_read(base / "mtu") or "").strip()
        speed = (_read(base / "speed") or "").strip()
        addrs = [a for a in [net.interface_ipv4(name)] if a] + v6.get(name, [])
        out.append(
            NetInterface(
                name=name,
                state=(_read(base / "operstate") or "").strip() or None,
                mtu=int(mtu) if mtu.isdigit() else None,
                speed_mbps=int(speed) if speed.isdigit() and int(speed) > 0 else None,
                addresses=addrs,
            )
        )
    return out


def infiniband_devices() -> list[IbDevice]:
    """RDMA devices from /sys/class/infiniband (mlx5_0, ...), with port state and rate."""
    out: list[IbDevice] = []
    try:
        devs = sorted(SYS_IB.iterdir())
    except OSError:
        return out
    for dev in devs:
        ports: list[IbPort] = []
        with contextlib.suppress(OSError):
            for port in sorted((dev / "ports").iterdir()):
                if not port.name.isdigit():
                    continue
                ports.append(
                    IbPort(
                        port=int(port.name),
                        state=(_read(port / "state") or "").strip() or None,
                        phys_state=(_read(port / "phys_state") or "").strip() or None,
                        rate=(_read(port / "rate") or "").strip() or None,
                        link_layer=(_read(port / "link_layer") or "").strip() or None,
                    )
                )
        out.append(IbDevice(name=dev.name, ports=ports))
    return out


def torch_info(python: str, redactor: Redactor) -> TorchInfo:
    """torch / CUDA / NCCL / cuDNN versions and backends, from a subprocess of ``python`` (with a timeout)."""
    script = f"FIELDS = {_COLLECT_ENV_FIELDS!r}\n{_TORCH_PROBE}"
    rc, out, err = _run([python, "-c", script], TORCH_PROBE_TIMEOUT)
    info = TorchInfo(python=python)
    if rc is None:
        info.error = f"torch probe with {python} failed: {err}"
        return info
    try:
        data = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except ValueError:
        data = {}
    if not data or "error" in data:
        info.error = redactor.text(str(data.get("error") or err.strip()[-400:] or f"exit code {rc}"))
        if "No module named 'torch'" in (info.error or ""):
            info.error = f"torch is not installed in {python}"
        return info
    info.available = True
    info.version, info.cuda, info.nccl, info.cudnn = (
        data.get("version"),
        data.get("cuda"),
        data.get("nccl"),
        data.get("cudnn"),
    )
    info.backends = {str(k): bool(v) for k, v in (data.get("backends") or {}).items()}
    info.cuda_available = data.get("cuda_available")
    info.gpu_count = data.get("gpu_count")
    info.collect_env = {str(k): redactor.text(str(v)) for k, v in (data.get("collect_env") or {}).items()}
    return info


def gpus(node: NodeInfo) -> None:
    """Fill GPU facts from nvidia-smi, or say why there are none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        node.gpu_note = (
            "nvidia-smi not found: no NVIDIA driver on this node (or not on PATH); GPU facts skipped."
        )
        return
    rc, out, err = _run(
        [smi, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"], SMI_TIMEOUT
    )
    if rc != 0:
        node.gpu_note = f"nvidia-smi failed: {(err or out).strip()[:300] or f'exit code {rc}'}"
        return
    node.gpus = parse_gpu_query(out)
    if not node.gpus:
        node.gpu_note = "nvidia-smi lists no GPUs."
        return
    rc, out, err = _run([smi, "topo", "-m"], SMI_TIMEOUT)
    if rc == 0:
        node.topology = parse_topology(out)
    else:
        node.notes.append(f"nvidia-smi topo -m failed: {(err or out).strip()[:200]}")


def xid_events(node: NodeInfo) -> None:
    """Recent Xid errors from the kernel log (dmesg with a timeout: never blocks)."""
    if not node.gpus and not procfs.host_has("driver/nvidia"):
        node.xid_note = "no NVIDIA driver: no Xid errors to read."
        return
    dmesg = shutil.which("dmesg")
    if dmesg is None:
        node.xid_note = "dmesg not found: kernel log not read."
        return
    rc, out, err = _run([dmesg], DMESG_TIMEOUT)
    if rc != 0:
        node.xid_note = f"kernel log not readable ({(err or 'dmesg failed').strip()[:160]}); run as root or check journalctl -k."
        return
    node.xid_events = parse_xid_lines(out.splitlines())[-50:]


def node_info(redactor: Redactor, python: str | None = None, include_torch: bool = True) -> NodeInfo:
    total, avail = _meminfo()
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    node = NodeInfo(
        hostname=socket.gethostname(),
        os=_os_name(),
        kernel=platform.release(),
        cpus=os.cpu_count(),
        cpus_usable=usable,
        memory_total_bytes=total,
        memory_available_bytes=avail,
        shm=_shm(),
        limits=_own_limits(),
        python=f"{platform.python_version()} ({python or sys.executable})",
    )
    if include_torch:
        node.torch = torch_info(python or sys.executable, redactor)
    gpus(node)
    xid_events(node)
    node.interfaces = network_interfaces()
    node.infiniband = infiniband_devices()
    return node


# -- ranks -------------------------------------------------------------------------------------------------


def loaded_torch(pid: int) -> tuple[str | None, str | None]:
    """(version, package dir) of the torch a process has mapped, from /proc/PID/maps and torch/version.py."""
    maps = procfs.read_text(pid, "maps")
    if maps is None:
        return None, None
    m = re.search(r"(/\S+/torch)/lib/lib(?:torch|c10)\w*\.so", maps)
    if not m:
        return None, None
    pkg = m.group(1)
    text = _read(Path(pkg) / "version.py") or ""
    v = re.search(r"^__version__\s*(?::\s*\w+\s*)?=\s*['\"]([^'\"]+)", text, re.MULTILINE)
    return (v.group(1) if v else None), pkg


def _python_of(pid: int, cmdline: list[str]) -> str | None:
    """The interpreter to ask about torch: the rank's argv[0] when it is a python path (keeps the venv), else exe."""
    if (
        cmdline
        and cmdline[0].startswith("/")
        and "python" in Path(cmdline[0]).name
        and os.access(cmdline[0], os.X_OK)
    ):
        return cmdline[0]
    return procfs.read_exe(pid)


def find_ranks(pid: int) -> Job:
    """The job of ``pid``, with the ranks of other launchers on this host that joined the same rendezvous.

    Several torchrun agents on one host (``--nnodes=2 --node_rank=0/1`` on localhost, or several containers
    sharing a PID namespace) each own a part of one job; their environments must be compared together.
    """
    job = find_job(pid)
    if not job.missing_ranks or job.master_port is None:
        return job
    try:
        others = [
            j for j in list_jobs().jobs if j.job_id == job.job_id and j.launcher_pid != job.launcher_pid
        ]
    except RankscopeError:
        return job
    have = {r.rank for r in job.ranks}
    extra = [r for j in others for r in j.ranks if r.rank is not None and r.rank not in have]
    if not extra:
        return job
    ranks = sorted([*job.ranks, *extra], key=lambda r: (r.rank is None, r.rank or 0))
    found = {r.rank for r in ranks}
    return job.model_copy(
        update={
            "ranks": ranks,
            "missing_ranks": [r for r in job.missing_ranks if r not in found],
            "notes": [
                *job.notes,
                f"ranks {sorted(r.rank for r in extra if r.rank is not None)} come from other launchers "
                f"on this host in the same rendezvous ({job.master_addr}:{job.master_port})",
            ],
        }
    )


def rank_envs(job: Job, redactor: Redactor) -> tuple[list[RankEnv], list[str]]:
    """Per-rank distributed environment, interpreter, torch version, limits and children."""
    errors: list[str] = []
    raw: dict[int, dict[str, str]] = {}
    for rp in job.ranks:
        try:
            raw[rp.pid] = procfs.environ(rp.pid)
        except OSError as exc:
            errors.append(
                f"rank {rp.rank} (pid {rp.pid}): cannot read /proc/{rp.pid}/environ: {exc.strerror or exc}"
            )
    for known in raw.values():  # learn every secret before redacting anything
        redactor.learn_env(known)
    kids = children_map()
    out: list[RankEnv] = []
    for rp in job.ranks:
        env = raw.get(rp.pid)
        cmd = rp.cmdline
        with contextlib.suppress(OSError):
            cmd = procfs.cmdline(rp.pid)
        version, pkg = loaded_torch(rp.pid)
        limits_text = procfs.read_text(rp.pid, "limits")
        re_ = RankEnv(
            rank=rp.rank,
            local_rank=rp.local_rank,
            pid=rp.pid,
            host=rp.host,
            python=_python_of(rp.pid, cmd),
            torch_version=version,
            torch_path=pkg,
            env={k: redactor.value(k, v) for k, v in sorted((env or {}).items()) if is_dist_var(k)},
            limits=parse_limits(limits_text) if limits_text else None,
            children=len(kids.get(rp.pid, [])) or len(rp.children),
            backend=rp.backend,
            error=None if env is not None else "environment not readable (run as the job's user or root)",
        )
        if re_.local_rank is None and re_.env.get("LOCAL_RANK", "").isdigit():
            re_.local_rank = int(re_.env["LOCAL_RANK"])
        out.append(re_)
    return out, errors


def collect_env(pid: int | None = None, *, include_torch: bool = True) -> EnvReport:
    """Node facts, and with ``pid`` each rank's environment, the cross-rank diff and findings (MCP ``collect_env``)."""
    redactor = Redactor()
    job: Job | None = None
    ranks: list[RankEnv] = []
    errors: list[str] = []
    check_pid(pid)
    if pid is not None:
        with procfs.reading_once():  # discovery and rank_envs read the same environ, cmdline, maps, exe
            job = find_ranks(pid)
            ranks, errors = rank_envs(job, redactor)
        job = job.model_copy(
            update={
                "ranks": [rp.model_copy(update={"cmdline": redactor.argv(rp.cmdline)}) for rp in job.ranks]
            }
        )
    else:
        env = dict(os.environ)
        redactor.learn_env(env)
        ranks = [
            RankEnv(
                rank=int(env["RANK"]) if env.get("RANK", "").isdigit() else None,
                pid=os.getpid(),
                host=socket.gethostname(),
                python=sys.executable,
                env={k: redactor.value(k, v) for k, v in sorted(env.items()) if is_dist_var(k)},
                limits=_own_limits(),
            )
        ]
    python = next((r.python for r in ranks if r.python and pid is not None), None)
    try:
        node = node_info(redactor, python=python, include_torch=include_torch)
    except RankscopeError:
        raise
    diffs, findings = check_env(node, ranks, live=pid is not None)
    return EnvReport(node=node, job=job, ranks=ranks, differences=diffs, findings=findings, errors=errors)
