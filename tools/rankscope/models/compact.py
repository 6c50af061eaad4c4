"""The compact JSON form of an answer: what an agent's model reads.

Several MCP clients (Claude Code, VS Code, Copilot CLI) hand the model
``JSON.stringify(structuredContent)`` and nothing else, so the structured content is
read token by token. A field left at an empty default (``null``, ``[]``, ``{}``,
``""``, or a ``false``/``0`` default) tells the model nothing the schema does not, and
is dropped; a field with any other value, even ``false`` where the default is ``true``,
is kept. The result still validates against the model, and reads back equal to it,
because only fields at their default are dropped.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

_EMPTY: tuple[Any, ...] = (None, "", [], {}, False, 0)


def compact(value: Any, *, top: bool = True) -> Any:
    """``value`` as JSON-ready data, without empty defaulted fields below the top level.

    At the top an empty list still says something ("jobs": [] is the answer "no job here"),
    so only nulls and an empty ``left_out`` are dropped there.
    """
    if isinstance(value, BaseModel):
        out: dict[str, Any] = {}
        for name, field in type(value).model_fields.items():
            if field.exclude:  # never serialised (a frame's origin): the JSON dump leaves it out too
                continue
            item = getattr(value, name)
            if top:
                if item is None or (name == "left_out" and not item):
                    continue
            elif not field.is_required() and _at_empty_default(
                item, field.get_default(call_default_factory=True)
            ):
                continue
            out[field.alias or name] = compact(item, top=False)
        return out
    if isinstance(value, (list, tuple)):
        return [compact(v, top=False) for v in value]
    if isinstance(value, dict):
        return {str(k): compact(v, top=False) for k, v in value.items()}
    return to_jsonable_python(value)


def _at_empty_default(item: Any, default: Any) -> bool:
    """True when ``item`` is its field's default and that default is empty or false."""
    return (
        any(item == e and type(item) is type(e) for e in _EMPTY)
        and item == default
        and type(item) is type(default)
    )
