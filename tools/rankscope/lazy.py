"""One lazy-export helper for the package's two façades (``rankscope.api``, ``rankscope.probe``).

Both resolve each public name to the module that implements it on first use, so importing a façade
stays cheap (no torch, no mcp, no py-spy run). Each façade lists its names once, in an
``EXPORTS`` mapping, and repeats them in an ``if TYPE_CHECKING:`` block so type checkers see the
real signatures; tests/unit/test_layers.py checks that the two lists agree.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(module_name: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that imports ``exports[name]`` once and caches the value."""

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target), name)
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__
