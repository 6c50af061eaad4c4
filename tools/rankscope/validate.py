"""The checks of one call's arguments taken together, shared by the CLI and the MCP server.

Each option type checks its own values when it is built (:mod:`rankscope.options`); what is
left here is how the arguments of one call fit together. Both faces call these before the
façade, so ``rankscope stacks --hosts X --only-rank 3`` and ``dump_stacks(hosts=[X], ranks=[3])``
fail the same way, with an error that names the argument in both spellings and says what to
pass instead (tests/unit/test_faces_agree.py runs the same bad calls through both).
"""

from __future__ import annotations

from collections.abc import Sequence

from rankscope.errors import InvalidInput
from rankscope.options import LOCAL, StacksTarget, check_pid, check_ranks


def check_stacks_call(
    *,
    pid: int | None,
    ranks: Sequence[int] | None,
    target: StacksTarget = LOCAL,
    full_ranks: Sequence[int] | None = None,
    from_paths: Sequence[str] | None = None,
    last: bool = False,
) -> None:
    """The arguments of one stacks capture (local, on several hosts, from saved files, or the last
    capture again) fit together."""
    check_pid(pid)
    if last and (pid is not None or ranks is not None or target.remote or from_paths is not None):
        raise InvalidInput(
            "last (--last) answers again from the last capture; it cannot be combined with pid, ranks, hosts, "
            "via, job, namespace or from_paths, which ask for a new one.",
            fix="Keep only last=true with full_ranks (CLI: --last --show-rank N), or drop last to capture again.",
        )
    if from_paths is not None:
        if not from_paths:
            raise InvalidInput(
                "from_paths (--from) is empty.", fix="Name the saved stack files or their folder."
            )
        if pid is not None or target.remote or ranks is not None:
            raise InvalidInput(
                "from_paths (--from) reads saved stacks; it cannot be combined with pid, ranks, hosts, via, job "
                "or namespace, which select a live job.",
                fix="Leave the live-job arguments out, or drop --from to inspect the running job.",
            )
    check_ranks("ranks (--only-rank)", ranks)
    check_ranks("full_ranks (--show-rank)", full_ranks, allow_empty=True)
    if target.remote and ranks is not None:
        raise InvalidInput(
            "ranks (--only-rank) selects ranks on this host only; it cannot be combined with hosts, via, job or "
            "namespace.",
            fix="Leave the rank filter out to capture every node, then read the suspects' stacks from the answer "
            "(MCP: full_ranks=[...]).",
        )


def check_repro_call(
    *, verify: bool, out: str | None, nproc: int | None, hang_timeout: float, timeout: float | None = None
) -> None:
    """The arguments of one repro (rendered, and run when ``verify``) fit together, checked before
    anything is written: a script is run only from a file, on at least one rank, with limits."""
    if verify and not out:
        raise InvalidInput(
            "verify (--verify) needs out (--out): the script must be written to disk to run.",
            fix="Pass where to write it, e.g. out='/tmp/repro.py' (CLI: --out repro.py).",
        )
    if nproc is not None and nproc < 1:
        raise InvalidInput(
            f"nproc (--nproc) must be at least 1, got {nproc}.",
            fix="Leave it out for the template's world size, or pass the number of ranks, e.g. 2.",
        )
    if not hang_timeout > 0:
        raise InvalidInput(
            f"hang_timeout (--hang-timeout) must be positive seconds, got {hang_timeout:g}.",
            fix="Pass the seconds of silence that count as a hang, e.g. 15.",
        )
    if timeout is not None and not timeout > 0:
        raise InvalidInput(
            f"timeout (--timeout) must be positive seconds, got {timeout:g}.",
            fix="Pass the seconds the whole run may take, e.g. 120.",
        )
