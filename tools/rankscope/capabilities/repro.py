"""Minimal repros: list the templates, render one, pick one from a diagnosis, and prove it reproduces.

The shell around ``rankscope.analysis.templates``: it reads the manifest and
the Jinja2 templates from ``repro_templates/``, writes scripts, and verifies
them by running them through ``rankscope run`` (``launch.run_job``) and judging
the result with rankscope's own verdict and log triage.
"""

from __future__ import annotations

import ast
import json
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import FileSystemLoader, StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ValidationError

from rankscope.analysis.redact import Redactor
from rankscope.analysis.templates import (
    choose_from_findings,
    choose_from_stacks,
    find_template,
    parse_catalog,
    render_context,
    validate_params,
)
from rankscope.capabilities import launch
from rankscope.capabilities import triage as log_triage
from rankscope.errors import InvalidInput, RankscopeError
from rankscope.models.core import Finding, NextStep, StacksReport
from rankscope.models.repro import (
    Catalog,
    ParamValue,
    RenderedRepro,
    TemplateChoice,
    TemplateInfo,
    TemplateList,
    TemplateSpec,
    VerifyResult,
)
from rankscope.models.run import RunReport
from rankscope.resources import templates_dir

META_PREFIX = "# rankscope-repro: "
SYMPTOM_MARK = "rankscope-repro: SYMPTOM "
SKIP_MARK = "rankscope-repro: skipped: needs CUDA"


@lru_cache(maxsize=4)
def _load_catalog(path: str, mtime: float) -> Catalog:
    return parse_catalog(Path(path).read_text())


def catalog() -> Catalog:
    """The validated manifest (re-read when the file changes)."""
    path = templates_dir() / "catalog.json"
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise RankscopeError(
            f"the repro template manifest {path} is missing.",
            fix="Reinstall rankscope from a wheel or a full source checkout (repro_templates/ ships with it).",
        ) from exc
    return _load_catalog(str(path), mtime)


