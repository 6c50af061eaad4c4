"""What a model reads: every answer compact, bounded, verdict first, and nothing lost unsaid.

The bounds are the issue's: 4 KB (text block and structured content each) for a job of up to
16 ranks, 8 KB at any scale and for any input; ``full=true`` gives everything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from mcp import Client

from rankscope.analysis.hang.stacks import analyze
from rankscope.analysis.sizing.bound import bound_report
from rankscope.analysis.sizing.fit import fit, size_of
from rankscope.mcp_server import build_server
from rankscope.models.compact import compact
from rankscope.models.core import (
    Finding,
    Frame,
    Job,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
    ThreadStack,
)
from rankscope.models.logs import TriageReport
from rankscope.render.answer import shape_answer
from tests.paths import DATA
from tests.unit.test_stacks_analysis import report_for

CASES = sorted(p.stem for p in (DATA / "stacks").glob("*.json"))
SMALL, ANY = 4_096, 8_000


@pytest.mark.parametrize("case", CASES)
def test_a_captured_hang_answers_in_4_kb_verdict_first(case: str) -> None:
    report = report_for(case)
    assert len(report.stacks) <= 16
    text, data = shape_answer(bound_report(report))
    assert size_of(data) <= SMALL, (case, size_of(data))
    assert len(text.encode()) <= SMALL, (case, len(text))
    assert next(iter(data)) == "verdict" and text.startswith(f"verdict: {report.verdict.kind}")
    assert StacksReport.model_validate(data).verdict == report.verdict  # a valid reading of the model
    assert '"native": false' not in json.dumps(data)  # defaults say nothing


def test_compact_drops_only_empty_defaults_and_reads_back_equal() -> None:
    report = report_for("mismatch_barrier")
    data = compact(report)
    assert StacksReport.model_validate(data) == report
    assert data["verdict"]["confidence"] == report.verdict.confidence
    assert all("native" not in f for g in data["groups"] for f in g["frames"] if not f.get("native"))
    assert size_of(data) < len(report.model_dump_json())


def _wide_job(world: int) -> StacksReport:
    """``world`` ranks, each stuck at its own line with a long stack and a capture error: the worst
    case for a bounded answer (no two ranks group together)."""
    procs, stacks, errors = [], [], []
    for rank in range(world):
        frames = [
            Frame(
                function=f"layer_{rank}_{depth}", file=f"/srv/train/model/block_{depth}.py", line=rank + depth
            )
            for depth in range(40)
        ]
        procs.append(
            RankProcess(rank=rank, pid=10_000 + rank, host=f"node{rank // 8}", cmdline=["python"] * 30)
        )
        stacks.append(
            RankStack(
                rank=rank,
                pid=10_000 + rank,
                host=f"node{rank // 8}",
                threads=[ThreadStack(thread_id=1, name="MainThread", is_main=True, frames=frames)],
            )
        )
        errors.append(RankError(rank=rank, kind="timeout", message="py-spy timed out " * 20, fix="retry"))
    job = Job(job_id="torchrun:x", world_size=world, ranks=procs)
    return analyze(job, stacks, errors)


@pytest.mark.parametrize("world", [16, 1024])
def test_any_scale_stays_under_8_kb_and_says_what_it_left_out(world: int) -> None:
    full = _wide_job(world)
    text, data = shape_answer(bound_report(full))
    assert size_of(data) <= ANY and len(text.encode()) <= ANY
    said = json.dumps(data.get("left_out", [])) + str(data.get("hint"))
    assert "full" in said  # the argument that brings the rest
    assert "left out:" in text
    _whole_text, whole = shape_answer(full, full=True)
    assert size_of(whole) > ANY and len(whole["stacks"]) == world


def test_a_huge_triage_is_cut_with_counts() -> None:
    findings = [
        Finding(kind="collective_timeout", ranks=[i], message=f"rank {i} timed out", excerpt="x" * 2_000)
        for i in range(5_000)
    ]
    report = TriageReport(findings=findings, summary="5000 timeouts")
    text, data = shape_answer(report)
    assert size_of(data) <= ANY and len(text.encode()) <= ANY
    assert any("findings: first" in line and "of 5000 kept" in line for line in data["left_out"])
    assert TriageReport.model_validate(data).summary == "5000 timeouts"


def test_fit_leaves_a_small_answer_alone_and_cuts_strings_last_to_a_readable_length() -> None:
    small = {"summary": "ok", "items": [1, 2, 3]}
    assert fit(dict(small), 1_000, "x") == small
    big = fit({"summary": "s" * 50_000}, 2_000, "pass full=true")
    assert size_of(big) <= 2_000 and big["summary"].endswith("characters cut]")
    assert big["left_out"][-1] == "pass full=true"


# -- over MCP ---------------------------------------------------------------------------------


def _session(calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    async def go() -> tuple[Any, list[Any]]:
        async with Client(build_server()) as client:
            tools = await client.list_tools()
            return tools, [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(go)


def test_dump_stacks_then_generate_repro_from_the_last_answer(tmp_path: Any) -> None:
    saved = str(DATA / "stacks" / "files" / "pyspy_json")
    out = tmp_path / "repro.py"
    out.write_text("# the user's own file\n")
    _, (stacks, refused, written, inline, nothing) = _session(
        [
            ("dump_stacks", {"from_paths": [saved]}),
            ("generate_repro", {"from_last_stacks": True, "out": str(out)}),
            ("generate_repro", {"from_last_stacks": True, "out": str(out), "overwrite": True}),
            ("generate_repro", {"report": {"verdict": {"kind": "x"}}}),
            ("generate_repro", {}),
        ]
    )
    assert not stacks.is_error
    text = stacks.content[0].text
    assert text.startswith("verdict: ") and len(text) <= SMALL
    assert "generate_repro(from_last_stacks=true)" in text  # the next call, written out
    assert size_of(stacks.structured_content) <= SMALL
    assert refused.is_error and "overwrite=true" in refused.content[0].text
    assert not written.is_error and "the user's own file" not in out.read_text()
    assert inline.is_error and "Fix:" in inline.content[0].text
    assert nothing.is_error and "exactly one" in nothing.content[0].text


def test_generate_repro_takes_the_structured_answer_inline() -> None:
    saved = str(DATA / "stacks" / "files" / "pyspy_json")
    _, (stacks,) = _session([("dump_stacks", {"from_paths": [saved]})])
    _, (rendered,) = _session([("generate_repro", {"report": stacks.structured_content})])
    assert not rendered.is_error, rendered.content
    assert rendered.structured_content["template"] and "script:" in rendered.content[0].text


def test_every_parameter_is_described_and_tools_list_stays_small() -> None:
    tools, _ = _session([])
    for tool in tools.tools:
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
        assert "full" in tool.input_schema["properties"], tool.name
    by_name = {t.name: t for t in tools.tools}
    ann = by_name["generate_repro"].annotations
    assert ann is not None and ann.read_only_hint is False and ann.destructive_hint is True
    listed = json.dumps([t.model_dump(mode="json", exclude_none=True) for t in tools.tools])
    # 139 KB with the schemas pydantic writes; 92.2 KB without their titles, the output's field
    # descriptions and the output's defaults (the watch's three tools, start, list and read, are 9 KB)
    assert len(listed) < 94_000, len(listed)


def test_answers_validate_against_the_slimmed_output_schemas() -> None:
    saved = str(DATA / "stacks" / "files" / "pyspy_json")
    tools, (stacks, triage) = _session(
        [
            ("dump_stacks", {"from_paths": [saved]}),
            ("triage_logs", {"paths": [str(DATA / "logs" / "nccl_watchdog_lagging_rank.log")]}),
        ]
    )
    by_name = {t.name: t for t in tools.tools}
    jsonschema.validate(stacks.structured_content, by_name["dump_stacks"].output_schema)
    jsonschema.validate(triage.structured_content, by_name["triage_logs"].output_schema)
    schema = json.dumps(by_name["dump_stacks"].output_schema)
    assert '"title"' not in schema.replace('"title": {', "")


@pytest.mark.parametrize(
    "case", sorted(p.name for p in (DATA / "flight").iterdir() if p.is_dir() and p.name != "__pycache__")
)
def test_flight_recorder_answers_in_4_kb_without_repeats(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rankscope import api
    from rankscope.analysis.sizing.bound import bound_flight

    monkeypatch.chdir(DATA / "flight")  # the dumps' paths as a user in that folder gives them: the
    report = api.analyze_flight_recorder([case])  # size does not depend on where the checkout is
    bounded = bound_flight(report)
    text, data = shape_answer(bounded)
    assert size_of(data) <= SMALL and len(text.encode()) <= SMALL, (case, size_of(data), len(text))
    assert bounded.verdict == report.verdict
    assert all(g.first_mismatch != report.first_mismatch for g in bounded.process_groups if g.first_mismatch)
    if report.first_mismatch is not None and bounded.first_mismatch is not None:
        suspects = set(report.first_mismatch.suspect_ranks) & {e.rank for e in report.first_mismatch.entries}
        kept = {e.rank for e in bounded.first_mismatch.entries}
        assert suspects <= kept  # the culprit's record is never the one folded away


def test_ten_thousand_dumps_answer_in_8_kb() -> None:
    from rankscope.models.flight import FlightReport, FrDump

    dumps = [FrDump(path=f"/fr/dump_{r}", rank=r, format="pickle", entries=2_000) for r in range(10_000)]
    report = FlightReport(
        dumps=dumps,
        ranks=list(range(10_000)),
        verdict={"kind": "inconclusive", "summary": "s"},  # type: ignore[arg-type]
    )
    text, data = shape_answer(report)
    assert size_of(data) <= ANY and len(text.encode()) <= ANY
    assert any("dumps: first" in x and "of 10000 kept" in x for x in data["left_out"])


def test_wrong_arguments_get_one_line_naming_the_parameter_and_the_fix() -> None:
    _, (bad_type, bad_list, unknown) = _session(
        [
            ("dump_stacks", {"timeout": "abc"}),
            ("dump_stacks", {"full_ranks": 3}),
            ("dump_stacks", {"rank": [1]}),
        ]
    )
    for res in (bad_type, bad_list, unknown):
        text = res.content[0].text
        assert res.is_error and "\n" not in text and "errors.pydantic.dev" not in text and "Fix:" in text
    assert "timeout should be a valid number" in bad_type.content[0].text
    assert "Seconds per rank" in bad_type.content[0].text  # what the parameter takes
    assert "full_ranks should be a valid list (got 3)" in bad_list.content[0].text
    assert "rank is not a parameter of dump_stacks" in unknown.content[0].text
    assert "ranks" in unknown.content[0].text


def test_a_huge_log_answers_in_8_kb(tmp_path: Any) -> None:
    """64 ranks' logs, 12 MB in all, every rank failing in its own way: triage over MCP stays bounded."""
    lines = []
    for i in range(60_000):
        rank = i % 64
        lines.append(
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={i}, OpType=ALLREDUCE, NumelIn={i}, NumelOut={i}, Timeout(ms)=600000) "
            f"ran for {600000 + i} milliseconds before timing out."
        )
        lines.append(f"[rank{rank}]: some progress line {i} " + "x" * 60)
    log = tmp_path / "big.log"
    log.write_text("\n".join(lines) + "\n")
    assert log.stat().st_size > 10_000_000
    _, (res,) = _session([("triage_logs", {"paths": [str(log)]})])
    assert not res.is_error, res.content
    assert size_of(res.structured_content) <= ANY and len(res.content[0].text.encode()) <= ANY
    assert res.content[0].text and res.structured_content["findings"]


