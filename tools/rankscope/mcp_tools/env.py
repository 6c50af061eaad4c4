"""MCP tool ``collect_env``: the same EnvReport as `rankscope env --json`."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, Full, add_tool, arg, guard, in_thread
from rankscope.models.env import EnvReport


@guard
async def collect_env(
    pid: Annotated[int | None, arg("A rank or launcher pid: also read every rank's environment.")] = None,
    include_torch: Annotated[bool, arg("Import torch here for its versions (CUDA, NCCL); slower.")] = True,
    full: Full = False,
) -> EnvReport:
    """Collect the environment of this node and, given the pid of a rank or launcher of a live job, of every rank: distributed variables (NCCL_*, TORCH_*, MASTER_*, ...; secrets redacted), interpreter and loaded torch version, /dev/shm, ulimits, torch/CUDA/NCCL versions, GPUs (nvidia-smi, topology, Xid errors), network and InfiniBand.

    Returns cross-rank differences and findings with severity and fix
    (env_mismatch, gpu_shared, flight_recorder_off, shm_too_small,
    socket_ifname_missing, ...).
    """
    return api.answer(await in_thread(api.collect_env, pid, include_torch=include_torch), full=full)


def register(server: MCPServer) -> None:
    add_tool(server, collect_env, title="Environment of this node and of every rank", annotations=READ_ONLY)
