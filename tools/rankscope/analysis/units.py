"""Byte sizes in the units people and PyTorch write: ``1.5 GiB``, ``80GiB``, ``81920MiB``.

One formatter and one parser for every report (memory, env, budget, logs), so a
size printed by one command can be pasted into another's flag.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB
PiB = 1024 * TiB

_MULT = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB, "P": PiB}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE)


def fmt_bytes(n: float | None) -> str:
    """Human size in binary units, e.g. 1.5 GiB (``?`` when unknown)."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def parse_size(text: str | int) -> int:
    """'80GiB', '80GB', '80G', '81920MiB', '2.00 GiB' or an int (bytes) to bytes.

    GB is read as GiB, as GPU specs and PyTorch's OOM messages mean it. Raises
    ValueError with an example of what is accepted.
    """
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot read the size {text!r}; write e.g. 80GiB, 40GB or 81920MiB")
    unit = (m.group(2) or "").upper().replace("I", "").rstrip("B")
    return int(float(m.group(1)) * _MULT[unit])


def size_or_none(text: str) -> int | None:
    """``parse_size`` for text found in logs: None instead of an error when it is not a size."""
    try:
        return parse_size(text)
    except ValueError:
        return None


__all__ = ["GiB", "KiB", "MiB", "PiB", "TiB", "fmt_bytes", "parse_size", "size_or_none"]
