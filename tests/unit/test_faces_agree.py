"""The CLI and the MCP server refuse the same bad call with the same words.

Each case is one mistake, spelled for each face: ``rankscope ...`` must exit 2 with the error and
its fix, and the MCP tool must answer a tool error with the very same text. The checks live once
(the option types in options.py, the arguments of one call in validate.py, what a capability can
only know itself), so a rule added for one face holds for the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rankscope.capabilities import discovery
from rankscope.cli import main
from rankscope.mcp_server import build_server
from rankscope.runtime import pyspy
from tests.paths import DATA

SAVED = str(DATA / "stacks" / "files" / "pyspy_text")
MISSING = "/nonexistent/rankscope-faces"

CASES: list[tuple[str, list[str], str, dict[str, Any]]] = [
    ("pid 0", ["stacks", "--pid", "0"], "dump_stacks", {"pid": 0}),
    ("pid -1", ["stacks", "--pid", "-1"], "dump_stacks", {"pid": -1}),
    ("window too long", ["stacks", "--window", "500"], "dump_stacks", {"window_s": 500}),
    ("window negative", ["stacks", "--window", "-1"], "dump_stacks", {"window_s": -1}),
    ("timeout 0", ["stacks", "--timeout", "0"], "dump_stacks", {"timeout": 0}),
    ("timeout negative", ["stacks", "--timeout", "-5"], "dump_stacks", {"timeout": -5}),
    (
        "ranks with hosts",
        ["stacks", "--hosts", "n1", "--only-rank", "3"],
        "dump_stacks",
        {"hosts": ["n1"], "ranks": [3]},
    ),
    (
        "ranks with srun",
        ["stacks", "--via", "srun", "--only-rank", "0"],
        "dump_stacks",
        {"via": "srun", "ranks": [0]},
    ),
    ("negative rank", ["stacks", "--only-rank", "-1"], "dump_stacks", {"ranks": [-1]}),
    ("empty hosts", ["stacks", "--hosts", ""], "dump_stacks", {"hosts": []}),
    ("bad hostlist", ["stacks", "--hosts", "node[01-03"], "dump_stacks", {"hosts": ["node[01-03"]}),
    ("namespace without kubectl", ["stacks", "--namespace", "ml"], "dump_stacks", {"namespace": "ml"}),
    ("kubectl without pods", ["stacks", "--via", "kubectl"], "dump_stacks", {"via": "kubectl"}),
    ("srun without allocation", ["stacks", "--via", "srun"], "dump_stacks", {"via": "srun"}),
    (
        "saved and live",
        ["stacks", "--from", SAVED, "--pid", "1"],
        "dump_stacks",
        {"from_paths": [SAVED], "pid": 1},
    ),
    ("unknown job id", ["stacks", "--job", "nope"], "dump_stacks", {"job_id": "nope"}),
    ("ps pid 0", ["ps", "--pid", "0"], "list_jobs", {"pid": 0}),
    ("env pid -1", ["env", "--pid", "-1", "--no-torch"], "collect_env", {"pid": -1, "include_torch": False}),
    ("memory pid 0", ["memory", "--pid", "0"], "inspect_memory", {"pid": 0}),
    ("memory top 0", ["memory", SAVED, "--top", "0"], "inspect_memory", {"paths": [SAVED], "top": 0}),
    ("memory top 500", ["memory", "--top", "500"], "inspect_memory", {"top": 500}),
    ("run nproc 0", ["run", "--nproc", "0", "x.py"], "run_all_ranks", {"script": "x.py", "nproc": 0}),
    ("run nproc 100", ["run", "--nproc", "100", "x.py"], "run_all_ranks", {"script": "x.py", "nproc": 100}),
    ("run timeout 0", ["run", "--timeout", "0", "x.py"], "run_all_ranks", {"script": "x.py", "timeout": 0}),
    (
        "run hang -1",
        ["run", "--hang-timeout", "-1", "x.py"],
        "run_all_ranks",
        {"script": "x.py", "hang_timeout": -1},
    ),
    ("run missing script", ["run", MISSING + ".py"], "run_all_ranks", {"script": MISSING + ".py"}),
    (
        "repro verify without out",
        ["repro", "render", "bn_drift", "--verify"],
        "generate_repro",
        {"name": "bn_drift", "verify": True},
    ),
    (
        "repro nproc 0",
        ["repro", "render", "bn_drift", "--out", "/tmp/r.py", "--verify", "--nproc", "0"],
        "generate_repro",
        {"name": "bn_drift", "out": "/tmp/r.py", "verify": True, "nproc": 0},
    ),
    (
        "repro hang 0",
        ["repro", "render", "bn_drift", "--out", "/tmp/r.py", "--verify", "--hang-timeout", "0"],
        "generate_repro",
        {"name": "bn_drift", "out": "/tmp/r.py", "verify": True, "hang_timeout": 0},
    ),
    ("repro unknown template", ["repro", "render", "nope"], "generate_repro", {"name": "nope"}),
    ("fr missing dumps", ["fr", MISSING], "analyze_flight_recorder", {"paths": [MISSING]}),
    ("triage missing logs", ["triage", MISSING], "triage_logs", {"paths": [MISSING]}),
    ("compare missing folder", ["compare", MISSING], "check_tensor_consistency", {"path": MISSING}),
    ("placements missing folder", ["placements", MISSING], "inspect_placements", {"path": MISSING}),
]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit status and the error, as one line the way the MCP server words it."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    prefix = f"rankscope {argv[0]}: error: "
    assert err.startswith(prefix), err
    return code, err[len(prefix) :].replace("\n", " ")


def _mcp(tool: str, args: dict[str, Any]) -> Any:
    async def go() -> Any:
        async with Client(build_server()) as client:
            return await client.call_tool(tool, args)

    return anyio.run(go)


@pytest.fixture(autouse=True)
def _no_jobs_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The same host for both faces: no job running, py-spy present, no Slurm allocation."""
    monkeypatch.setattr(discovery, "scan", dict)
    monkeypatch.setattr(pyspy, "check_pyspy", lambda exe=None: "py-spy")
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("argv", "tool", "args"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_both_faces_refuse_a_bad_call_with_the_same_words(
    argv: list[str], tool: str, args: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = _cli(argv, capsys)
    sent = _mcp(tool, args)
    assert code == 2 and "Fix: " in said, said
    assert sent.is_error and sent.content[0].text == f"Error executing tool {tool}: {said}"


def test_both_faces_offer_the_same_ways_to_reach_other_hosts() -> None:
    """``--via`` and ``via`` list the same values, the ones the options define."""
    from typing import get_args

    from rankscope.cli import build_parser
    from rankscope.mcp_tools.jobs import Via
    from rankscope.options import VIAS

    parser, _ = build_parser("stacks")
    assert parser.parse_args(["stacks"]).via == "ssh"
    stacks = next(
        a for a in parser._subparsers._group_actions[0].choices["stacks"]._actions if a.dest == "via"
    )  # type: ignore[union-attr]
    assert tuple(stacks.choices or ()) == get_args(Via) == VIAS
