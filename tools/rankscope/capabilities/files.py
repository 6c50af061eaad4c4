"""The files a user names: each path a file, or a folder read recursively, in a stable order.

Flight-recorder dumps and saved stacks both arrive as "these files, or the folder they are
in"; they differ only in which names a folder's walk keeps and in the fix a missing path gets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rankscope.errors import InvalidInput


def expand_paths(paths: list[str], keep: Callable[[Path], bool], missing_fix: str) -> list[Path]:
    """Files named directly, plus the files under named folders that ``keep`` accepts (sorted),
    each once. A path that does not exist raises InvalidInput with ``missing_fix``."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            files.extend(c for c in sorted(p.rglob("*")) if c.is_file() and keep(c))
        elif p.is_file():
            files.append(p)
        else:
            raise InvalidInput(f"{raw}: no such file or directory", missing_fix)
    return list(dict.fromkeys(files))


__all__ = ["expand_paths"]