_SEVERAL_JOBS = ("h200", "watchdog")
"""Folders of tests/data/logs that hold one job per file."""


@pytest.mark.parametrize(
    "log",
    sorted(
        [
            p.name
            for p in (DATA / "logs").iterdir()
            if p.name not in ("README.md", "garbage.bin", *_SEVERAL_JOBS)
        ]
        + [
            f"{d}/{p.name}"
            for d in _SEVERAL_JOBS
            if (DATA / "logs" / d).is_dir()
            for p in (DATA / "logs" / d).iterdir()
        ]
    ),
)
def test_triage_of_one_jobs_logs_answers_in_4_kb_and_keeps_the_conclusion(log: str) -> None:
    from rankscope import api
    from rankscope.analysis.sizing.bound import bound_triage

    full = api.triage_logs([str(DATA / "logs" / log)])
    bounded = bound_triage(full)
    text, data = shape_answer(bounded)
    assert size_of(data) <= SMALL and len(text.encode()) <= SMALL, (log, size_of(data), len(text))
    assert bounded.suspect_ranks == full.suspect_ranks and bounded.summary == full.summary
    shown = {f.kind for f in bounded.findings}
    if full.blocking_calls:  # the summary tells the silent rank's story: one timeout stays as evidence
        assert "collective_timeout" in shown and any("launcher's findings" in x for x in bounded.left_out)
    else:
        assert shown == {f.kind for f in full.findings}  # every kind still shown
    suspects = set(full.suspect_ranks)
    for kind in {f.kind for f in full.findings if set(f.ranks) & suspects and f.severity != "info"} & shown:
        assert any(f.explanation for f in bounded.findings if f.kind == kind), kind  # explained once


