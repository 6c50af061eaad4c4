"""One statement of how answers are bounded, said the same way everywhere an agent reads it.

An agent that reads "about 4 KB" in one place and "8 KB" in another cannot tell which to trust.
``render.answer.ANSWER_BOUND`` is the statement; SKILL.md, the playbooks that speak of answer size,
the CLI's ``--help`` and the MCP server (instructions and every tool's ``full`` parameter) say it,
and the byte limits that make it true are the ones it names.
"""

from __future__ import annotations

import argparse
import re

import anyio
from mcp import Client

from rankscope.commands.base import add_json_flag
from rankscope.mcp_server import INSTRUCTIONS, build_server
from rankscope.render.answer import ANSWER_BOUND, MAX_DATA_BYTES, MAX_TEXT_BYTES
from rankscope.resources import bundle_root, playbooks_dir, skill_md


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", ""))


def test_the_limits_are_the_ones_stated() -> None:
    assert MAX_TEXT_BYTES == MAX_DATA_BYTES == 8_000
    assert "at most 8 KB" in ANSWER_BOUND


def test_the_skill_says_it_in_the_same_words() -> None:
    for path in (
        skill_md(),
        playbooks_dir() / "tools.md",
        playbooks_dir() / "hangs.md",
        bundle_root() / "README.md",
    ):
        if path.is_file():
            assert _plain(ANSWER_BOUND) in _plain(path.read_text(encoding="utf-8")), path.name


def test_no_other_size_is_promised() -> None:
    texts = [skill_md(), *playbooks_dir().glob("*.md")]
    for path in texts:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"about \d+ KB", text), f"{path.name} states another answer size"


def test_help_and_mcp_say_it() -> None:
    parser = argparse.ArgumentParser()
    add_json_flag(parser)
    assert "at most 8 KB" in parser.format_help()
    assert ANSWER_BOUND in INSTRUCTIONS

    async def fulls() -> list[str]:
        async with Client(build_server()) as client:
            tools = (await client.list_tools()).tools
            return [str(t.input_schema["properties"]["full"].get("description", "")) for t in tools]

    described = anyio.run(fulls)
    assert described and all("at most 8 KB" in d for d in described)
