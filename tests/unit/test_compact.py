"""compact (models/compact.py): only a field at an empty default is dropped, below the top level; the
defaults are read once per model class, so a large answer compacts in linear time."""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field

from rankscope.models.compact import compact


class Colour(str, enum.Enum):
    red = "red"


class Inner(BaseModel):
    items: list[int] = Field(default_factory=list)
    extra: dict[str, int] = Field(default_factory=dict)
    flag: bool = False
    on: bool = True
    count: int = 0
    ratio: float = 0.0
    name: str = ""
    label: str = "x"
    note: str | None = None
    colour: Colour = Colour.red
    must: int


class Outer(BaseModel):
    inner: list[Inner]
    jobs: list[int] = Field(default_factory=list)
    left_out: list[str] = Field(default_factory=list)
    hint: str | None = None


def test_empty_defaults_are_dropped_and_every_other_value_kept() -> None:
    at_defaults = Inner(must=0)
    changed = Inner(items=[1], flag=True, on=False, count=2, ratio=0.5, name="n", note="t", must=3)
    data = compact(Outer(inner=[at_defaults, changed]))
    # "x" and True are defaults but not empty ones: the reader would not guess them
    assert data["inner"][0] == {"on": True, "label": "x", "colour": "red", "must": 0, "ratio": 0.0}
    assert data["inner"][1] == {
        "items": [1],
        "flag": True,
        "on": False,
        "count": 2,
        "ratio": 0.5,
        "name": "n",
        "label": "x",
        "note": "t",
        "colour": "red",
        "must": 3,
    }
    assert Outer.model_validate(data) == Outer(inner=[at_defaults, changed])


def test_the_top_level_keeps_empty_lists_and_drops_only_nulls_and_an_empty_left_out() -> None:
    assert compact(Outer(inner=[])) == {"inner": [], "jobs": []}


def test_a_value_of_another_type_than_its_empty_default_is_kept() -> None:
    class Loose(BaseModel):
        value: int | bool = 0

    class Holder(BaseModel):
        rows: list[Loose]

    assert compact(Holder(rows=[Loose(), Loose(value=False)])) == {"rows": [{}, {"value": False}]}
