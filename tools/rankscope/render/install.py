"""Lines for a person: the text view of `rankscope install` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.install import InstallReport


def render_install(report: InstallReport) -> Iterator[str]:
    counts: dict[str, int] = {}
    for f in report.files:
        counts[f.action] = counts.get(f.action, 0) + 1
    summary = ", ".join(f"{n} {action}" for action, n in sorted(counts.items()))
    state = "installed" if report.changed else "already up to date"
    yield f"rankscope skill {report.version} {state} in {report.directory} ({summary})"
    for f in report.files:
        if f.action != "unchanged":
            yield f"  {f.action:<11} {f.path}"
    for note in report.notes:
        yield f"note: {note}"
