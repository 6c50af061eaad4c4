"""Slurm hostlists and ``--hosts`` values: pure parsing, shared by the CLI and the remote shell."""

from __future__ import annotations

import re

from rankscope.errors import InvalidInput


def split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidInput(
                    f"unbalanced ']' in hostlist {expr!r}", "Pass a Slurm hostlist like node[01-04,07]."
                )
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise InvalidInput(
            f"unbalanced '[' in hostlist {expr!r}", "Pass a Slurm hostlist like node[01-04,07]."
        )
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand_range(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise InvalidInput(f"bad range {item!r} in hostlist {expr!r}", "Ranges look like 01-04 or 7.")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise InvalidInput(
                f"descending range {item!r} in hostlist {expr!r}", "Write ranges low-high, e.g. 01-04."
            )
        if hi - lo > 100_000:
            raise InvalidInput(f"range {item!r} in hostlist {expr!r} is too large", "Check the hostlist.")
        width = len(lo_s) if lo_s.startswith("0") else 0
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression: ``node[01-04,07],gpu-a[1-2]`` -> node01..node04, node07, gpu-a1, gpu-a2.

    Zero padding follows the lower bound (``[08-10]`` -> 08, 09, 10), several bracket
    groups in one name expand as a product (``r[1-2]n[1-2]``), order and duplicates are
    kept as Slurm keeps them (first occurrence wins).
    """
    hosts: list[str] = []
    for part in split_top(expr.strip()):
        names = [""]
        pos = 0
        for m in re.finditer(r"\[([^\]]*)\]", part):
            prefix = part[pos : m.start()]
            names = [n + prefix + v for n in names for v in expand_range(m.group(1), expr)]
            pos = m.end()
        tail = part[pos:]
        if "[" in tail or "]" in tail:
            raise InvalidInput(f"bad hostlist {expr!r}", "Pass a Slurm hostlist like node[01-04,07].")
        hosts.extend(n + tail for n in names)
    return list(dict.fromkeys(hosts))


def parse_hosts(value: str) -> list[str]:
    """A ``--hosts`` value: names split at top-level commas, Slurm hostlists (``node[01-04,07]``) expanded.

    Plain names, ``ssh://user@host:port`` and IPv6 literals (``[::1]``) are kept as written;
    duplicates are dropped, first occurrence first.
    """
    hosts: list[str] = []
    for part in split_top(value):
        if "[" in part and not part.startswith(("ssh://", "[")):
            hosts.extend(expand_hostlist(part))
        else:
            hosts.append(part)
    if not hosts:
        raise InvalidInput(
            "hosts (--hosts) is empty.",
            fix="Leave it out for this host, or name the nodes, e.g. node1,node2 or node[01-04].",
        )
    return list(dict.fromkeys(hosts))


_HOST_PORT = re.compile(r"\[?([^\]]+?)\]?:(\d+)")


def host_port(spec: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); None when ``spec`` is not one."""
    m = _HOST_PORT.fullmatch(spec)
    return (m.group(1), int(m.group(2))) if m else None
