"""One answer path: the registry names each answer's bound and renderers, and both faces print through it.

``render/answer.ANSWERS`` is the only place that says how an answer type is bounded and rendered;
the faces reach it through the façade (``api.answer``, ``api.render_answer``,
``api.shape_answer``) and import no bound and no renderer (tests/unit/test_layers.py plants one
and sees it refused). Here: every entry resolves, every answer a tool returns has an entry, and
the same call through the CLI (``--json``, ``--brief``) and through the MCP server (structured
content, text block) gives the same bytes.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import typing
from typing import Any

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel

import rankscope.mcp_tools
import rankscope.models
from rankscope import api
from rankscope.analysis.sizing.bound import bound_report
from rankscope.cli import main
from rankscope.mcp_server import build_server
from rankscope.render.answer import ANSWERS
from tests.paths import DATA


def _modules(package: Any) -> list[Any]:
    return [
        importlib.import_module(f"{package.__name__}.{m.name}")
        for m in pkgutil.iter_modules(package.__path__)
    ]


def _model_types() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for module in _modules(rankscope.models):
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseModel)
                and value.__module__ == module.__name__
            ):
                found[value.__name__] = value
    return found


def _tool_answers() -> dict[str, type[BaseModel]]:
    """Each MCP tool's answer type, by tool name (its return annotation)."""
    out: dict[str, type[BaseModel]] = {}
    for module in _modules(rankscope.mcp_tools):
        for name, fn in list(vars(module).items()):
            if (
                not inspect.iscoroutinefunction(fn)
                or fn.__module__ != module.__name__
                or name.startswith("_")
            ):
                continue
            ret = typing.get_type_hints(fn).get("return")
            if inspect.isclass(ret) and issubclass(ret, BaseModel):
                out[name] = ret
    return out


def test_every_entry_names_a_model_and_functions_that_exist() -> None:
    models = _model_types()
    for name, kind in ANSWERS.items():
        assert name in models, f"{name} is not a model of rankscope.models"
        for ref in (kind.bound, kind.human, kind.brief):
            if ref is not None:
                assert callable(getattr(importlib.import_module(ref[0]), ref[1])), (name, ref)
        assert kind.human is not None, f"{name}: a person gets no lines"


def test_every_tool_answer_is_in_the_registry() -> None:
    tools = _tool_answers()
    assert {"dump_stacks", "list_jobs", "triage_logs", "collect_env", "run_all_ranks"} <= set(tools)
    missing = {tool: t.__name__ for tool, t in tools.items() if t.__name__ not in ANSWERS}
    assert not missing, missing


def test_answer_bounds_by_the_registry_and_full_keeps_it_whole() -> None:
    report = api.stacks_from_files([str(DATA / "stacks" / "files" / "pyspy_text")])
    assert api.answer(report, full=True) is report
    assert api.answer(report, full_ranks=[1]) == bound_report(report, full_ranks=[1])
    # an answer type without a bound of its own leaves as it is (the 8 KB fit still applies when shaped)
    skill = api.read_skill("")
    assert api.answer(skill) is skill
    assert list(api.render_answer(skill) or []) and api.render_answer(api.DumpOptions()) is None  # type: ignore[arg-type]


STACKS = str(DATA / "stacks" / "files" / "pyspy_text")
TRIAGE = str(DATA / "postmortem" / "gpu_stuck")
FLIGHT = str(DATA / "flight" / "gloo_shape")
SAME_CALLS = [
    (["stacks", "--from", STACKS], "dump_stacks", {"from_paths": [STACKS]}),
    (["stacks", "--from", STACKS, "--full"], "dump_stacks", {"from_paths": [STACKS], "full": True}),
    (["triage", TRIAGE], "triage_logs", {"paths": [TRIAGE]}),
    (["fr", FLIGHT], "analyze_flight_recorder", {"paths": [FLIGHT]}),
    (
        ["compare", str(DATA / "probe" / "nobcast")],
        "check_tensor_consistency",
        {"path": str(DATA / "probe" / "nobcast")},
    ),
    (
        ["placements", str(DATA / "probe" / "dcp_fsdp2")],
        "inspect_placements",
        {"path": str(DATA / "probe" / "dcp_fsdp2")},
    ),
]


def _mcp(tool: str, args: dict[str, Any]) -> Any:
    async def go() -> Any:
        async with Client(build_server()) as client:
            return await client.call_tool(tool, args)

    return anyio.run(go)


@pytest.mark.parametrize(
    ("argv", "tool", "args"),
    SAME_CALLS,
    ids=[c[1] + ("-full" if "--full" in c[0] else "") for c in SAME_CALLS],
)
def test_the_cli_prints_what_the_mcp_server_sends(
    argv: list[str], tool: str, args: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """One answer path: ``--brief`` is the tool's text block and ``--json`` its structured content."""
    sent = _mcp(tool, args)
    assert not sent.is_error, sent.content
    main([*argv, "--brief"])
    assert capsys.readouterr().out == sent.content[0].text + "\n"
    if "--full" in argv:
        return  # --json --full is the whole model, indented for a person
    main([*argv, "--json"])
    assert json.loads(capsys.readouterr().out) == sent.structured_content


def test_a_verified_repro_says_its_verdict_once() -> None:
    """The person's lines already end with the verify lines; the agent's text block adds only the
    script, never a second copy of the verdict."""
    from rankscope.models.repro import RenderedRepro, VerifyResult
    from rankscope.render.repro import render_repro_brief

    verify = VerifyResult(
        path="/tmp/repro.py", template="skip_collective", symptom="hang", symptom_source="verdict",
        fixed=False, expected="symptom", answer="reproduced", ok=True, summary="hung as expected",
    )  # fmt: skip
    repro = RenderedRepro(
        template="skip_collective", title="t", symptom="hang", symptom_source="verdict", requires_cuda=False,
        fixed=False, params={}, path="/tmp/repro.py", script="print()", skill_section="skill/repro.md#x",
        verify=verify,
    )  # fmt: skip
    lines = list(render_repro_brief(repro))
    assert sum(1 for line in lines if line.startswith("verify: REPRODUCED")) == 1, lines
