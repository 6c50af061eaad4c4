"""Option types: built once by a face, taken whole by every layer below it.

The CLI builds them from its flags (``--native``), the MCP server from its parameters
(``native=True``); from there each object travels whole: the façade, the local capture, the
remote fan-out, the py-spy command line and the command each remote host runs. Nothing below
a face unpacks them into loose keyword arguments, so an option added here reaches every path
without touching ten signatures, and :data:`OPTION_FLAGS` (checked against the fields by
tests/unit/test_options.py) makes sure it also reaches the other hosts.

Each type checks itself when it is built, so a bad value is refused once, in one text that names
the argument in both spellings, whichever face built it. The module is pure (a row of its own in
ARCHITECTURE.md's layer table, under runtime), so runtime/pyspy.py takes the very object a face
built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Literal, get_args

from rankscope.analysis.hostlist import parse_hosts
from rankscope.errors import InvalidInput

MAX_WINDOW_S = 120.0
"""The longest window a caller may ask for: the call must stay an inspection, not a watch."""

DEFAULT_WINDOW_S = 1.0
"""How long a live capture watches the job by default: long enough for a training loop to pass a
few steps, short enough for the first call of an incident."""

DEFAULT_TIMEOUT_S = 20.0
"""Seconds per rank before its dump is abandoned, on this host and on every host of a fan-out."""

REMOTE_SHARE = 0.8
"""The share of the caller's timeout a remote host may use, so its answer arrives before the caller
gives up on it (the rest is ssh's or srun's own start-up)."""


@dataclass(frozen=True)
class DumpOptions:
    """How each rank is sampled with py-spy, and what else a capture reads.

    The field order is the order of the flags each remote host is given (:func:`option_flags`).

    Attributes:
        native: include C/C++ frames (NCCL, gloo, CUDA): what decides whether a rank waits
            for the GPU or in a collective. Slower (about 10x per rank).
        locals: include local variables (redacted). Gives send/recv peers and progress
            counters; may carry secrets, so it is off unless asked.
        nonblocking: sample without pausing the ranks. Safer for latency-sensitive jobs,
            less consistent stacks.
        counters: read the ranks' progress counters (integer locals: step, epoch, i) from the
            window's last look (with no window, in one more py-spy pass); every other local is
            dropped. On NCCL they often are the only CPU-side evidence naming the laggard.
        flight_recorder: analyse the flight-recorder dumps the ranks already wrote in this
            run together with the stacks (on NCCL its sequence numbers outrank CPU positions).
        ras: read NCCL RAS's per-rank launch counts too (NCCL >= 2.24). Off by default:
            querying RAS has crashed jobs on NCCL 2.26-2.29 (NVIDIA/nccl#2346).
        window: seconds the job is watched before anyone is named (0: a single look). A job
            that moves in that time (counters, I/O, lines of its own code) is never called hung,
            except a rank that over 10 s or more only goes round one loop of its own with
            nothing else moving: it is stuck there. Widen it when a step takes longer.
        timeout: seconds per rank before the dump of that rank is abandoned (the others
            are still reported); on several hosts, also how long a host is waited for.
    """

    native: bool = False
    locals: bool = False
    nonblocking: bool = False
    counters: bool = True
    flight_recorder: bool = True
    ras: bool = False
    window: float = DEFAULT_WINDOW_S
    timeout: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 <= self.window <= MAX_WINDOW_S:
            raise InvalidInput(
                f"window (--window / window_s) must be between 0 and {MAX_WINDOW_S:g} seconds, got {self.window:g}.",
                fix="Pass how long to watch the job, e.g. 1 (the default) or 30 for slow steps; 0 takes one look.",
            )
        if not self.timeout > 0:
            raise InvalidInput(
                f"timeout (--timeout) must be positive, got {self.timeout:g}.",
                fix=f"Pass a timeout in seconds per rank, e.g. {DEFAULT_TIMEOUT_S:g}.",
            )

    def for_remote_host(self) -> DumpOptions:
        """The options a remote host runs with: its timeout a share of ours (:data:`REMOTE_SHARE`)."""
        return replace(self, timeout=max(1.0, round(self.timeout * REMOTE_SHARE, 3)))

    @classmethod
    def from_values(cls, source: object) -> DumpOptions:
        """The options read by field name from ``source``'s attributes (the CLI's parsed flags, whose
        destinations are the field names), so a new field cannot be left behind by a face."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})


DEFAULTS = DumpOptions()
"""The options of a call that asks for none."""


OPTION_FLAGS: dict[str, str] = {
    "native": "--native",
    "locals": "--locals",
    "nonblocking": "--nonblocking",
    "counters": "--no-counters",
    "flight_recorder": "--no-fr",
    "ras": "--ras",
    "window": "--window",
    "timeout": "--timeout",
}
"""Each :class:`DumpOptions` field's ``rankscope stacks`` flag: a yes/no field's flag turns its
default around, a number's flag takes the value. Every field has one (a test checks), so every
option reaches the hosts of a fan-out."""


def option_flags(options: DumpOptions) -> list[str]:
    """``options`` as ``rankscope stacks`` flags, in field order: numbers always, yes/no fields
    where they differ from the default."""
    argv: list[str] = []
    for f in fields(DumpOptions):
        flag, value = OPTION_FLAGS[f.name], getattr(options, f.name)
        if isinstance(value, bool):
            if value != f.default:
                argv.append(flag)
        else:
            argv += [flag, _number(value)]
    return argv


