"""What a launcher was told: torchrun's arguments and environment, read as torchrun reads them.

A job that never started is most often one node launched with another value: another
``--master_port``, ``--nnodes``, ``--rdzv_id``. Comparing the launchers across nodes needs each
one's effective settings, with torchrun's own defaults filled in (a node that left out
``--master_port`` uses 29500) and its ``PET_*`` environment variables, which stand for any argument
not given. Pure: the command line and the environment come in, the settings go out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

TORCHRUN_WORDS = frozenset({"torchrun", "torch.distributed.run", "torch.distributed.launch"})
"""The command words of torchrun's agent (the script, ``python -m``, the legacy launcher)."""

MPI_WORDS = frozenset({"mpirun", "mpiexec", "orterun", "prterun"})

SETTINGS = ("nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port")
RDZV = ("rdzv_backend", "rdzv_endpoint", "rdzv_id")

DEFAULTS = {
    "nnodes": "1",
    "nproc_per_node": "1",
    "node_rank": "0",
    "master_addr": "127.0.0.1",
    "master_port": "29500",
    "rdzv_backend": "static",
    "rdzv_endpoint": "",
    "rdzv_id": "none",
}
"""torchrun's defaults (torch/distributed/run.py) for the settings compared across nodes."""

_FLAGS = frozenset({"standalone", "no_python", "run_path", "module", "m"})
"""torchrun options that take no value."""

C10D_PORT = "29400"
"""The port of a c10d rendezvous endpoint given without one."""


def launcher_kind(argv: Sequence[str]) -> str | None:
    """``torchrun`` or ``mpirun`` when ``argv`` is that launcher's own command line, else None."""
    head = [os.path.basename(w) for w in argv[:3]]
    if any(w in TORCHRUN_WORDS for w in head):
        return "torchrun"
    if head and head[0] in MPI_WORDS:
        return "mpirun"
    return None


def _torchrun_options(argv: Sequence[str]) -> dict[str, str]:
    """The ``--name value`` / ``--name=value`` options before the script, names with ``_``."""
    words = list(argv)
    start = next(
        (i + 1 for i, w in enumerate(words[:3]) if os.path.basename(w) in TORCHRUN_WORDS), len(words)
    )
    out: dict[str, str] = {}
    i = start
    while i < len(words):
        word = words[i]
        if not word.startswith("-"):
            break  # the training script: what follows is its own
        name, eq, value = word.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if eq:
            out[name] = value
        elif name in _FLAGS:
            out[name] = "true"
        elif i + 1 < len(words):
            out[name] = words[i + 1]
            i += 1
        i += 1
    return out


def torchrun_settings(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The settings compared across nodes, as torchrun uses them: its arguments, else ``PET_*``,
    else its defaults; ``store`` is the address the agents meet at (``master_addr:master_port``
    for a static rendezvous, the rdzv endpoint otherwise)."""
    given = _torchrun_options(argv)
    out: dict[str, str] = {}
    for name in (*SETTINGS, *RDZV):
        value = given.get(name, env.get(f"PET_{name.upper()}"))
        out[name] = value if value is not None else DEFAULTS[name]
    if given.get("standalone") == "true":
        out.update(rdzv_backend="c10d", rdzv_endpoint="localhost:0", nnodes="1")
    if out["rdzv_backend"] == "static":
        out["store"] = f"{out['master_addr']}:{out['master_port']}"
        out["rdzv_endpoint"] = ""
    else:
        endpoint = out["rdzv_endpoint"] or "localhost"
        out["store"] = endpoint if ":" in endpoint else f"{endpoint}:{C10D_PORT}"
        out.pop("master_addr")
        out.pop("master_port")
        out.pop("node_rank")  # assigned by the rendezvous
    world = max_nodes(out["nnodes"]) * int(out["nproc_per_node"]) if out["nproc_per_node"].isdigit() else None
    if world is not None:
        out["world_size"] = str(world)
    return {k: v for k, v in out.items() if v != ""}


def max_nodes(nnodes: str) -> int:
    """The most nodes ``--nnodes`` allows (``2`` or ``1:4``); 1 when unreadable."""
    last = nnodes.rpartition(":")[2]
    return int(last) if last.isdigit() else 1


def env_settings(env: Mapping[str, str]) -> dict[str, str]:
    """What a rank started without torchrun was told: the store (MASTER_ADDR:MASTER_PORT) and its
    world size, as ``init_process_group(init_method='env://')`` reads them."""
    out = {
        "master_addr": env.get("MASTER_ADDR", ""),
        "master_port": env.get("MASTER_PORT", ""),
        "world_size": env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", env.get("SLURM_NTASKS", ""))),
    }
    if out["master_addr"] and out["master_port"]:
        out["store"] = f"{out['master_addr']}:{out['master_port']}"
    return {k: v for k, v in out.items() if v}


def store_address(settings: Mapping[str, str]) -> tuple[str, int] | None:
    """(host, port) of the store the settings name, or None."""
    host, _, port = settings.get("store", "").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


__all__ = [
    "MPI_WORDS",
    "TORCHRUN_WORDS",
    "env_settings",
    "launcher_kind",
    "max_nodes",
    "store_address",
    "torchrun_settings",
]
