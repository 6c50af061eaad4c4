"""Write bytecode once for what the suite's processes import from torch and its dependencies.

pip installs with --no-compile: compiling every file of torch, sympy and the rest takes about half of
pip's time, and most of those files are never imported. Importing what the suite's ranks, launchers
and tools import writes bytecode for exactly those modules, once. Run it with PYTHONDONTWRITEBYTECODE
unset: where the tests run with it set, a module left out here is compiled again by every process
that imports it (slower, never wrong).
"""

from __future__ import annotations

import importlib
import sys

MODULES = (
    # what torchrun, the ranks and the repro templates import, and what they import later while running;
    # the smaller packages are compiled whole by .ci/setup
    "torch",
    "torch.distributed.run",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
    "torch.distributed.elastic.control_plane",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.debug",
    "torch.distributed.device_mesh",
    "torch.distributed.flight_recorder.components.types",
    "torch.distributed.fsdp",
    "torch.distributed.optim",
    "torch.distributed.pipelining",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed._functional_collectives",
    "torch.multiprocessing",
    "torch.nn.parallel",
    "torch.optim",
    "torch.utils.data",
    "torch.cuda.nccl",
    "numpy",
    "torch.distributed.checkpoint._fsspec_filesystem",
    "torch.backends.xnnpack",
    "torch.profiler",
    "torch.utils.serialization",
)


def main() -> int:
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a module another torch release lacks costs time, not correctness
            missing.append(f"{name} ({type(exc).__name__})")
    if missing:
        print(f"warm_bytecode: not imported: {', '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
