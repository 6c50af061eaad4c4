"""What redaction costs on a 64-rank ``--locals`` dump, beside the work it rides along with.

Side by side in one run, on the locals of a real captured dump (tests/data/stacks/*_locals.json)
repeated to 64 ranks:

* ``parse``: ``pyspy.parse_dump`` of the 64 ranks' JSON (what every dump pays anyway);
* ``redact``: the redactor over every local's repr, every frame's file, every argv word;
* ``redact-names-only``: the same strings through a name-and-value pass alone (the floor).

The target: redaction under half the parse time, so a 64-rank ``--locals`` dump is not
noticeably slower for it. Usage: ``python benchmarks/bench_redact.py [--ranks 64] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from rankscope.analysis.redact import MASK, Redactor, is_secret_name
from rankscope.runtime.pyspy import parse_dump

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "stacks"


def _dumps(ranks: int) -> list[list[dict[str, Any]]]:
    raws = [json.loads(p.read_text()) for p in sorted(DATA.glob("*_locals.json"))]
    per_rank = [r["pyspy"] for raw in raws for r in raw["ranks"] if r["pyspy"]]
    return [per_rank[i % len(per_rank)] for i in range(ranks)]


def _strings(dumps: list[list[dict[str, Any]]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for dump in dumps:
        for thread in dump:
            for frame in thread["frames"]:
                out.append(("file", frame["filename"]))
                out.extend((v["name"], v.get("repr") or "") for v in frame.get("locals") or ())
    return out


def _names_only(strings: list[tuple[str, str]], known: set[str]) -> None:
    for name, value in strings:
        if is_secret_name(name):
            continue
        for k in known:
            if k in value:
                value = value.replace(k, MASK)


def _time(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "redact.md"))
    a = p.parse_args()
    dumps = _dumps(a.ranks)
    strings = _strings(dumps)
    known = {"hf_abcdefghijklmnopqrstuvwxyz", "s3cr3t-value-123"}
    parse = _time(lambda: [parse_dump(d, 1) for d in dumps], a.repeats)

    def redact() -> None:
        r = Redactor().learn_values(known)
        for name, value in strings:
            r.value(name, value)

    full = _time(redact, a.repeats)
    floor = _time(lambda: _names_only(strings, known), a.repeats)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if os.path.exists("/proc/loadavg") else "?"
    table = (
        f"# Redaction on a {a.ranks}-rank --locals dump\n\n"
        f"{len(strings)} strings (locals' reprs and frame files), best of {a.repeats}; load {load}.\n\n"
        "| pass | time | vs parse |\n|---|---|---|\n"
        f"| parse_dump (baseline) | {parse * 1000:.1f} ms | 1.00x |\n"
        f"| redact (names, values, structure) | {full * 1000:.1f} ms | {full / parse:.2f}x |\n"
        f"| names and known values only (floor) | {floor * 1000:.1f} ms | {floor / parse:.2f}x |\n"
    )
    Path(a.out).write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
