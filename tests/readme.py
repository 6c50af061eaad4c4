"""README.md's code blocks, read the way tests/integration/test_readme.py runs them.

Every fenced block is one of four things, said by the HTML comment on the line before it:
``<!-- readme-test: file NAME -->`` (the block is a file the commands use, written as NAME),
``<!-- readme-test: skip: REASON -->`` (it cannot run here: a GPU, a cluster, a client this
machine lacks; the reason says which), ``<!-- readme-test: shell -->`` (lines a reader runs once
in their shell, from the repository root, before the commands: what puts them on PATH), or
nothing, for a ``console`` block: its ``$ `` lines are run and what follows each is the output they
must print. Pids, ports, paths, host names,
timings and percentages may differ (:func:`normalised`); nothing else may.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tests.paths import ROOT

README = ROOT / "README.md"

_MARK = re.compile(r"<!--\s*readme-test:\s*(?P<what>file|skip|shell)[:\s]\s*(?P<arg>.*?)\s*-->")


@dataclass
class Block:
    """One fenced block: its info string, its text, its first line in README.md, and its mark."""

    lang: str
    text: str
    line: int
    mark: str | None = None
    arg: str = ""


@dataclass
class Step:
    """One ``$ `` command of a console block and the output shown under it."""

    command: str
    shown: list[str] = field(default_factory=list)


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of README.md (or ``text``), with the mark on the line before it."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.search(before)
        out.append(
            Block(
                lang=line[3:].strip(),
                text="\n".join(body) + "\n",
                line=start + 1,
                mark=mark.group("what") if mark else None,
                arg=mark.group("arg") if mark else "",
            )
        )
        i += 1
    return out


def steps(block: Block) -> list[Step]:
    """The commands of a console block, each with the lines shown under it (blank lines kept
    between, trailing ones dropped)."""
    out: list[Step] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            out.append(Step(line[2:]))
        elif out:
            out[-1].shown.append(line)
    for step in out:
        while step.shown and not step.shown[-1].strip():
            step.shown.pop()
    return out


def normalised(text: str, *, folder: str, host: str) -> str:
    """``text`` with what may differ from run to run written one way: the demo folder as /tmp/demo,
    the host as vm, pids, ports, timings and percentages as placeholders, runs of spaces as one."""
    text = text.replace(folder, "/tmp/demo")
    if host != "vm":
        text = re.sub(rf"\b{re.escape(host)}\b", "vm", text)
    text = re.sub(r"\b(pids?|PID) \d[\d,-]*", r"\1 N", text)
    text = re.sub(r"\b(127\.0\.0\.1|localhost):\d+", r"\1:PORT", text)
    text = re.sub(r"\b\d+(\.\d+)? ?s\b", "Ts", text)
    text = re.sub(r"\b\d+%", "N%", text)
    return "\n".join(re.sub(r" {2,}", " ", line).rstrip() for line in text.splitlines()).strip()