def test_a_triage_answer_is_as_long_wherever_the_logs_are(tmp_path: Path) -> None:
    """The sources are named relative to the folder triaged: a deeper checkout costs no byte."""
    from rankscope import api
    from rankscope.analysis.sizing.bound import bound_triage

    sizes = set()
    for folder in (tmp_path / "a", tmp_path / ("deeper-" * 20) / "rankscope" / "logs"):
        shutil.copytree(DATA / "logs" / "watchdog", folder)
        text, data = shape_answer(bound_triage(api.triage_logs([str(folder)])))
        assert str(folder) not in text and str(folder) not in json.dumps(data)
        sizes.add((size_of(data), len(text.encode())))
    assert len(sizes) == 1, sizes
    one = bound_triage(api.triage_logs([str(folder / "torch211_skipped_step.log")]))
    assert [s.path for s in one.sources] == ["torch211_skipped_step.log"]


def test_sixteen_ranks_environment_once_with_what_differs() -> None:
    from rankscope import api
    from rankscope.analysis.sizing.bound import bound_env
    from rankscope.models.env import EnvDifference, RankEnv

    node = api.collect_env(None, include_torch=False)
    common = {f"NCCL_VAR_{i}": f"value-{i}" for i in range(40)}
    ranks = [
        RankEnv(
            rank=r, pid=1000 + r, host="h", python="/usr/bin/python3", env={**common, "LOCAL_RANK": str(r)}
        )
        for r in range(16)
    ]
    diff = EnvDifference(name="LOCAL_RANK", values={str(r): str(r) for r in range(16)}, must_match=False)
    report = node.model_copy(update={"ranks": ranks, "differences": [diff]})
    bounded = bound_env(report)
    text, data = shape_answer(bounded)
    assert size_of(data) <= SMALL and len(text.encode()) <= SMALL, (size_of(data), len(text))
    assert bounded.ranks[0].env == ranks[0].env and all(not r.env for r in bounded.ranks[1:])
    assert any("differences" in x for x in bounded.left_out)


