"""Steps and bytes of one agent arm, read from the transcript ``agentrun.sh`` wrote.

    python benchmarks/agent/count.py TRANSCRIPT [TRANSCRIPT ...]

A step is one command the agent ran (file reads included); its bytes are the bytes of the
output the agent read. Prints one line per step and a total per transcript.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_STEP = re.compile(r"^### step \d+: ", flags=re.MULTILINE)


def steps(text: str) -> list[tuple[str, int]]:
    """(command, output bytes) of each step, in order."""
    out = []
    for chunk in _STEP.split(text)[1:]:
        command, _, output = chunk.partition("\n")
        out.append((command, len(output.rstrip("\n").encode())))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv:
        found = steps(Path(path).read_text(encoding="utf-8", errors="replace"))
        for i, (command, size) in enumerate(found, 1):
            print(f"{i:3d} {size:7d}  {command[:110]}")
        print(f"{path}: {len(found)} steps, {sum(s for _, s in found)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
