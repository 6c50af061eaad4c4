"""Argument checks shared by the CLI and the MCP server: one call, one verdict, one text.

Both faces validate through these before calling the façade, so ``rankscope stacks
--hosts X --rank 3`` and ``dump_stacks(hosts=[X], ranks=[3])`` fail the same way, with
an error that names the argument in both spellings and says what to pass instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from rankscope.errors import InvalidInput


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


def check_stacks_call(
    *,
    pid: int | None,
    ranks: Sequence[int] | None,
    hosts: Sequence[str] | None,
    remote: bool,
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
        if pid is not None or remote or ranks is not None:
            raise InvalidInput(
                "from_paths (--from) reads saved stacks; it cannot be combined with pid, ranks, hosts, via, job "
                "or namespace, which select a live job.",
                fix="Leave the live-job arguments out, or drop --from to inspect the running job.",
            )
    check_ranks("ranks (--rank)", ranks)
    check_ranks("full_ranks", full_ranks, allow_empty=True)
    if hosts is not None and not hosts:
        raise InvalidInput(
            "hosts (--hosts) is empty.",
            fix="Leave it out for this host, or name the nodes, e.g. node1,node2 or node[01-04].",
        )
    if remote and ranks is not None:
        raise InvalidInput(
            "ranks (--rank) selects ranks on this host only; it cannot be combined with hosts, via, job or "
            "namespace.",
            fix="Leave the rank filter out to capture every node, then read the suspects' stacks from the answer "
            "(MCP: full_ranks=[...]).",
        )