def test_the_brief_text_says_each_fact_once() -> None:
    """Evidence the summary already quotes, the label of a collective wait on an op line, the frames
    the header names: none of them is said twice."""
    report = report_for("mismatch_barrier")
    text, _ = shape_answer(bound_report(report))
    lines = text.splitlines()
    summary = lines[1]
    evidence = [line[2:] for line in lines if line.startswith("- ")]
    assert evidence, text
    assert not any(e.split(" [", 1)[0] in summary for e in evidence if len(e) > 20), text
    assert not any("[collective]" in line for line in lines if " at " in line and "no collective" not in line)
    for group in bound_report(report).groups:
        assert group.call_site is not None
        site = f"({group.call_site.file.rsplit('/', 1)[-1]}:{group.call_site.line})"
        assert not any(line.startswith("   from") and site in line.split(" < ")[0] for line in lines), text


def test_the_brief_text_spells_a_path_a_section_and_a_launcher_once() -> None:
    """A file's full path on its first group line only; a playbook section on the first step that
    points into it; the launcher not again when the job id starts with it; no `<module>` frame."""
    report = report_for("mismatch_barrier")
    text, _ = shape_answer(bound_report(report))
    lines = text.splitlines()
    paths = {g.call_site.file for g in report.groups if g.call_site is not None}
    for path in paths:
        assert sum(path in line for line in lines) == 1, text
    sections = [line.rsplit(" [", 1)[-1] for line in lines if line.startswith("next ") and line.endswith("]")]
    assert len(sections) == len(set(sections)) >= 1, text
    job = next(line for line in lines if line.startswith("job "))
    assert f"({report.job.launcher})" not in job or not report.job.job_id.startswith(report.job.launcher), job
    assert not any(line.startswith("   from") and "<module>" in line for line in lines), text


