"""Every code block of README.md is run by tests/integration/test_readme.py or says why it cannot be.

A block nobody runs drifts from the code (the quick start once lacked its imports and showed
output from an older verdict); this check keeps each new block honest before any job starts.
"""

from __future__ import annotations

from tests.paths import ROOT
from tests.readme import blocks, normalised, steps


def test_every_block_is_run_or_marked_with_its_reason() -> None:
    found = blocks()
    assert found, "README.md has code blocks"
    for block in found:
        where = f"README.md:{block.line} ({block.lang or 'plain'})"
        if block.mark == "skip":
            assert len(block.arg) > 10, f"{where}: a skipped block says why it cannot run here"
        elif block.mark == "file":
            assert block.arg and "/" not in block.arg, f"{where}: a file block names the file it is"
        elif block.mark == "shell":
            assert block.lang == "bash" and block.text.strip(), f"{where}: a shell block is bash lines to run"
        else:
            assert block.lang == "console", f"{where}: mark it <!-- readme-test: skip: REASON --> or run it"
            assert steps(block), f"{where}: a console block shows at least one `$ ` command"
    assert [b.arg for b in found if b.mark == "file"] == ["train.py"]
    (shell,) = [b for b in found if b.mark == "shell"]  # the quick start's commands live in .venv/bin
    assert shell.text.startswith("source .venv/bin/activate")


def test_the_marks_and_steps_are_read_as_written() -> None:
    text = (
        "<!-- readme-test: skip: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
        "<!-- readme-test: file a.py -->\n```python\nx = 1\n```\n"
        "```console\n$ echo hi\nhi\n\n$ true\n```\n"
    )
    skip, file, console = blocks(text)
    assert (skip.mark, skip.arg) == ("skip", "needs a GPU") and (file.mark, file.arg) == ("file", "a.py")
    assert console.mark is None
    assert [(s.command, s.shown) for s in steps(console)] == [("echo hi", ["hi"]), ("true", [])]


def test_only_what_may_differ_is_normalised() -> None:
    shown = "job torchrun:127.0.0.1:29513 (torchrun pid 22643) host(s) vm\n  pid 1     sleeping  over 1.2 s, CPU 3%"
    real = "job torchrun:127.0.0.1:4101 (torchrun pid 7) host(s) box\n  pid 88812 sleeping  over 15s, CPU 0%"
    assert normalised(shown, folder="/x", host="vm") == normalised(real, folder="/x", host="box")
    assert normalised("rank 2", folder="/x", host="vm") != normalised("rank 3", folder="/x", host="vm")
    assert normalised("(pids 14133-14134,14137)", folder="/x", host="vm") == "(pids N)"
    assert normalised("torchrun:localhost:29513", folder="/x", host="vm") == "torchrun:localhost:PORT"
    made_up = "torchrun:5f059911-7ad4-4d5d-8e72-645b568149b9"  # the job id as torchrun's run id once printed
    assert normalised(made_up, folder="/x", host="vm") != "torchrun:localhost:PORT"
    assert normalised("/tmp/w1/train.py:8", folder="/tmp/w1", host="vm") == "/tmp/demo/train.py:8"


def test_ci_runs_exactly_the_readmes_two_commands() -> None:
    """README says `.ci/run` runs its set-up block's two commands: the same lines, comments aside."""
    setup = next(b for b in blocks() if "bash .ci/setup" in b.text)
    shown = [line.split("#")[0].strip() for line in setup.text.splitlines() if line.strip()]
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ran = [line for line in run if line and not line.startswith(("#", "set ", "cd "))]
    assert ran == shown, ".ci/run and README's set-up block differ"
    assert "--durations=15" in shown[1]  # CI's log names the 15 slowest tests