def _jinja() -> SandboxedEnvironment:
    # Sandboxed, StrictUndefined (a typo in a template fails loudly), no autoescape: this is Python, not HTML.
    return SandboxedEnvironment(
        loader=FileSystemLoader(str(templates_dir())),
        undefined=StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _info(spec: TemplateSpec) -> TemplateInfo:
    return TemplateInfo(
        name=spec.name,
        title=spec.title,
        failure_class=spec.failure_class,
        symptom=spec.symptom.kind,
        symptom_source=spec.symptom.source,
        requires_cuda=spec.requires_cuda,
        skill_section=spec.skill_section,
        description=spec.description,
        fixed_description=spec.fixed_description,
        params=spec.params,
    )


def list_templates() -> TemplateList:
    """Every repro template with its symptom, whether it needs CUDA, and its parameters."""
    cat = catalog()
    return TemplateList(templates=[_info(s) for s in cat.templates], exit_codes=cat.exit_codes)


def _run_commands(spec: TemplateSpec, values: dict[str, ParamValue], path: str | None) -> list[str]:
    script = path or "repro.py"
    ws = values.get("world_size", 2)
    return [
        f"torchrun --nproc_per_node={ws} {script}",
        f"python {script}",
        f"rankscope repro verify {script}",
    ]


def render_repro(
    name: str,
    params: dict[str, ParamValue] | None = None,
    *,
    fixed: bool = False,
    out: str | None = None,
    reasons: list[str] | None = None,
    overwrite: bool = False,
) -> RenderedRepro:
    """Render template ``name`` with validated ``params`` (the bug, or with ``fixed`` its correction); write it to ``out``.

    An existing ``out`` is replaced only with ``overwrite``: the path may be the user's own file.
    """
    cat = catalog()
    spec = find_template(cat, name)
    values = validate_params(spec, params)
    meta = META_PREFIX.lstrip("# ") + json.dumps(
        {
            "template": spec.name,
            "symptom": spec.symptom.kind,
            "source": spec.symptom.source,
            "fixed": bool(fixed),
            "requires_cuda": spec.requires_cuda,
            "world_size": values.get("world_size", 2),
        },
        sort_keys=True,
    )
    context: dict[str, Any] = render_context(spec, values, fixed, meta)
    context["exit_codes"] = cat.exit_codes
    try:
        script = _jinja().get_template(spec.template).render(context)
    except TemplateError as exc:
        raise RankscopeError(
            f"repro template {spec.template} failed to render: {exc}",
            fix="This is a bug in rankscope's repro_templates/; report it with the command you ran.",
        ) from exc
    try:
        ast.parse(script, filename=spec.template)
    except SyntaxError as exc:
        raise RankscopeError(
            f"repro template {spec.template} rendered invalid Python (line {exc.lineno}: {exc.msg}).",
            fix="This is a bug in rankscope's repro_templates/; report it with the parameters you passed.",
        ) from exc
    written: str | None = None
    if out is not None:
        target = Path(out).expanduser()
        if target.is_dir():
            raise InvalidInput(f"--out {out} is a directory.", fix="Pass a file path, e.g. --out repro.py.")
        if target.exists() and not overwrite:
            raise InvalidInput(
                f"{out} exists; rankscope does not replace a file unless asked.",
                fix="Pass another path, or overwrite=true (CLI: --overwrite) to replace it.",
            )
        if not target.parent.is_dir():
            raise InvalidInput(
                f"the folder of --out {out} does not exist.",
                fix=f"Create it first: mkdir -p {target.parent}.",
            )
        target.write_text(script)
        target.chmod(0o755)
        written = str(target.resolve())
    return RenderedRepro(
        template=spec.name,
        title=spec.title,
        symptom=spec.symptom.kind,
        symptom_source=spec.symptom.source,
        requires_cuda=spec.requires_cuda,
        fixed=fixed,
        params=values,
        path=written,
        script=script,
        run_commands=_run_commands(spec, values, out),
        reasons=list(reasons or []),
        skill_section=spec.skill_section,
    )


def _load_report(report: str | os.PathLike[str] | BaseModel | dict[str, Any]) -> dict[str, Any]:
    if isinstance(report, BaseModel):
        return report.model_dump(mode="json")
    if isinstance(report, dict):
        return report
    path = Path(report).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read report {path}: {exc.strerror or exc}.",
            fix="Save one first: `rankscope stacks --json > report.json` or `rankscope triage LOGS --json > report.json`.",
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{path} is not JSON ({exc.msg} at line {exc.lineno}).",
            fix="Pass the output of `rankscope stacks --json` or `rankscope triage --json`, not the human-readable text.",
        ) from exc
    if not isinstance(data, dict):
        raise InvalidInput(
            f"{path} holds JSON but not a rankscope report.",
            fix="Pass a `--json` report of stacks, triage or run.",
        )
    return data


def choose_template(report: str | os.PathLike[str] | BaseModel | dict[str, Any]) -> TemplateChoice:
    """Read a StacksReport, TriageReport or RunReport and pick the template that reproduces it."""
    data = _load_report(report)
    try:
        if "outcome" in data and "nproc" in data:  # a `rankscope run --json` RunReport
            if data.get("stacks"):
                return choose_from_stacks(StacksReport.model_validate(data["stacks"]))
            text = "\n".join(_run_output_lines(data))
            triage = log_triage.triage_logs([], text=text)
            return choose_from_findings(triage.findings, world_size=data.get("nproc"))
        if "verdict" in data and "job" in data:
            return choose_from_stacks(StacksReport.model_validate(data))
        if "findings" in data:
            findings = [Finding.model_validate(f) for f in data["findings"]]
            seen = data.get("seen_ranks") or []
            return choose_from_findings(findings, world_size=(max(seen) + 1) if seen else None)
    except ValidationError as exc:
        raise InvalidInput(
            f"the report does not match rankscope's report format: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}",
            fix="Regenerate it with the same rankscope version (`rankscope stacks --json`, `rankscope triage --json`).",
        ) from exc
    raise InvalidInput(
        "this JSON is neither a stacks report (verdict, job), a triage report (findings) nor a run report (outcome).",
        fix="Pass the output of `rankscope stacks --json`, `rankscope triage --json` or `rankscope run --json`.",
    )


