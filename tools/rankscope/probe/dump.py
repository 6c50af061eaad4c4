"""``dump``: write this rank's fingerprints or placement report for offline comparison.

Files are ``<dir>/<kind>-rank<R>.json`` and carry the world size and a job id,
so ``rankscope compare`` / ``rankscope placements`` can tell a complete set
from a mix of two runs. No collective: each rank writes its own file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rankscope.errors import InvalidInput

KINDS = ("fingerprints", "placements")


def dump(
    obj: Any,
    dir: str | os.PathLike[str],
    *,
    kind: str = "fingerprints",
    which: str = "params",
    group: Any = None,
) -> Path:
    """Write this rank's ``kind`` report about ``obj`` to ``dir``; returns the file written."""
    if kind not in KINDS:
        raise InvalidInput(
            f"kind={kind!r} is not one of {', '.join(KINDS)}",
            fix="Pass kind='fingerprints' or kind='placements'.",
        )
    if kind == "fingerprints":
        from rankscope.probe.consistency import local_fingerprints

        report: Any = local_fingerprints(obj, which, group)
    else:
        from rankscope.probe.placement import placement_report

        report = placement_report(obj)
    out_dir = Path(dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-rank{report.rank}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(report.model_dump_json(indent=1))
    os.replace(tmp, path)
    return path
