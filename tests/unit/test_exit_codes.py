"""One exit-code table: errors.EXIT_CODES, printed under every --help and written in skill/tools.md.

Scripts and agents branch on the code, so the three places that state it must not drift apart.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from rankscope import cli, errors
from rankscope.errors import EXIT_CODES, NothingToRead, RankscopeError, UsageError, exit_codes_text
from tests.paths import ROOT


def test_the_playbook_table_has_every_code_with_the_same_meaning() -> None:
    text = (ROOT / "skill" / "tools.md").read_text(encoding="utf-8")
    section = text.split("### Exit codes", 1)[1]
    rows = dict(re.findall(r"^\| (\d) \| (.+?) \|$", section, re.MULTILINE))
    assert sorted(int(c) for c in rows) == [c for c, _ in EXIT_CODES]
    for code, meaning in EXIT_CODES:
        words = meaning.split()[:3]  # same lead words, the playbook may add backticks
        assert " ".join(words).replace("`", "") in rows[str(code)].replace("`", ""), (code, rows[str(code)])


@pytest.mark.parametrize("command", [None, *cli.COMMANDS])
def test_every_help_prints_the_table(command: str | None) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        cli.main(["--help"] if command is None else [command, "--help"])
    assert done.value.code == 0
    assert exit_codes_text() in out.getvalue()


def test_no_error_exits_as_an_answer() -> None:
    """An error is never 0, 1 or 3: those are answers."""
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, RankscopeError)]
    assert {UsageError, NothingToRead} <= set(classes)
    assert {c.__name__: c.exit_code for c in classes} == {c.__name__: 2 for c in classes}
