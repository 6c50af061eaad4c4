"""One bad input per command: exit 2, and a message that names the input and the command to run next.

A new user's first mistakes (a wrong path, an empty folder, a pid that is gone, SKILL.md's own
shorthand) must each say what was wrong with what and what to type instead, never a traceback and
never an exit code that reads as an answer (0 answered, 1 a failure found, 3 hung).
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope import cli
from rankscope.errors import NoJobsFound
from tests.jobs import JobFactory, free_port, torchrun_argv

GONE_PID = str(2**22 + 4243)


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, the input the message must name), one per command."""
    empty = tmp / "empty"
    empty.mkdir()
    text = tmp / "notes.txt"
    text.write_text("not json\n")
    return [
        (["ps", "--pid", GONE_PID], GONE_PID),
        (["stacks", "--pid", GONE_PID], GONE_PID),
        (["stacks", "--last"], "stacks-last.json"),
        (["run", "--nproc", "2", "--", str(tmp / "nope.py")], "nope.py"),
        (["env", "--pid", GONE_PID, "--no-torch"], GONE_PID),
        (["triage", str(empty)], str(empty)),
        (["compare", str(empty)], str(empty)),
        (["placements", str(empty)], str(empty)),
        (["repro", "from-report", str(text)], str(text)),
        (["fr", str(empty)], str(empty)),
        (["memory", str(tmp / "nope.pickle")], "nope.pickle"),
        (["memory", "budget", str(text)], str(text)),
        (["skill", "#nope"], "#nope"),
    ]


def test_one_bad_input_per_command(tmp_path: Path) -> None:
    for argv, named in _cases(tmp_path):
        code, out, err = _cli(*argv)
        call = " ".join(argv)
        assert code == 2, (call, code, err)
        assert "Traceback" not in err and out == "", (call, out, err)
        message, _, fix = err.partition("\nFix: ")
        assert f"rankscope {argv[0]}: error: " in message and named in message, (call, err)
        assert "rankscope " in fix or "MCP" in fix or "`" in fix, (call, fix)


def test_stacks_with_no_job_on_the_host_is_nothing_to_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other jobs run on this host while the suite does: the scan is made to find none."""
    from rankscope.capabilities import discovery

    monkeypatch.setattr(discovery, "scan", dict)
    code, out, err = _cli("stacks")
    assert code == 2 and out == "" and "No distributed PyTorch job found on this host" in err
    fix = err.partition("\nFix: ")[2]
    assert fix.startswith(NoJobsFound.check) and "ps -eo user,pid,args" in fix  # first: this host? this user?
    assert "rankscope looked on host " in fix and "rankscope triage" in fix


def test_a_pid_that_is_not_a_jobs_says_what_it_is(jobs: JobFactory) -> None:
    """init is above every job (a job whose launcher's parent exited is reparented to it): ``--pid 1``
    names it and the jobs here instead of dumping one of them. A shell above the launcher takes the
    only job below it, and says so."""
    port = free_port()
    torchrun = torchrun_argv(
        "mcp_hang.py",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        args=["--mode", "divergent"],
    )
    job = jobs.start(["bash", "-c", f"{shlex.join(torchrun)}; exit $?"], 2, port, tag="shell")
    job.wait_ready(["rank0", "rank1"], timeout=120)
    code, out, err = _cli("ps", "--pid", "1")
    message, _, fix = err.partition("\nFix: ")
    assert code == 2 and out == "", err
    assert "pid 1 is init (" in message and "not a rank or launcher of a distributed PyTorch job" in message
    assert fix.startswith("Pass --pid with a launcher or rank pid") and "jobs here: " in fix
    code, out, err = _cli("ps", "--pid", str(job.pid), "--json")
    assert code == 0, err
    (found,) = json.loads(out)["jobs"]
    assert found["launcher_pid"] != job.pid
    note = found["notes"][-1]
    assert note.startswith(f"pid {job.pid} (bash -c ") and "ancestor of its launcher" in note
    code, out, err = _cli("ps", "--pid", str(found["launcher_pid"]), "--json")
    assert code == 0 and not json.loads(out)["jobs"][0].get("notes"), err


def test_a_mistyped_flag_shows_its_commands_usage_and_the_nearest_flag() -> None:
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(io.StringIO()) as err:
        cli.main(["stacks", "--windw", "2"])
    assert done.value.code == 2
    usage, _, error = err.getvalue().partition("rankscope stacks: error: ")
    assert usage.startswith("usage: rankscope stacks ") and "--window SECONDS" in usage
    assert error.strip() == "unrecognized arguments: --windw 2; did you mean --window?"


@pytest.mark.parametrize(
    ("argv", "meant"), [(["stack"], "'stacks'"), (["repro", "rendr"], "'render'"), (["skil"], "'skill'")]
)
def test_a_mistyped_command_names_the_nearest_command(argv: list[str], meant: str) -> None:
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(io.StringIO()) as err:
        cli.main(argv)
    assert done.value.code == 2
    assert f"invalid choice: {argv[-1]!r}; did you mean {meant}? (choose from " in err.getvalue()


def test_install_skill_refuses_to_overwrite_an_edit_and_says_how(tmp_path: Path) -> None:
    dest = tmp_path / "rankscope"
    assert _cli("install-skill", "--dir", str(dest))[0] == 0
    (dest / "SKILL.md").write_text("my notes\n")
    code, _, err = _cli("install-skill", "--dir", str(dest))
    assert code == 2 and "SKILL.md" in err and "--force" in err
    assert (dest / "SKILL.md").read_text() == "my notes\n"  # as --help says: nothing changed


def test_mcp_config_names_the_choices() -> None:
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(io.StringIO()) as err:
        cli.main(["mcp-config", "--client", "nope"])
    assert done.value.code == 2 and "'nope'" in err.getvalue() and "cursor" in err.getvalue()


@pytest.mark.parametrize("line", ["garbage", '{"hello": 1}'])
def test_mcp_on_garbage_logs_a_jsonrpc_error_and_exits_non_zero(line: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankscope", "mcp"],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""  # nothing on the protocol channel
    (error,) = [json.loads(x) for x in out.stderr.splitlines() if x.startswith("{")]
    assert error["jsonrpc"] == "2.0" and error["id"] is None
    assert error["error"]["code"] in (-32700, -32600) and "rankscope mcp-config" in error["error"]["message"]
