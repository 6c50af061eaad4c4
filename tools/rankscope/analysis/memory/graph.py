"""Kept forwards: a script line whose kept outputs still hold the activations of their forward.

A forward run with grad enabled saves activations for backward; while its output is alive and
attached to the graph, they stay. In a snapshot that shows as one script line (and caller)
holding blocks at several library lines: one block per kept call at the output's line (the
fewest), and a multiple of that count at the lines where the activations were made. A forward
in flight at the snapshot (one call's activations, its output not made yet) is no multiple of a
kept count, and a script line that keeps one tensor per call at one line has no graph.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

Held = tuple[str, str | None, int, int]
"""What a place holds: (site, script line with its caller, live bytes, live blocks)."""


@dataclass(frozen=True)
class KeptGraph:
    """A script line's kept outputs and the activations kept with them."""

    script: str  # with its caller
    output_site: str
    calls: int  # blocks at the output's line: one per kept call
    graph_bytes: int
    graph_blocks: int
    graph_sites: list[str]  # the activations' lines, the largest first


def kept_graphs(places: Iterable[Held]) -> list[KeptGraph]:
    """The kept forwards among the places, the largest graph first."""
    calls: dict[str, list[tuple[str, int, int]]] = {}
    for site, script, live, blocks in places:
        if script:
            calls.setdefault(script, []).append((site, live, blocks))
    out: list[KeptGraph] = []
    for script, held in calls.items():
        output, _, kept = min(held, key=lambda h: (h[2], h[1]))
        graph = sorted(
            (h for h in held if h[0] != output and h[2] >= kept and h[2] % kept == 0), key=lambda h: -h[1]
        )
        if kept < 2 or not graph:
            continue
        out.append(
            KeptGraph(
                script=script,
                output_site=output,
                calls=kept,
                graph_bytes=sum(h[1] for h in graph),
                graph_blocks=sum(h[2] for h in graph),
                graph_sites=[h[0] for h in graph[:3]],
            )
        )
    return sorted(out, key=lambda g: -g.graph_bytes)