def repro_from_report(
    report: str | os.PathLike[str] | BaseModel | dict[str, Any],
    *,
    out: str | None = None,
    fixed: bool = False,
    params: dict[str, ParamValue] | None = None,
    overwrite: bool = False,
) -> RenderedRepro:
    """Pick the template from a diagnosis, fill in what the report says (ops, world size, shape), render it.

    ``params`` overrides what was read from the report (e.g. a shape the report cannot know).
    """
    choice = choose_template(report)
    redactor = Redactor()  # a report written by hand or by an older tool may carry secrets in its summaries
    reasons = [redactor.text(r) for r in choice.reasons]
    if params:
        reasons.append("overridden by the caller: " + ", ".join(f"{k}={v!r}" for k, v in params.items()))
    merged = {**choice.params, **(params or {})}
    return render_repro(choice.template, merged, fixed=fixed, out=out, reasons=reasons, overwrite=overwrite)


def read_meta(script: str) -> dict[str, Any]:
    """The header a rendered repro carries: template, symptom, source, fixed."""
    for line in script.splitlines()[:5]:
        if line.startswith(META_PREFIX):
            try:
                meta = json.loads(line[len(META_PREFIX) :])
            except json.JSONDecodeError:
                break
            if isinstance(meta, dict) and {"template", "symptom", "source", "fixed"} <= meta.keys():
                return meta
    raise InvalidInput(
        "this script has no rankscope repro header, so there is no declared symptom to check.",
        fix="Verify scripts rendered by `rankscope repro render`; for any other script use `rankscope run --hang-timeout S -- script.py`.",
    )


def _run_output_lines(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for rank_out in run.get("ranks") or []:
        r = rank_out.get("rank")
        lines.extend(
            f"[rank{r}]: {line}" for line in (rank_out.get("stdout") or []) + (rank_out.get("stderr") or [])
        )
    lines.extend(run.get("launcher_output") or [])
    return lines


def verify_repro(
    path: str, *, nproc: int | None = 2, hang_timeout: float = 15.0, timeout: float = 120.0
) -> VerifyResult:
    """Run a rendered repro under `rankscope run` and say whether its declared symptom appears.

    A buggy repro must show its symptom ("reproduced"); a fixed one must run
    clean and not show it ("clean"). The symptom is judged by rankscope itself:
    the hang verdict of the captured stacks, the findings of log triage on the
    ranks' output, or the repro's own cross-rank check line. ``nproc=None``
    runs it on the world size it was rendered for.
    """
    script_path = Path(path).expanduser()
    try:
        script = script_path.read_text()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read {path}: {exc.strerror or exc}.", fix="Pass the path of a rendered repro."
        ) from exc
    meta = read_meta(script)
    kind, source, fixed = str(meta["symptom"]), str(meta["source"]), bool(meta["fixed"])
    if nproc is None:  # the world size the repro was rendered for
        world = meta.get("world_size")
        nproc = world if isinstance(world, int) and world > 0 else 2
    started = time.monotonic()
    run = launch.run_job(str(script_path), [], nproc=nproc, hang_timeout=hang_timeout, timeout=timeout)
    seen = _observe(run, kind, source)
    verdict = run.stacks.verdict if run.stacks is not None else None
    answer, ok, summary = _judge(run, seen, kind, source, fixed, script_path.name)
    return VerifyResult(
        path=str(script_path),
        template=str(meta["template"]),
        symptom=kind,
        symptom_source=source,
        fixed=fixed,
        expected="clean" if fixed else "symptom",
        answer=answer,
        ok=ok,
        outcome=run.outcome,
        exit_code=run.exit_code,
        verdict_kind=verdict.kind if verdict else None,
        suspect_ranks=list(verdict.suspect_ranks) if verdict else [],
        finding_kinds=seen.finding_kinds,
        evidence=[Redactor().text(e) for e in seen.evidence],
        summary=summary,
        duration_s=round(time.monotonic() - started, 2),
        next_steps=_verify_next_steps(answer, ok),
    )


