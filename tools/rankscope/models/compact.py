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

from functools import cache
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

_EMPTY: tuple[Any, ...] = (None, "", [], {}, False, 0)
_PLAIN = frozenset({str, int, bool, type(None)})
"""Types that are their own JSON form (float is not: NaN and infinity have their own rules)."""
_NOT_EMPTY = object()
"""A field whose default is not empty (or that has none): it is always kept."""


class _Field(NamedTuple):
    name: str
    key: str
    empty_default: Any


def compact(value: Any, *, top: bool = True) -> Any:
    """``value`` as JSON-ready data, without empty defaulted fields below the top level.

    At the top an empty list still says something ("jobs": [] is the answer "no job here"),
    so only nulls and an empty ``left_out`` are dropped there.
    """
    if type(value) in _PLAIN:
        return value
    if isinstance(value, BaseModel):
        out: dict[str, Any] = {}
        for field in _fields(type(value)):
            item = getattr(value, field.name)
            if top:
                if item is None or (field.name == "left_out" and not item):
                    continue
            elif field.empty_default is not _NOT_EMPTY and _is_default(item, field.empty_default):
                continue
            out[field.key] = compact(item, top=False)
        return out
    if isinstance(value, (list, tuple)):
        return [compact(v, top=False) for v in value]
    if isinstance(value, dict):
        return {str(k): compact(v, top=False) for k, v in value.items()}
    return to_jsonable_python(value)


@cache
def _fields(cls: type[BaseModel]) -> tuple[_Field, ...]:
    """A model class's serialised fields, each with its default where that default is empty.

    Read once per class: asking pydantic for a factory's default inspects the factory's
    signature, which cost most of the time of compacting an answer of thousands of items.
    """
    fields = []
    for name, info in cls.model_fields.items():
        if info.exclude:  # never serialised (a frame's origin): the JSON dump leaves it out too
            continue
        empty: Any = _NOT_EMPTY
        if not info.is_required():
            default = info.get_default(call_default_factory=True)
            if any(_is_default(default, e) for e in _EMPTY):
                empty = default
        fields.append(_Field(name, info.alias or name, empty))
    return tuple(fields)


def _is_default(item: Any, default: Any) -> bool:
    """True when ``item`` is the (empty or false) ``default``, value and type alike."""
    return type(item) is type(default) and item == default