def _number(value: float) -> str:
    """A number as a flag's value: short (``24``, not ``24.0``), and read back as the same number."""
    text = f"{value:g}"
    return text if float(text) == value else repr(value)


Via = Literal["ssh", "srun", "kubectl", "debug-server", "local"]
"""How the ranks on other hosts are reached. ``debug-server`` talks HTTP to the ranks' own PyTorch
debug servers (no ssh); ``local`` runs the command on this machine under each host's name
(benchmarks, tests; no face offers it)."""

VIAS: tuple[str, ...] = ("ssh", "srun", "kubectl", "debug-server")
"""The ``via`` values both faces offer."""

FINDS_HOSTS: tuple[str, ...] = ("srun", "kubectl", "debug-server")
"""``via`` values that find the job's hosts themselves (Slurm allocation, the job's pods,
MASTER_ADDR:MASTER_PORT), so they reach several hosts even without ``hosts``."""


@dataclass(frozen=True)
class StacksTarget:
    """Where a capture's ranks are: this host (the default), or several hosts reached through ``via``.

    ``hosts`` is parsed once, here (comma-separated names, Slurm hostlists such as
    ``node[01-04]`` expanded, duplicates dropped), whether it comes as the CLI's one string or
    the MCP list; :attr:`remote` is the one rule that says whether the call leaves this host.

    Attributes:
        hosts: the hosts to collect from (for ``debug-server``: the store's ``ADDR:PORT``).
        via: how they are reached (:data:`Via`).
        job: the Slurm job id (``srun``), the pods' job or label selector (``kubectl``), or the
            store's ``ADDR:PORT`` (``debug-server``).
        namespace: the Kubernetes namespace (``kubectl``).
        rankscope_cmd: how rankscope is run on the other hosts.
    """

    hosts: tuple[str, ...] | None = None
    via: Via = "ssh"
    job: str | None = None
    namespace: str | None = None
    rankscope_cmd: str = "rankscope"

    def __post_init__(self) -> None:
        if self.via not in get_args(Via):
            raise InvalidInput(
                f"via (--via) must be one of {', '.join(VIAS)}, got {self.via!r}.",
                fix="Use ssh with hosts, or srun, kubectl or debug-server, which find the job's hosts themselves.",
            )
        if self.hosts is not None:
            object.__setattr__(self, "hosts", tuple(parse_hosts(_joined(self.hosts))))
        if self.namespace is not None and self.via != "kubectl":
            raise InvalidInput(
                f"namespace (--namespace) is a Kubernetes namespace: it takes via kubectl, got via {self.via}.",
                fix="Add via kubectl (CLI: --via kubectl), or leave the namespace out.",
            )
        if self.job is not None and not self.remote:
            raise InvalidInput(
                "job (--job with --via) names the Slurm job (via srun) or the Kubernetes job (via kubectl), "
                "but this call reaches no other host.",
                fix="Add via srun or kubectl (or hosts); for one of several jobs on this host pass job_id "
                "(CLI: --job without --via).",
            )
        if not self.rankscope_cmd.strip():
            raise InvalidInput(
                "rankscope_cmd (--rankscope-cmd) is empty.",
                fix="Leave it out for `rankscope`, or pass its path on the hosts, e.g. /opt/venv/bin/rankscope.",
            )

    @property
    def remote(self) -> bool:
        """Whether the call collects from other hosts: hosts given, or a ``via`` that finds them."""
        return self.hosts is not None or self.via in FINDS_HOSTS


LOCAL = StacksTarget()
"""This host only."""


def _joined(hosts: str | Sequence[str]) -> str:
    """One ``--hosts`` text (the CLI's is one string, the MCP's a list): a list is joined back
    first, since a caller that split at every comma cut ``node[01-04,07]`` in two; a caller of
    the library that passed the text itself is read as that text."""
    return hosts if isinstance(hosts, str) else ",".join(hosts)


def host_pid(value: int | str) -> tuple[str | None, int]:
    """A pid, or ``HOST:PID``: a launcher or rank on another host (whose job every host then
    inspects). Both faces read it here, the CLI's text and the MCP's number or text alike."""
    if isinstance(value, int):
        return None, value
    host, _, number = value.strip().rpartition(":")
    try:
        return (host or None), int(number)
    except ValueError:
        raise InvalidInput(
            f"pid (--pid) must be a process id or HOST:PID, got {value!r}.",
            fix="Pass a pid from `rankscope ps` (MCP: list_jobs), or HOST:PID for one on another host.",
        ) from None


def check_pid(pid: int | None) -> None:
    """A pid, when given, is a positive process id."""
    if pid is not None and pid <= 0:
        raise InvalidInput(
            f"pid (--pid) must be a positive process id, got {pid}.",
            fix="Run `rankscope ps` (MCP: list_jobs) and pass one of its pids, a rank or its launcher.",
        )


def check_ranks(name: str, ranks: Sequence[int] | None, *, allow_empty: bool = False) -> None:
    """A rank list, when given, holds rank numbers (0 and up), and is non-empty when it filters."""
    if ranks is not None and ((not ranks and not allow_empty) or any(r < 0 for r in ranks)):
        what = "a list of rank numbers" if allow_empty else "a non-empty list of rank numbers"
        raise InvalidInput(
            f"{name} must be {what} (0 and up), got {list(ranks)}.",
            fix="Leave it out for every rank, or pass ranks from a previous answer, e.g. [0, 3].",
        )
