"""The checks of one call's arguments taken together, shared by the CLI and the MCP server.

Each option type checks its own values when it is built (:mod:`rankscope.options`); what is
left here is how the arguments of one call fit together. Both faces call these before the
façade, so ``rankscope stacks --hosts X --rank 3`` and ``dump_stacks(hosts=[X], ranks=[3])``
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
) -> None:
    """The arguments of one stacks capture (local, on several hosts, or from saved files) fit together."""
    check_pid(pid)
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
    check_ranks("ranks (--rank)", ranks)
    check_ranks("full_ranks", full_ranks, allow_empty=True)
    if target.remote and ranks is not None:
        raise InvalidInput(
            "ranks (--rank) selects ranks on this host only; it cannot be combined with hosts, via, job or "
            "namespace.",
            fix="Leave the rank filter out to capture every node, then read the suspects' stacks from the answer "
            "(MCP: full_ranks=[...]).",
        )
