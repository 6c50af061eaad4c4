"""Host-memory paths for real: a gloo job with one heavy rank, the in-job probe, no NVIDIA driver."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from rankscope import api
from rankscope.errors import ProcessNotFound
from rankscope.models.memory import MemoryProbeReport
from rankscope.probe import memory_report, record_oom_snapshots
from tests.jobs import JobFactory

MiB = 1024 * 1024


@pytest.mark.slow
def test_heavy_rank_is_flagged_live_and_by_the_probe(jobs: JobFactory, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    job = jobs.torchrun(
        "memory_ranks.py", nproc=2, args=["--heavy-rank", "1", "--extra-mb", "400", "--out", str(out)]
    )
    job.wait_ready(["rank0", "rank1"], timeout=90)

    report = api.inspect_memory(pid=job.pid)
    assert report.mode == "live"
    by_rank = {r.rank: r for r in report.ranks}
    assert sorted(r for r in by_rank if r is not None) == [0, 1] and len(by_rank) == 2
    assert all(r.rss_bytes and r.peak_rss_bytes and r.pss_bytes for r in report.ranks)
    assert by_rank[1].rss_bytes is not None and by_rank[0].rss_bytes is not None
    assert by_rank[1].rss_bytes - by_rank[0].rss_bytes > 300 * MiB
    # the stand-in DataLoader worker is counted apart from the rank itself
    assert all(r.children == 1 and r.children_rss_bytes > 0 for r in report.ranks)
    assert all(r.children_rss_bytes < 100 * MiB for r in report.ranks)
    imb = [f for f in report.findings if f.kind == "rank_memory_imbalance"]
    assert [f.ranks for f in imb] == [[1]]
    assert imb[0].facts["what"] == "host RSS"
    # this machine has no NVIDIA driver: said so, host numbers still there
    assert shutil.which("nvidia-smi") is None
    assert report.gpu_available is False
    assert report.gpu_note is not None and "nvidia-smi not found" in report.gpu_note
    assert all(r.gpu_used_bytes is None for r in report.ranks)

    # the in-job probe: one gather, the same report on every rank
    reports = [
        MemoryProbeReport.model_validate_json((out / f"report-rank{r}.json").read_text()) for r in (0, 1)
    ]
    assert reports[0] == reports[1]
    rep = reports[0]
    assert rep.gathered and rep.world_size == 2
    assert [s.rank for s in rep.ranks] == [0, 1]
    assert all(s.device == "cpu" and s.allocated_bytes is None for s in rep.ranks)
    assert rep.ranks[1].rss_bytes is not None and rep.ranks[0].rss_bytes is not None
    assert rep.ranks[1].rss_bytes - rep.ranks[0].rss_bytes > 300 * MiB
    assert [f.ranks for f in rep.findings if f.kind == "rank_memory_imbalance"] == [[1]]


def test_probe_without_process_group_reports_this_process() -> None:
    rep = memory_report()
    assert rep.gathered is False and rep.world_size == 1
    assert len(rep.ranks) == 1
    assert rep.ranks[0].rss_bytes and rep.ranks[0].peak_rss_bytes
    assert rep.ranks[0].peak_rss_bytes >= rep.ranks[0].rss_bytes


def test_record_oom_snapshots_on_cpu_warns_and_records_nothing(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = record_oom_snapshots(str(tmp_path / "snaps"))
    assert result is None
    assert any(issubclass(w.category, RuntimeWarning) and "needs CUDA" in str(w.message) for w in caught)
    assert not (tmp_path / "snaps").exists()


def test_live_inspect_of_a_gone_process_says_what_to_do() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    with pytest.raises(ProcessNotFound) as info:
        api.inspect_memory(pid=gone.pid)
    assert "rankscope ps" in info.value.render()
