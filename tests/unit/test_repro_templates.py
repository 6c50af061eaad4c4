"""Repro templates as data: every template renders and parses, parameters are bounded, injections are rejected,

The pure tests; the ones that start processes are in tests/integration/test_repro_templates.py.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from rankscope.analysis.templates import choose_from_findings, choose_from_stacks, literal, parse_catalog
from rankscope.capabilities.repro import catalog, list_templates, read_meta, render_repro, repro_from_report
from rankscope.cli import main
from rankscope.errors import InvalidInput
from rankscope.models.core import Finding, StacksReport
from rankscope.models.repro import ParamSpec, TemplateSpec
from rankscope.resources import templates_dir
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "repro"

REQUIRED_CLASSES = {
    "skip_collective",
    "collective_order",
    "send_recv_order",
    "shape_mismatch",
    "uneven_batches",
    "rank_conditional_collective",
    "ddp_unused_params",
    "missing_broadcast",
    "bn_drift",
    "dataloader_worker_crash",
    "port_in_use",
    "unreachable_master",
    "dtensor_placement_mismatch",
    "fsdp2_root_only",
    "cuda_oom_growth",
}

VERDICT_KINDS = {
    "mismatched_collectives",
    "divergent_ranks",
    "missing_ranks",
    "all_in_same_collective",
    "no_collective",
}

FINDING_KINDS = {
    "collective_timeout", "peer_closed", "unused_parameters", "cuda_oom", "killed_by_signal", "dataloader_worker_killed",
    "address_in_use", "rendezvous_failure", "collective_mismatch", "child_failed",
}  # fmt: skip

PROBE_KINDS = {"divergent_tensors", "peak_memory"}

INJECTIONS = [
    '"); import os; os.system("x")#',
    "x'); __import__('os').system('id')#",
    "all_reduce\nimport os",
    "4); import os #",
    "${{ os }}",
    "{{ 7*7 }}",
]

# Companion values tried when an edge value needs others to stay meaningful (a rank < world_size,
# two different ops, a dataset that does not split evenly).
_COMPANIONS: list[dict[str, Any]] = [
    {},
    {"world_size": 8},
    {"batch_size": 1},
    {"batch_size": 1, "world_size": 3},
    {"dataset_size": 2049},
    {"crash_index": 0},
    {"crash_index": 0, "world_size": 2, "dataset_size": 100000},
]


def _spec(name: str) -> TemplateSpec:
    return next(s for s in catalog().templates if s.name == name)


def _edge_values(p: ParamSpec) -> list[Any]:
    if p.type == "bool":
        return [True, False]
    if p.type == "choice":
        return list(p.choices or [])
    if p.type in ("int", "float"):
        assert p.min is not None and p.max is not None, p.name
        conv = int if p.type == "int" else float
        return [conv(p.min), conv(p.max)]
    if p.type == "shape":
        return ["1", "999999x2x3x4"]
    return ["f", "a" * 40]


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def _anchors(markdown: str) -> set[str]:
    import re

    return {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


def test_catalog_covers_every_failure_class_with_a_known_symptom() -> None:
    listed = list_templates()
    names = {t.name for t in listed.templates}
    assert REQUIRED_CLASSES <= names
    for t in listed.templates:
        allowed = {"verdict": VERDICT_KINDS, "finding": FINDING_KINDS, "probe": PROBE_KINDS}[t.symptom_source]
        assert t.symptom in allowed, (t.name, t.symptom)
        assert t.skill_section.startswith("skill/")
        assert (templates_dir() / _spec(t.name).template).is_file()
    assert [t.name for t in listed.templates if t.requires_cuda] == ["cuda_oom_growth"]
    assert listed.exit_codes["skipped"] == 77 and listed.exit_codes["timeout"] == 124


@pytest.mark.parametrize("name", sorted(REQUIRED_CLASSES))
@pytest.mark.parametrize("fixed", [False, True])
def test_every_template_renders_with_defaults_and_parses(name: str, fixed: bool) -> None:
    r = render_repro(name, fixed=fixed)
    tree = ast.parse(r.script)
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"repro", "main", "self_launch", "start_watchdog"} <= funcs
    meta = read_meta(r.script)
    assert meta["template"] == name and meta["fixed"] is fixed and meta["symptom"] == r.symptom
    assert ("FIXED:" in r.script) is fixed
    assert ("BUG:" in r.script) is (not fixed)
    assert f"FIXED = {fixed!r}" in r.script


@pytest.mark.parametrize("name", sorted(REQUIRED_CLASSES))
def test_every_template_renders_at_its_parameter_edges(name: str) -> None:
    spec = _spec(name)
    rendered = 0
    for p in spec.params:
        for value in _edge_values(p):
            ok = False
            for extra in _COMPANIONS:
                params = {
                    k: v for k, v in extra.items() if k in {q.name for q in spec.params} and k != p.name
                }
                params[p.name] = value
                for group in spec.distinct:  # keep grouped choices different
                    if p.name in group:
                        for other in group:
                            if other != p.name:
                                choices = (
                                    _spec(name).params[[q.name for q in spec.params].index(other)].choices
                                    or []
                                )
                                params[other] = next(c for c in choices if c != value)
                try:
                    r = render_repro(name, params, fixed=bool(rendered % 2))
                except InvalidInput:
                    continue
                ast.parse(r.script)
                assert (
                    literal(p, r.params[p.name]) in r.script
                    or p.name in ("backend", "timeout_s")
                    or p.type == "identifier"
                )
                ok = True
                rendered += 1
                break
            assert ok, f"{name}: {p.name}={value!r} renders with no companion values"
    assert rendered >= len(spec.params)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("skip_collective", {"world_size": 1}),
        ("skip_collective", {"world_size": 9}),
        ("skip_collective", {"skip_rank": 2}),  # not below world_size=2
        ("skip_collective", {"op": "all_reduce", "next_op": "all_reduce"}),
        ("shape_mismatch", {"numel": 0}),
        ("shape_mismatch", {"numel": 1.5}),
        ("fsdp2_root_only", {"max_fraction": float("nan")}),
        ("fsdp2_root_only", {"max_fraction": 2.0}),
        ("uneven_batches", {"dataset_size": 8, "batch_size": 2}),  # splits evenly: would not show the bug
        ("dataloader_worker_crash", {"crash_index": 8}),
        ("skip_collective", {"no_such_param": 1}),
    ],
)
def test_out_of_range_and_meaningless_parameters_are_rejected(name: str, params: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as exc:
        render_repro(name, params)
    assert exc.value.fix


@pytest.mark.parametrize("payload", INJECTIONS)
@pytest.mark.parametrize(
    ("name", "param"),
    [
        ("skip_collective", "function_name"),
        ("skip_collective", "op"),
        ("skip_collective", "shape"),
        ("skip_collective", "world_size"),
        ("shape_mismatch", "mismatch"),
        ("fsdp2_root_only", "max_fraction"),
        ("dataloader_worker_crash", "signal"),
        ("missing_broadcast", "backend"),
    ],
)
def test_injection_through_any_parameter_is_rejected(name: str, param: str, payload: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        render_repro(name, {param: payload})
    assert param in exc.value.message


@pytest.mark.parametrize(
    "ident", ["exec", "__import__", "os", "import", "match", "dist", "a-b", "ℌello", "_" * 41, "print"]
)
def test_identifier_parameters_accept_only_plain_unreserved_names(ident: str) -> None:
    with pytest.raises(InvalidInput):
        render_repro("skip_collective", {"function_name": ident})
    r = render_repro("skip_collective", {"function_name": "reduce_loss_v2"})
    assert "def reduce_loss_v2(" in r.script


def test_string_values_from_the_command_line_are_converted_and_bounded() -> None:
    r = render_repro(
        "skip_collective", {"world_size": "4", "skip_rank": "3", "shape": "2x3", "op": "all_gather"}
    )
    assert r.params["world_size"] == 4 and "SHAPE = (2, 3)" in r.script and "OP = 'all_gather'" in r.script
    with pytest.raises(InvalidInput):
        render_repro("skip_collective", {"world_size": "4; import os"})


def test_catalog_defaults_must_satisfy_their_own_specs() -> None:
    data = json.loads((templates_dir() / "catalog.json").read_text())
    data["templates"][0]["params"][0]["default"] = 99  # world_size above its max
    with pytest.raises(InvalidInput):
        parse_catalog(json.dumps(data))


def test_from_report_skipped_collective_names_the_ops_world_size_and_rank(tmp_path: Path) -> None:
    report = StacksReport.model_validate(_load("stacks_skip_collective.json"))
    assert report.verdict.kind == "mismatched_collectives"
    choice = choose_from_stacks(report)
    assert choice.template == "skip_collective"
    assert choice.params["op"] == "all_reduce" and choice.params["next_op"] == "barrier"
    assert choice.params["world_size"] == 2 and choice.params["skip_rank"] == 1
    assert any("skipped the all_reduce" in r for r in choice.reasons)
    r = repro_from_report(str(DATA / "stacks_skip_collective.json"), out=str(tmp_path / "r.py"))
    assert r.template == "skip_collective" and r.reasons == choice.reasons
    assert "OP = 'all_reduce'" in r.script and "NEXT_OP = 'barrier'" in r.script


def test_from_report_collectives_in_different_orders_becomes_a_mismatch_repro() -> None:
    choice = choose_from_stacks(StacksReport.model_validate(_load("stacks_collective_order.json")))
    assert choice.template == "skip_collective"
    assert {choice.params["op"], choice.params["next_op"]} == {"all_reduce", "broadcast"}


def test_from_report_every_rank_in_recv_becomes_a_send_recv_order_repro(tmp_path: Path) -> None:
    # all in the same collective is no program bug, except when the call is a blocking recv
    report = StacksReport.model_validate(_load("stacks_send_recv_order.json"))
    assert report.verdict.kind == "all_in_same_collective" and {g.op for g in report.groups} == {"recv"}
    choice = choose_from_stacks(report)
    assert choice.template == "send_recv_order" and choice.params["world_size"] == 2
    assert any("send/recv ordering deadlock" in r for r in choice.reasons)
    r = repro_from_report(str(DATA / "stacks_send_recv_order.json"), out=str(tmp_path / "r.py"))
    assert "dist.recv(received, src=prev)\n    dist.send(tensor, dst=nxt)" in r.script


def test_from_report_rank_conditional_work_is_divergent_ranks() -> None:
    report = StacksReport.model_validate(_load("stacks_rank_conditional.json"))
    assert report.verdict.kind == "divergent_ranks"
    choice = choose_from_stacks(report)
    assert choice.template == "rank_conditional_collective"
    assert choice.params["busy_rank"] == 0 and choice.params["op"] == "all_gather"


def test_from_report_dtensor_redistribute_hang_picks_the_placement_template() -> None:
    choice = choose_from_stacks(StacksReport.model_validate(_load("stacks_dtensor.json")))
    assert choice.template == "dtensor_placement_mismatch"
    assert choice.params["odd_rank"] == 1


@pytest.mark.parametrize(
    ("report", "template"),
    [
        ("triage_shape_mismatch.json", "shape_mismatch"),
        ("triage_ddp_unused.json", "ddp_unused_params"),
        ("triage_dataloader.json", "dataloader_worker_crash"),
        ("triage_port_in_use.json", "port_in_use"),
    ],
)
def test_from_report_triage_findings_pick_their_template(report: str, template: str) -> None:
    r = repro_from_report(str(DATA / report))
    assert r.template == template
    assert r.reasons and r.reasons[0].startswith("finding ")


def test_from_report_refuses_verdicts_no_program_bug_explains(tmp_path: Path) -> None:
    data = _load("stacks_skip_collective.json")
    data["verdict"]["kind"] = "all_in_same_collective"
    with pytest.raises(InvalidInput) as exc:
        choose_from_stacks(StacksReport.model_validate(data))
    assert "network" in exc.value.fix
    with pytest.raises(InvalidInput):
        choose_from_findings([Finding(kind="gpu_xid", message="Xid 79")])
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(InvalidInput):
        repro_from_report(str(bad))
    bad.write_text('{"hello": 1}')
    with pytest.raises(InvalidInput):
        repro_from_report(str(bad))


def test_cli_list_render_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {t["name"] for t in listed["templates"]} >= REQUIRED_CLASSES
    assert all({"name", "symptom", "requires_cuda"} <= t.keys() for t in listed["templates"])
    out = tmp_path / "repro.py"
    assert (
        main(["repro", "render", "uneven_batches", "--set", "dataset_size=13", "--fixed", "--out", str(out)])
        == 0
    )
    assert "wrote" in capsys.readouterr().out and "DATASET_SIZE = 13" in out.read_text()
    assert main(["repro", "render", "skip_collective", "--set", 'op="); import os#', "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "invalid parameters" in err and "Fix:" in err
    assert main(["repro", "render", "skip_collective", "--set", "nonsense"]) == 2
    assert main(["repro", "render", "skip_collective", "--verify"]) == 2
    report = str(DATA / "stacks_skip_collective.json")
    assert main(["repro", "from-report", report, "--json", "--out", str(out)]) == 2  # out exists
    assert "does not replace a file unless asked" in capsys.readouterr().err
    assert main(["repro", "from-report", report, "--json", "--out", str(out), "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["template"] == "skip_collective"
    assert main(["repro", "verify", str(tmp_path / "nope.py")]) == 2


def test_mcp_tools_render_and_translate_errors(tmp_path: Path) -> None:
    from rankscope.mcp_tools.repro import generate_repro, list_repro_templates

    listed = anyio.run(list_repro_templates)
    assert len(listed.templates) >= len(REQUIRED_CLASSES)
    r = anyio.run(
        lambda: generate_repro(name="bn_drift", params={"steps": 3}, fixed=True, out=str(tmp_path / "b.py"))
    )
    assert r.fixed and Path(r.path or "").is_file()
    r = anyio.run(lambda: generate_repro(from_report=str(DATA / "stacks_rank_conditional.json")))
    assert r.template == "rank_conditional_collective"
    with pytest.raises(ToolError, match="exactly one"):
        anyio.run(lambda: generate_repro())
    with pytest.raises(ToolError, match="Fix"):
        anyio.run(
            lambda: generate_repro(name="skip_collective", params={"function_name": "x(); os.system('x')"})
        )


def test_mcp_server_registers_generate_repro_with_an_output_schema() -> None:
    from rankscope.mcp_server import build_server

    async def tools() -> dict[str, Any]:
        return {t.name: t for t in await build_server().list_tools()}

    listed = anyio.run(tools)
    tool = listed["generate_repro"]
    assert tool.output_schema is not None and "script" in tool.output_schema["properties"]
    assert tool.annotations is not None and tool.annotations.read_only_hint is False
    assert listed["list_repro_templates"].annotations.read_only_hint is True  # type: ignore[union-attr]


def test_from_report_accepts_a_run_report_with_captured_stacks() -> None:
    run = {
        "outcome": "hung",
        "summary": "Hung",
        "nproc": 2,
        "duration_s": 9.0,
        "stacks": _load("stacks_rank_conditional.json"),
    }
    r = repro_from_report(run)
    assert r.template == "rank_conditional_collective" and r.params["busy_rank"] == 0


def test_skill_sections_named_by_templates_and_answers_resolve() -> None:
    root = templates_dir().parent
    repro_md = (root / "skill" / "repro.md").read_text()
    assert {
        "when-to-generate-a-repro",
        "hand-it-over",
        "when-it-does-not-reproduce",
        "verify-it",
    } <= _anchors(repro_md)
    checked = 0
    for t in list_templates().templates:
        path, _, anchor = t.skill_section.partition("#")
        playbook = root / path
        if (
            playbook.is_file()
        ):  # playbooks written alongside (crashes, communication errors) are checked once present
            assert anchor in _anchors(playbook.read_text()), t.skill_section
            checked += 1
    assert checked >= 6  # hangs.md, wrong-results.md, oom.md at least


def test_from_report_fills_the_mismatch_and_the_worker_signal_from_the_findings_facts() -> None:
    choice = choose_from_findings(
        [Finding.model_validate(f) for f in _load("triage_shape_mismatch.json")["findings"]], world_size=2
    )
    assert choice.params == {"world_size": 2, "op": "all_reduce", "numel": 4, "odd_rank": 1}
    dtype = Finding(
        kind="collective_mismatch",
        message="collectives differ",
        ranks=[0],
        facts={
            "op": "_ALLGATHER_BASE",
            "shape": "[2, 3]",
            "other_rank": 1,
            "differ": "Tensor Tensor dtypes: Floatvs Double",
        },
    )
    assert choose_from_findings([dtype], world_size=2).params == {
        "world_size": 2, "op": "all_gather", "numel": 6, "odd_rank": 1, "mismatch": "dtype",
    }  # fmt: skip
    worker = repro_from_report(str(DATA / "triage_dataloader.json"))
    assert worker.params["signal"] == "SIGKILL" and "CRASH_SIGNAL = 'SIGKILL'" in worker.script


def test_from_report_on_a_hung_training_loop_not_written_as_a_repro(tmp_path: Path) -> None:
    """`rankscope stacks --json --locals` of tests/programs/hang_collectives.py (3 ranks: rank 1 in barrier inside a
    helper, ranks 0 and 2 in all_reduce inside a nested module's forward)."""
    report = StacksReport.model_validate(_load("stacks_user_mismatch.json"))
    choice = choose_from_stacks(report)
    assert choice.template == "skip_collective"
    assert choice.params == {
        "world_size": 3, "op": "all_reduce", "next_op": "barrier", "skip_rank": 1, "function_name": "forward",
    }  # fmt: skip
    assert any("rank 1 skipped the all_reduce" in r for r in choice.reasons)
    assert any("no tensor shape" in r for r in choice.reasons)
    out = tmp_path / "r.py"
    assert (
        main(
            [
                "repro",
                "from-report",
                str(DATA / "stacks_user_mismatch.json"),
                "--set",
                "shape=8x2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    script = out.read_text()
    assert "WORLD_SIZE = 3" in script and "SKIP_RANK = 1" in script and "SHAPE = (8, 2)" in script
    assert "def forward(tensor" in script  # the helper is named like the call site the ranks wait in
    divergent = choose_from_stacks(StacksReport.model_validate(_load("stacks_user_divergent.json")))
    assert divergent.template == "rank_conditional_collective"
    assert divergent.params == {"world_size": 2, "busy_rank": 0, "op": "all_reduce"}
