"""Models of the minimal repro generator: the template catalog and its answers.

``Catalog`` is the validated form of ``repro_templates/catalog.json``;
``TemplateList``, ``RenderedRepro`` and ``VerifyResult`` are the answers of
`rankscope repro list|render|from-report [--verify]` and of the MCP tool
``generate_repro``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import Model, NextStep

ParamType = Literal["int", "float", "bool", "choice", "identifier", "shape"]
"""``choice``: one of ``choices``; ``identifier``: a Python name (checked, never quoted);
``shape``: a tensor shape written ``4`` or ``2x3``."""

SymptomSource = Literal["verdict", "finding", "probe"]
"""Who judges the symptom: a hang verdict of `rankscope stacks` (via `rankscope run`),
a finding of `rankscope triage` on the output, or the repro's own cross-rank check."""

ParamValue = bool | int | float | str


class ParamSpec(Model):
    """One typed, bounded parameter of a template."""

    name: str
    type: ParamType
    default: ParamValue
    min: float | None = Field(default=None, description="Inclusive lower bound (int, float).")
    max: float | None = Field(default=None, description="Inclusive upper bound (int, float).")
    choices: list[str] | None = Field(default=None, description="Allowed values of a 'choice'.")
    below_param: str | None = Field(
        default=None,
        description="The value must be smaller than this other parameter (e.g. a rank < world_size).",
    )
    help: str = ""


class Symptom(Model):
    """What the buggy repro must show, and what its fixed twin must not."""

    source: SymptomSource
    kind: str = Field(
        description="A verdict kind, a triage finding kind, or a probe result such as 'divergent_tensors'."
    )
    description: str = ""


class TemplateSpec(Model):
    """One entry of the catalog: a failure class and how to render it."""

    name: str
    title: str
    failure_class: str
    description: str
    symptom: Symptom
    fixed_description: str = Field(
        description="What the fixed rendering changes, i.e. the fix to apply to real code."
    )
    params: list[ParamSpec] = Field(default_factory=list)
    distinct: list[list[str]] = Field(
        default_factory=list, description="Groups of parameters that must differ from each other."
    )
    skill_section: str
    requires_cuda: bool = False
    template: str = Field(description="File name of the Jinja2 template in repro_templates/.")


class Catalog(Model):
    """The validated manifest of every template."""

    version: int = 1
    exit_codes: dict[str, int] = Field(
        default_factory=dict, description="Documented exit codes of a rendered repro."
    )
    templates: list[TemplateSpec]


class TemplateInfo(Model):
    """One template as listed to a user or an agent."""

    name: str
    title: str
    failure_class: str = ""
    symptom: str = Field(description="The kind it shows: a verdict kind, a finding kind or a probe result.")
    symptom_source: SymptomSource
    requires_cuda: bool
    skill_section: str = ""
    description: str = Field(default="", description="Empty in a brief list (full=true has it).")
    fixed_description: str = ""
    params: list[ParamSpec] = Field(default_factory=list)


class TemplateList(Model):
    """Answer of `rankscope repro list`."""

    templates: list[TemplateInfo] = Field(default_factory=list)
    exit_codes: dict[str, int] = Field(default_factory=dict)
    hint: str = "Render one with `rankscope repro render NAME --out repro.py` (add --fixed for the corrected code, --verify to prove it)."
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )


class TemplateChoice(Model):
    """A template picked from a diagnosis, with the parameters read from it and why."""

    template: str
    params: dict[str, ParamValue] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list, description="Why this template and these parameters.")
    from_kind: str = Field(description="The verdict or finding kind the choice was made from.")


RunAnswer = Literal["reproduced", "not reproduced", "clean", "not clean", "skipped"]


class VerifyResult(Model):
    """Did the repro show its symptom (or, fixed, run clean)? With the evidence."""

    path: str
    template: str
    symptom: str
    symptom_source: SymptomSource
    fixed: bool
    expected: Literal["symptom", "clean"]
    answer: RunAnswer
    ok: bool = Field(
        description="True when the answer is what was expected: the bug shows, or the fix runs clean."
    )
    outcome: str | None = Field(
        default=None, description="`rankscope run` outcome: ok, crashed, hung, timeout."
    )
    exit_code: int | None = None
    verdict_kind: str | None = None
    suspect_ranks: list[int] = Field(default_factory=list)
    finding_kinds: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    summary: str
    duration_s: float = 0.0
    next_steps: list[NextStep] = Field(default_factory=list)


class RenderedRepro(Model):
    """Answer of `rankscope repro render|from-report`: the script, where it went, how to run it."""

    template: str
    title: str
    symptom: str
    symptom_source: SymptomSource
    requires_cuda: bool
    fixed: bool
    params: dict[str, ParamValue]
    path: str | None = Field(default=None, description="Where the script was written (None: only returned).")
    script: str
    run_commands: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(
        default_factory=list, description="Why this template was chosen (from-report)."
    )
    skill_section: str
    verify: VerifyResult | None = None
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
