"""Planted secrets in every shape real jobs carry, through every tool, on a live hung job.

The job (tests/programs/hang_secrets.py) holds credentials in its environment, its command line,
its locals (a config dict, a dataclass, an argparse Namespace, a JSON string, a bytes repr, a
netrc line, a URL, headers, a list of tokens, a PEM block) and its log. Every answer of every
tool, CLI and MCP, bounded and full, is searched for any 10-character piece of any secret.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rankscope.mcp_server import build_server
from tests.jobs import JobFactory
from tests.live_stacks import READY_S, run_cli, settle

pytestmark = pytest.mark.slow

_RNG = random.Random(20261125)


def _rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_rng_choice(alphabet) for _ in range(n))


def _rng_choice(alphabet: str) -> str:
    return alphabet[_RNG.randrange(len(alphabet))]


def _b64url(n: int) -> str:
    return _rand(n, string.ascii_letters + string.digits + "-_")


PEM_BODY = [_rand(64, string.ascii_letters + string.digits + "+/") for _ in range(3)]
PLANTED = {
    "WANDB": _rand(40, "0123456789abcdef"),
    "HF": "hf_" + _rand(34),
    "PEM": "-----BEGIN PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n-----END PRIVATE KEY-----\n",
    "BYTES": _rand(18),
    "NETRC": _rand(18),
    "AWS_ID": "AKIA" + _rand(16, string.ascii_uppercase + string.digits),
    "AWS_SECRET": _rand(18) + "/" + _rand(21),
    "JWT": "eyJhbGciOiJIUzI1NiJ9." + _b64url(40) + "." + _b64url(43),
    "GITHUB": "ghp_" + _rand(36),
    "OPENAI": "sk-proj-" + _rand(48),
    "SLACK": "xoxb-" + _rand(12, string.digits) + "-" + _rand(13, string.digits) + "-" + _rand(24),
    "DBPW": _rand(20),
}
_PREFIXES = ("hf_", "ghp_", "sk-proj-", "xoxb-", "AKIA", "eyJhbGciOiJIUzI1NiJ9.")


def fragments() -> dict[str, list[str]]:
    """Every 10-character piece of each secret's own part (not its public prefix or PEM armour)."""
    out: dict[str, list[str]] = {}
    for name, value in PLANTED.items():
        parts = PEM_BODY if name == "PEM" else [value]
        pieces = []
        for part in parts:
            for prefix in _PREFIXES:
                part = part.removeprefix(prefix)
            pieces += [part[i : i + 10] for i in range(0, max(len(part) - 9, 1))]
        out[name] = pieces
    return out


def leaks(text: str) -> list[str]:
    return sorted({name for name, pieces in fragments().items() if any(p in text for p in pieces)})


def test_no_secret_leaves_by_any_tool(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "train.log"
    env = {f"RANKSCOPE_PLANTED_{k}": v for k, v in PLANTED.items()}
    env.update(
        {
            "HF_TOKEN": PLANTED["HF"],
            "WANDB_API_KEY": PLANTED["WANDB"],
            "AWS_ACCESS_KEY_ID": PLANTED["AWS_ID"],
            "AWS_SECRET_ACCESS_KEY": PLANTED["AWS_SECRET"],
            "DATABASE_URL": f"postgresql://trainer:{PLANTED['DBPW']}@db.internal:5432/runs",
            "NCCL_DEBUG": "WARN",
        }
    )
    args = [
        "--hf-token",
        PLANTED["HF"],
        "--db-url",
        f"postgres://u:{PLANTED['DBPW']}@db/x",
        "--trace-path",
        str(log),
    ]
    job = jobs.torchrun("hang_secrets.py", nproc=2, args=args, env=env)
    job.wait_ready(["rank0", "rank1"], timeout=READY_S)
    settle(job.pid, lambda r: r.verdict.suspect_ranks == [1])
    logs = [str(p) for p in sorted(tmp_path.glob("train.log.rank*"))]
    assert len(logs) == 2

    answers: dict[str, str] = {}
    pid = str(job.pid)
    for name, argv in {
        "ps": ["ps", "--pid", pid, "--json", "--full"],
        "stacks": ["stacks", "--pid", pid, "--locals", "--json"],
        "stacks full": ["stacks", "--pid", pid, "--locals", "--json", "--full"],
        "stacks text": ["stacks", "--pid", pid, "--locals"],
        "env full": ["env", "--pid", pid, "--json", "--full"],
        "env text": ["env", "--pid", pid],
        "triage full": ["triage", *logs, "--json", "--full"],
        "triage text": ["triage", *logs],
    }.items():
        code, out, err = run_cli(*argv)
        assert code == 0, (name, err)
        answers[f"cli {name}"] = out + err

    printer = tmp_path / "prints_secrets.py"
    printer.write_text(
        "import os\n"
        "print('loaded', os.environ['RANKSCOPE_PLANTED_HF'], flush=True)\n"
        "print('Authorization: Bearer ' + os.environ['RANKSCOPE_PLANTED_JWT'], flush=True)\n"
        "print('db password ' + os.environ['RANKSCOPE_PLANTED_DBPW'], flush=True)\n"
        "raise SystemExit('token=' + os.environ['RANKSCOPE_PLANTED_GITHUB'])\n"
    )
    for key, value in PLANTED.items():  # run_all_ranks' ranks inherit the server's environment
        monkeypatch.setenv(f"RANKSCOPE_PLANTED_{key}", value)

    async def mcp() -> None:
        async with Client(build_server()) as client:
            calls: dict[str, tuple[str, dict[str, Any]]] = {
                "list_jobs": ("list_jobs", {"pid": job.pid, "details": True}),
                "dump_stacks": ("dump_stacks", {"pid": job.pid, "locals": True, "full_ranks": [0, 1]}),
                "dump_stacks full": ("dump_stacks", {"pid": job.pid, "locals": True, "full": True}),
                "collect_env": ("collect_env", {"pid": job.pid, "include_torch": False, "full": True}),
                "triage_logs": ("triage_logs", {"paths": logs, "full": True}),
                "inspect_memory": ("inspect_memory", {"pid": job.pid, "full": True}),
                "generate_repro": ("generate_repro", {"from_last_stacks": True, "full": True}),
                "run_all_ranks": ("run_all_ranks", {"script": str(printer), "nproc": 2, "full": True}),
            }
            for name, (tool, arguments) in calls.items():
                res = await client.call_tool(tool, arguments)
                assert not res.is_error, (name, res.content)  # run_all_ranks: a crash is an answer
                text = "\n".join(c.text for c in res.content if getattr(c, "text", None))
                answers[f"mcp {name}"] = text + json.dumps(res.structured_content)

    anyio.run(mcp)
    found = {name: leaks(text) for name, text in answers.items()}
    assert {k: v for k, v in found.items() if v} == {}
    # not vacuous: the locals, the env and the log were read and shown
    full = answers["cli stacks full"]
    # py-spy shows dicts, strings and lists by value (objects as <HubConfig at 0x...>)
    assert '\\"lr\\": 0.1' in full and "service_account" in full and "api.example.com" in full
    assert "NCCL_DEBUG" in answers["cli env full"]
    assert "loaded" in answers["mcp run_all_ranks"] and "Authorization" in answers["mcp run_all_ranks"]
    assert "reasons" in answers["mcp generate_repro"]
    assert "db.internal" in answers["cli env full"] or "DATABASE_URL" not in answers["cli env full"]
    assert "peer_closed" in answers["cli triage full"] and "Authorization" in answers["cli triage full"]