@dataclass
class _Observed:
    """What one run of a repro showed: whether the declared symptom appeared, and the evidence."""

    seen: bool
    skipped: bool
    evidence: list[str]
    finding_kinds: list[str]


def _observe(run: RunReport, kind: str, source: str) -> _Observed:
    """Judge the symptom as rankscope itself would: the hang verdict, log triage, or the repro's check line."""
    lines = _run_output_lines(run.model_dump(mode="json"))
    text = "\n".join(lines)
    evidence = [f"rankscope run: {run.summary}"]
    if run.hang_evidence:
        evidence.append(f"hang evidence: {run.hang_evidence}")
    verdict = run.stacks.verdict if run.stacks is not None else None
    if verdict is not None:
        evidence.append(f"verdict {verdict.kind}: {verdict.summary}")
    finding_kinds: list[str] = []
    if run.outcome != "ok" and text.strip():
        triage = log_triage.triage_logs([], text=text)
        finding_kinds = sorted({f.kind for f in triage.findings})
        match = next((f for f in triage.findings if f.kind == kind), None)
        if match is not None:
            evidence.append(
                f"finding {match.kind} (ranks {match.ranks}): {match.message}: {match.excerpt[:300]}"
            )
    marks = [line for line in lines if SYMPTOM_MARK in line]
    evidence.extend(marks[:5])
    skip_line = next((line for line in lines if SKIP_MARK in line), None)
    if skip_line is not None:
        evidence.append(skip_line)
    if source == "verdict":
        seen = run.outcome == "hung" and verdict is not None and verdict.kind == kind
    elif source == "finding":
        seen = kind in finding_kinds
    else:
        seen = any(f"{SYMPTOM_MARK}{kind}:" in line for line in marks)
    return _Observed(seen=seen, skipped=skip_line is not None, evidence=evidence, finding_kinds=finding_kinds)


def _judge(
    run: RunReport, obs: _Observed, kind: str, source: str, fixed: bool, name: str
) -> tuple[str, bool, str]:
    """The answer (reproduced / clean / skipped / not ...), whether it is the expected one, and why."""
    if obs.skipped:
        return "skipped", True, f"skipped: {name} needs CUDA and none is visible here; run it on a GPU node."
    if fixed:
        clean = run.outcome == "ok" and run.exit_code == 0 and not obs.seen
        if clean:
            return "clean", True, f"clean: the fixed repro ran to completion without {kind}."
        still = f" and still shows {kind}" if obs.seen else ""
        return "not clean", False, f"not clean: the fixed repro ended {run.outcome}{still}."
    if obs.seen:
        return "reproduced", True, f"reproduced: {kind} appeared ({source})."
    verdict = run.stacks.verdict if run.stacks is not None else None
    summary = (
        f"not reproduced: expected {kind} ({source}); the run ended {run.outcome}"
        + (f" with verdict {verdict.kind}" if verdict else "")
        + (f" and findings {', '.join(obs.finding_kinds)}" if obs.finding_kinds else "")
        + "."
    )
    return "not reproduced", False, summary


def _verify_next_steps(answer: str, ok: bool) -> list[NextStep]:
    if answer == "reproduced":
        return [
            NextStep(
                action="Hand the repro over with its command lines, then render the fixed version and check it runs clean.",
                tool="generate_repro",
                skill_section="skill/repro.md#hand-it-over",
            )
        ]
    if not ok:
        return [
            NextStep(
                action="Rerun with a longer hang timeout or different parameters; read the evidence for what happened instead.",
                tool="run_all_ranks",
                skill_section="skill/repro.md#when-it-does-not-reproduce",
            )
        ]
    return []