@pytest.mark.parametrize(
    ("argv", "answer"),
    [
        (["stacks", "--from", str(DATA / "stacks" / "files" / "pyspy_text")], "stacks"),
        (["triage", str(DATA / "logs" / "watchdog" / "torch211_skipped_step.log")], "triage"),
    ],
)
def test_cli_brief_prints_the_mcp_text_block(
    argv: list[str], answer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent on a shell reads what an agent over MCP reads: `--brief` is the tool's text block."""
    from rankscope import api
    from rankscope.analysis.sizing.bound import bound_triage
    from rankscope.cli import main

    assert main([*argv, "--brief"]) == 0
    printed = capsys.readouterr().out
    if answer == "stacks":
        model: Any = bound_report(api.stacks_from_files([argv[2]]))
    else:
        model = bound_triage(api.triage_logs([argv[1]]))
    assert printed == shape_answer(api.redact_model(model))[0] + "\n"
    assert printed.startswith(("verdict:", "Summary", "Read")), printed[:200]


def test_a_dead_jobs_brief_text_leads_with_the_verdict_and_says_each_fact_once() -> None:
    """The recorder's ranks that agree are one line, the files are named relative to the folder the
    caller gave (never its absolute path again), a finding's message the evidence gave is not
    repeated, and no playbook is named twice."""
    from rankscope import api
    from rankscope.analysis.sizing.bound import bound_triage
    from rankscope.render.triage import render_triage

    report = bound_triage(api.triage_logs([str(DATA / "postmortem" / "gpu_stuck")]))
    text, _ = shape_answer(report)
    lines = text.splitlines()
    assert lines[0].startswith("verdict: From the flight recorder: rank 0's GPU never started")
    assert lines[1] == "suspects: 0; decided by: flight recorder"
    assert lines[2].startswith("read: torchrun.log, fr/s3_rank_0, ") and str(DATA) not in text
    assert "- flight recorder: ranks 1-3: nccl:all_reduce #21 state=started" in lines
    assert not any(line.startswith("read next") for line in lines)
    sections = [line.rsplit("[", 1)[-1] for line in lines if line.startswith("next ")]
    assert sections and report.playbook and f"{report.playbook}]" in sections
    assert len(text) < len("\n".join(render_triage(report)))


def test_whole_stack_groups_that_differ_only_in_native_frames_are_not_listed_again() -> None:
    """With native frames, ranks of one op group split by NCCL/CUDA frames the brief view does not
    show: listed again they would be lines that say nothing new."""
    from rankscope.render.stacks import render_stacks_brief

    report = report_for("mismatch_barrier")
    group = max(report.groups, key=lambda g: len(g.ranks))
    assert len(group.ranks) > 1
    native = Frame(function="ncclDevKernel_AllReduce", file="libnccl.so.2", native=True)
    split = [
        group.model_copy(update={"ranks": group.ranks[:1], "frames": [native, *group.frames]}),
        group.model_copy(update={"ranks": group.ranks[1:]}),
    ]
    lines = list(render_stacks_brief(report.model_copy(update={"stack_groups": split})))
    site = str(group.call_site)
    assert sum(1 for line in lines if site in line and "):" in line) == 1, lines
