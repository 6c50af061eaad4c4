"""Option types of the façade: frozen, documented, validated once.

The CLI and the MCP server build these from their own spellings (``--native`` and
``native=True``) and hand them to :mod:`rankscope.api`; the capability shells take them
whole instead of five loose keyword arguments each, so an option added here reaches
every face and every shell without touching ten signatures.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankscope.errors import InvalidInput

MAX_WINDOW_S = 120.0
"""The longest window a caller may ask for: the call must stay an inspection, not a watch."""


@dataclass(frozen=True)
class DumpOptions:
    """How each rank is sampled with py-spy.

    Attributes:
        native: include C/C++ frames (NCCL, gloo, CUDA): what decides whether a rank waits
            for the GPU or in a collective. Slower (about 10x per rank).
        locals: include local variables (redacted). Gives send/recv peers and progress
            counters; may carry secrets, so it is off unless asked.
        nonblocking: sample without pausing the ranks. Safer for latency-sensitive jobs,
            less consistent stacks.
        timeout: seconds per rank before the dump of that rank is abandoned (the others
            are still reported).
        counters: when the first verdict is not sure, read the ranks' progress counters
            (integer locals: step, epoch, i) in one more py-spy pass; every other local is
            dropped. On NCCL they often are the only CPU-side evidence naming the laggard.
        flight_recorder: analyse the flight-recorder dumps the ranks already wrote in this
            run together with the stacks (on NCCL its sequence numbers outrank CPU positions).
        ras: read NCCL RAS's per-rank launch counts too (NCCL >= 2.24). Off by default:
            querying RAS has crashed jobs on NCCL 2.26-2.29 (NVIDIA/nccl#2346).
        window: seconds the job is watched before anyone is named (0: a single look). A job
            that moves in that time (counters, lines of its own code) is never called hung;
            widen it when a step takes longer than the window.
    """

    native: bool = False
    locals: bool = False
    nonblocking: bool = False
    timeout: float = 20.0
    counters: bool = True
    flight_recorder: bool = True
    ras: bool = False
    window: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.window <= MAX_WINDOW_S:
            raise InvalidInput(
                f"window (--window / window_s) must be between 0 and {MAX_WINDOW_S:g} seconds, got {self.window:g}.",
                fix="Pass how long to watch the job, e.g. 1 (the default) or 30 for slow steps; 0 takes one look.",
            )
        if not self.timeout > 0:
            raise InvalidInput(
                f"timeout (--timeout) must be positive, got {self.timeout:g}.",
                fix="Pass a timeout in seconds per rank, e.g. 20.",
            )
