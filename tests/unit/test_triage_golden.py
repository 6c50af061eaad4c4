"""The triage report of every log capture the tests hold, kept word for word (tests/data/triage_reports.json).

The fixture tests check what each capture is for (its suspect, its kinds); this one holds the whole
answer, every finding's wording, facts, lines and excerpt, the failure records and the summary, so a
refactoring of the log scanner that changes any of it shows up as a diff. A deliberate change
rewrites the file (``RANKSCOPE_REGOLD=1 pytest tests/unit/test_triage_golden.py``) and the diff is
reviewed. Every log folder is also read as one job, so state that crosses files (torchrun's table,
NCCL's pid-to-rank map, tracebacks per source) meets more than one source.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rankscope.capabilities.triage import triage_logs
from tests.golden import check_golden
from tests.paths import DATA, ROOT

GOLDEN = DATA / "triage_reports.json"
LOGS = DATA / "logs"


def _cases() -> list[str]:
    """Every log file and log folder under tests/data/logs, and the torchrun logs of the other captures."""
    logs = sorted(p for p in LOGS.rglob("*") if p.name != "README.md")
    others = [
        DATA / "nccl_uneven" / "torchrun.log",
        *sorted((DATA / "postmortem").glob("*/torchrun.log")),
        DATA / "crash_at_exit" / "torchrun.log",
    ]
    return [str(p.relative_to(ROOT)) for p in [LOGS, *logs, *others]]


def _report(rel: str) -> dict[str, Any]:
    """One capture's report, read from the repository's root by its relative path (so its sources
    are the same in every checkout), its timings left out. Paths inside the captured texts are
    kept as captured: they must not change with where the checkout lives, nor the answer with
    whether the files they name are on this host (the code is not read)."""
    text = triage_logs([rel], read_code=False).model_dump_json()
    report: dict[str, Any] = json.loads(text)
    report["stats"] = {k: v for k, v in report["stats"].items() if k in ("bytes", "lines")}
    return report


def test_every_triage_report_is_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    got = {rel: _report(rel) for rel in _cases()}
    check_golden(GOLDEN, got, "reports")


def test_the_golden_file_covers_every_finding_kind() -> None:
    """A golden file that lost its variety would let a rule change unnoticed."""
    reports = json.loads(GOLDEN.read_text()).values()
    kinds = {f["kind"] for r in reports for f in r["findings"]}
    assert kinds >= {
        "collective_timeout",
        "collective_mismatch",
        "child_failed",
        "killed_by_signal",
        "cuda_oom",
        "cuda_error",
        "device_assert",
        "duplicate_gpu",
        "thread_died",
        "nccl_error",
        "gpu_xid",
        "peer_closed",
        "dataloader_worker_killed",
        "address_in_use",
        "rendezvous_failure",
        "unused_parameters",
    }
