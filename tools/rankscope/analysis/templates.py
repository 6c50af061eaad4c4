"""The repro template catalog as data: parameter validation, safe literals, and picking a template from a diagnosis.

Pure: it takes the manifest text, user values and reports, and returns models.
Nothing a user types reaches a generated script except through ``literal``:
numbers and booleans are range-checked and written with ``repr``, strings must
be one of a template's choices, names must be plain identifiers outside a
reserved set, and shapes are re-written from the integers they parse to.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from rankscope.analysis.hang.conditions import guard_kind
from rankscope.analysis.hang.verdict import RAN_OUT_EARLY
from rankscope.analysis.p2p import P2P_DIRECTION
from rankscope.errors import InvalidInput
from rankscope.models.core import Finding, Group, StacksReport
from rankscope.models.repro import Catalog, ParamSpec, ParamValue, TemplateChoice, TemplateSpec

_IDENT = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # snake_case only: no dunders, no CONSTANTS of the script
_SHAPE = re.compile(r"^[1-9][0-9]{0,5}(x[1-9][0-9]{0,5}){0,3}$")
# Names the generated scripts use themselves; a parameter may not shadow them.
RESERVED_NAMES = frozenset(
    {
        "os",
        "sys",
        "dist",
        "torch",
        "nn",
        "mp",
        "datetime",
        "faulthandler",
        "socket",
        "threading",
        "time",
        "signal",
        "json",
        "hashlib",
        "tempfile",
        "main",
        "run",
        "setup",
        "log",
        "rank",
        "world_size",
        "device",
        "self",
        "cls",
        "exec",
        "eval",
        "compile",
        "open",
        "globals",
        "locals",
        "getattr",
        "setattr",
        "delattr",
        "vars",
        "input",
        "breakpoint",
        "help",
        "exit",
        "quit",
        "print",
        "subprocess",
        "importlib",
        "shutil",
        "pathlib",
        "builtins",
        "collective",
        "init",
        "device_for",
        "start_watchdog",
        "report_symptom",
        "skip_without_cuda",
        "self_launch",
        "repro",
        "fingerprints",
        "check_consistency",
        "average_gradients",
        "local_loss",
        "shard",
        "sync_bn_buffers",
        "gather_state",
        "write_checkpoint",
        "wait_for_checkpoint",
        "checkpoint_path",
        "samples",
        "net",
    }
)

# Collective names as the stacks analysis reports them, mapped onto the ops the templates can call.
_OP_ALIASES = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_object": "all_gather",
    "reduce_scatter": "all_reduce",
    "reduce_scatter_tensor": "all_reduce",
    "all_to_all": "all_reduce",
    "all_to_all_single": "all_reduce",
    "reduce": "all_reduce",
    "gather": "all_gather",
    "scatter": "broadcast",
}


def parse_catalog(text: str) -> Catalog:
    """Validate the manifest, including that every default satisfies its own parameter spec."""
    try:
        catalog = Catalog.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidInput(
            f"repro_templates/catalog.json is invalid: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}",
            fix="Fix the manifest entry named in the message; every field is described in rankscope/models/repro.py.",
        ) from exc
    seen: set[str] = set()
    for spec in catalog.templates:
        if spec.name in seen:
            raise InvalidInput(
                f"template {spec.name!r} appears twice in the catalog.",
                fix="Give each template a unique name.",
            )
        seen.add(spec.name)
        validate_params(spec, {})  # defaults must pass their own checks
    return catalog


def find_template(catalog: Catalog, name: str) -> TemplateSpec:
    for spec in catalog.templates:
        if spec.name == name:
            return spec
    names = ", ".join(s.name for s in catalog.templates)
    raise InvalidInput(
        f"no repro template named {name!r}.", fix=f"Pick one of: {names} (`rankscope repro list`)."
    )


def _check_identifier(value: str) -> str:
    if not (_IDENT.match(value) and value.isidentifier() and value.isascii()):
        raise ValueError(
            "must be a snake_case Python name: lowercase letters, digits and '_', starting with a letter, at most 40 characters"
        )
    if keyword.iskeyword(value) or keyword.issoftkeyword(value):
        raise ValueError(f"{value!r} is a Python keyword")
    if value.startswith("__") or value in RESERVED_NAMES or hasattr(builtins, value):
        raise ValueError(f"{value!r} is reserved (a builtin or a name the repro uses itself)")
    return value


def _check_shape(value: str) -> str:
    if not _SHAPE.match(value):
        raise ValueError("must be a shape like '4' or '2x3' (1 to 4 positive dimensions)")
    return value


def _field_type(p: ParamSpec) -> Any:
    if p.type == "bool":
        return bool
    if p.type == "int":
        return Annotated[int, Field(ge=p.min, le=p.max, strict=False)]
    if p.type == "float":
        return Annotated[float, Field(ge=p.min, le=p.max, allow_inf_nan=False)]
    if p.type == "choice":
        if not p.choices:
            raise InvalidInput(
                f"parameter {p.name!r} is a choice without choices.", fix="Add 'choices' to the manifest."
            )
        return Literal[tuple(p.choices)]
    return str  # identifier / shape: checked by validators below


_MODELS: dict[str, type[BaseModel]] = {}


def params_model(spec: TemplateSpec) -> type[BaseModel]:
    """A pydantic model generated from the template's typed, bounded parameters."""
    key = spec.model_dump_json(include={"name", "params"})
    cached = _MODELS.get(key)
    if cached is not None:
        return cached
    fields: dict[str, Any] = {p.name: (_field_type(p), p.default) for p in spec.params}
    validators: dict[str, Any] = {}
    idents = [p.name for p in spec.params if p.type == "identifier"]
    shapes = [p.name for p in spec.params if p.type == "shape"]
    if idents:
        validators["check_identifiers"] = field_validator(*idents)(lambda cls, v: _check_identifier(v))
    if shapes:
        validators["check_shapes"] = field_validator(*shapes)(lambda cls, v: _check_shape(v))
    model = create_model(
        f"Params_{spec.name}",
        __config__=ConfigDict(extra="forbid", validate_default=True),
        __validators__=validators,
        **fields,
    )
    _MODELS[key] = model
    return model


def validate_params(spec: TemplateSpec, raw: Mapping[str, ParamValue] | None) -> dict[str, ParamValue]:
    """Check user values against the template's spec; return every parameter with its final value."""
    model = params_model(spec)
    try:
        values: dict[str, ParamValue] = model.model_validate(dict(raw or {})).model_dump()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "params"
            problems.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
        allowed = "; ".join(_describe(p) for p in spec.params)
        raise InvalidInput(
            f"invalid parameters for repro template {spec.name!r}: " + "; ".join(problems),
            fix=f"Use only these parameters: {allowed}.",
        ) from exc
    by_name = {p.name: p for p in spec.params}
    for p in spec.params:
        if p.below_param is not None:
            limit, value = values[p.below_param], values[p.name]
            if isinstance(limit, (int, float)) and isinstance(value, (int, float)) and not value < limit:
                raise InvalidInput(
                    f"{p.name}={value!r} must be smaller than {p.below_param}={limit!r} for template {spec.name!r}.",
                    fix=f"Pick {p.name} between {int(by_name[p.name].min or 0)} and {limit - 1}.",
                )
    for group in spec.distinct:
        picked = [values[n] for n in group]
        if len(set(picked)) != len(picked):
            raise InvalidInput(
                f"parameters {', '.join(group)} must differ for template {spec.name!r} (got {picked}).",
                fix="A mismatch needs two different operations; pick different values.",
            )
    _template_rules(spec.name, values)
    return values


def _template_rules(name: str, v: Mapping[str, ParamValue]) -> None:
    """Checks a bounded range cannot express: parameters that would not show the bug at all."""
    if name == "uneven_batches":
        ws, size, bs = int(v["world_size"]), int(v["dataset_size"]), int(v["batch_size"])
        counts = {-(-len(range(r, size, ws)) // bs) for r in range(ws)}
        if len(counts) < 2:
            raise InvalidInput(
                f"dataset_size={size} with world_size={ws} and batch_size={bs} gives every rank the same number of batches, "
                "so the repro would not show uneven batches.",
                fix="Pick a dataset_size that leaves a remainder, e.g. world_size*batch_size*2+1.",
            )
    if name == "dataloader_worker_crash" and int(v["crash_index"]) >= int(v["dataset_size"]) // int(
        v["world_size"]
    ):
        raise InvalidInput(
            f"crash_index={v['crash_index']} is never loaded: each rank reads {int(v['dataset_size']) // int(v['world_size'])} samples.",
            fix="Pick a crash_index smaller than dataset_size // world_size.",
        )


def _describe(p: ParamSpec) -> str:
    if p.type == "choice":
        return f"{p.name} (one of {', '.join(p.choices or [])}; default {p.default!r})"
    if p.type in ("int", "float"):
        return (
            f"{p.name} ({p.type} {p.min:g}..{p.max:g}; default {p.default!r})"
            if p.min is not None and p.max is not None
            else f"{p.name} ({p.type})"
        )
    return f"{p.name} ({p.type}; default {p.default!r})"


def literal(p: ParamSpec, value: ParamValue) -> str:
    """The Python source text for a validated value: the only way a value enters a script."""
    if p.type == "identifier":
        return _check_identifier(str(value))
    if p.type == "shape":
        return repr(tuple(int(d) for d in _check_shape(str(value)).split("x")))
    if p.type == "bool":
        return repr(bool(value))
    if p.type == "int":
        return repr(int(value))
    if p.type == "float":
        return repr(float(value))
    if p.type == "choice" and str(value) in (p.choices or []):
        return repr(str(value))
    raise InvalidInput(
        f"value {value!r} of {p.name!r} cannot be written into a script.",
        fix="Pass a value the manifest allows.",
    )


def render_context(
    spec: TemplateSpec, values: Mapping[str, ParamValue], fixed: bool, meta: str
) -> dict[str, Any]:
    """What the Jinja2 template sees: ``P`` holds safe source literals, ``V`` the validated values (for template logic)."""
    by_name = {p.name: p for p in spec.params}
    return {
        "P": {name: literal(by_name[name], value) for name, value in values.items()},
        "V": dict(values),
        "fixed": bool(fixed),
        "FIXED": repr(bool(fixed)),
        "spec": spec,
        "meta": meta,
    }


# ---------------------------------------------------------------- picking a template from a diagnosis


def _op(name: str | None) -> str | None:
    if not name:
        return None
    bare = name.rsplit(".", 1)[-1].lower().strip("()")
    return _OP_ALIASES.get(bare)


def _is_dtensor(group: Group) -> bool:
    text = " ".join([group.op or "", *(f"{f.file} {f.function}" for f in group.frames)]).lower()
    return "redistribute" in text or "distributed/tensor" in text or "dtensor" in text


def _world_size(report: StacksReport) -> int:
    ranks = {r for g in report.groups for r in g.ranks}
    ws = report.job.world_size or (max(ranks) + 1 if ranks else 2)
    return max(2, min(8, ws))


def _shape_from_locals(report: StacksReport) -> str | None:
    """A tensor shape from captured locals (`--locals`), e.g. ``torch.Size([4, 8])`` or ``shape=(4, 8)``."""
    pat = re.compile(r"(?:Size\(\[|shape=\(|shape=\[)([0-9, ]+)[\])]")
    for stack in report.stacks:
        for thread in stack.threads:
            for frame in thread.frames:
                for var in frame.locals or []:
                    m = pat.search(var.repr or "")
                    if m:
                        dims = [d for d in (x.strip() for x in m.group(1).split(",")) if d]
                        if 0 < len(dims) <= 4 and all(d.isdigit() and 0 < int(d) < 1_000_000 for d in dims):
                            return "x".join(dims)
    return None


def _site_function(group: Group) -> str | None:
    if group.call_site is None:
        return None
    try:
        return _check_identifier(
            group.call_site.function.rsplit(".", 1)[-1]
        )  # "Reducer.forward" -> "forward"
    except ValueError:
        return None


def _split_mismatch(groups: list[Group], suspects: set[int]) -> tuple[Group, Group]:
    """(the odd group, the main group) of a mismatched-collectives verdict.

    The odd ones out: ranks that left DTensor redistribution, else the verdict's suspects (which
    the verdict decided from guards, loop exits and counters), else ranks already in a barrier (the
    collective that usually comes after).
    """
    dtensor = [g for g in groups if _is_dtensor(g)]
    if dtensor and len(dtensor) < len(groups):
        return next(g for g in groups if g not in dtensor), dtensor[0]
    strict = [g for g in groups if suspects and set(g.ranks) <= suspects]
    if strict and len(strict) < len(groups):
        return strict[0], max((g for g in groups if g not in strict), key=lambda g: len(g.ranks))
    barrier = [g for g in groups if _op(g.op) == "barrier"]
    if barrier and len(barrier) < len(groups):
        return barrier[0], max((g for g in groups if g not in barrier), key=lambda g: len(g.ranks))
    return groups[-1], groups[0]


@dataclass
class _Ctx:
    """What every per-verdict chooser reads."""

    report: StacksReport
    ws: int
    suspects: set[int]
    groups: list[Group]
    reasons: list[str]
    notes: list[str]
    shape_params: dict[str, ParamValue]

    def choice(self, template: str, params: dict[str, ParamValue]) -> TemplateChoice:
        return TemplateChoice(
            template=template,
            params=params,
            reasons=self.reasons + self.notes,
            from_kind=self.report.verdict.kind,
        )


def choose_from_stacks(report: StacksReport) -> TemplateChoice:
    """Pick a template from a hang verdict: mismatched collectives, divergent ranks, missing ranks."""
    verdict = report.verdict
    notes: list[str] = []
    shape = _shape_from_locals(report)
    shape_params: dict[str, ParamValue] = {}
    if shape:
        shape_params["shape"] = shape
        notes.append(f"tensor shape {shape} read from the captured locals")
    else:
        notes.append(
            "the report carries no tensor shape (py-spy shows a tensor as <Tensor at 0x...>); the template's small "
            "default is used: override it with --set shape=... (MCP: params) if the shape matters"
        )
    ctx = _Ctx(
        report=report,
        ws=_world_size(report),
        suspects=set(verdict.suspect_ranks),
        groups=[g for g in report.groups if g.ranks],
        reasons=[f"verdict {verdict.kind}: {verdict.summary}"],
        notes=notes,
        shape_params=shape_params,
    )
    chooser = _CHOOSERS.get(verdict.kind)
    if chooser is not None:
        chosen = chooser(ctx)
        if chosen is not None:
            return chosen
    fix = {
        "all_in_same_collective": "every rank waits in the same call, so the program is consistent: look at the network, "
        "another host or a slow GPU (`rankscope env`, NCCL_DEBUG=INFO) instead of a repro",
        "no_collective": "no rank is in a collective: this is not a communication hang; look at the stacks "
        "(data loading, a lock, compute) and `rankscope stacks --native`",
        "inconclusive": "too little was captured; capture again with `rankscope stacks --json` while the job hangs",
    }.get(verdict.kind, "capture the hang with `rankscope stacks --json` and try again")
    raise InvalidInput(
        f"no repro template reproduces a {verdict.kind!r} verdict.", fix=fix[0].upper() + fix[1:] + "."
    )


def _from_mismatch(ctx: _Ctx) -> TemplateChoice:
    odd, main = _split_mismatch(ctx.groups, ctx.suspects)
    if any(_is_dtensor(g) for g in ctx.groups):
        ctx.reasons.append(
            f"rank(s) {main.ranks} wait inside DTensor redistribution while rank(s) {odd.ranks} went on: "
            "the ranks disagree on the placements they redistribute from, so only some of them communicate"
        )
        return ctx.choice("dtensor_placement_mismatch", {"world_size": ctx.ws, "odd_rank": min(odd.ranks)})
    main_op, odd_op = _op(main.op) or "all_reduce", _op(odd.op) or "barrier"
    if main.op and _op(main.op) is None:
        ctx.reasons.append(f"op {main.op!r} has no template of its own; all_reduce stands in for it")
    params: dict[str, ParamValue] = {"world_size": ctx.ws, **ctx.shape_params}
    fn = _site_function(main)
    if fn:
        params["function_name"] = fn
    if main_op != odd_op:
        guard = _guard_of(ctx, odd)
        if guard and guard_kind(guard) == "rank":
            return _extra_collective(ctx, odd, main, odd_op, main_op, guard)
        main_guard = _guard_of(ctx, main)
        if main_guard is None and _ran_out_early(ctx, odd):
            return _skipped_in_loop(ctx, odd, main, main_op)
        params.update({"op": main_op, "next_op": odd_op, "skip_rank": min(odd.ranks)})
        if main_guard:
            ctx.reasons.append(
                f"rank(s) {odd.ranks} skipped the {main_op} that ranks {main.ranks} entered under a condition "
                f"({main_guard}) and went on to {odd_op}: the template skips it on rank {min(odd.ranks)} the same way"
            )
        elif guard:
            ctx.reasons.append(
                f"rank(s) {odd.ranks} entered {odd_op} under a condition ({guard}) while ranks {main.ranks} "
                f"went on to {main_op}: the template reproduces the same split; the fix is to call {odd_op} on "
                "every rank or on none"
            )
        else:
            ctx.reasons.append(
                f"ranks {main.ranks} wait in {main_op} while rank(s) {odd.ranks} already wait in {odd_op}: "
                f"rank {min(odd.ranks)} skipped the {main_op} the others entered (or entered an extra {odd_op}: "
                "read the condition above its call site)"
            )
        return ctx.choice("skip_collective", params)
    params.update(
        {
            "op": main_op,
            "next_op": "barrier" if main_op != "barrier" else "all_reduce",
            "skip_rank": min(odd.ranks),
        }
    )
    ctx.reasons.append(
        f"every rank waits in {main_op} but at different call sites ({main.call_site} vs {odd.call_site}): "
        f"rank {min(odd.ranks)} skipped one call and went on to the next one"
    )
    return ctx.choice("skip_collective", params)


def _extra_collective(
    ctx: _Ctx, odd: Group, main: Group, odd_op: str, main_op: str, guard: str
) -> TemplateChoice:
    """One rank called a collective of its own under a rank condition: an extra call, not a skip."""
    params: dict[str, ParamValue] = {
        "world_size": ctx.ws,
        "extra_op": odd_op,
        "next_op": main_op,
        "extra_rank": min(odd.ranks),
        **{k: v for k, v in ctx.shape_params.items() if k == "shape"},
    }
    fn = _site_function(odd)
    if fn:
        params["function_name"] = fn
    ctx.reasons.append(
        f"rank(s) {odd.ranks} entered an extra {odd_op} under a rank condition ({guard}) while ranks "
        f"{main.ranks} went on to {main_op}: the template calls {odd_op} on rank {min(odd.ranks)} only, as the "
        f"job did; the fix is to call {odd_op} on every rank or on none"
    )
    return ctx.choice("extra_collective", params)


def _ran_out_early(ctx: _Ctx, odd: Group) -> bool:
    """The verdict found the odd rank past the loop the others are still in (see verdict_phrases.parting_phrase)."""
    text = " ".join([ctx.report.verdict.summary, *ctx.report.verdict.evidence])
    return RAN_OUT_EARLY in text and bool(odd.ranks)


def _skipped_in_loop(ctx: _Ctx, odd: Group, main: Group, main_op: str) -> TemplateChoice:
    """The odd rank left the loop the others are still in: it skipped a step's collective earlier,
    most often a batch dropped by a data check (a non-finite loss)."""
    params: dict[str, ParamValue] = {"world_size": ctx.ws, "bad_rank": min(odd.ranks)}
    fn = _site_function(main)
    if fn:
        params["function_name"] = fn
    ctx.reasons.append(
        f"rank(s) {odd.ranks} got past the loop in which ranks {main.ranks} still wait in {main_op}: they issued "
        f"one {main_op} less earlier, the way a rank does that skips a step on its own data (a non-finite loss, an "
        "empty batch); the template drops one batch on that rank; look for a `continue`, `break` or `return` in "
        "the loop body before the collective"
    )
    return ctx.choice("nonfinite_skip", params)


def _guard_of(ctx: _Ctx, group: Group) -> str | None:
    """The rank condition the verdict quoted above this group's collective, if any."""
    needle = f"guards the {group.op} at"
    for line in ctx.report.verdict.evidence:
        if needle in line and "`if" in line:
            return line.split(": ", 1)[-1]
    return None


def _from_divergent(ctx: _Ctx) -> TemplateChoice:
    waiting = [g for g in ctx.groups if g.op is not None]
    idle = [g for g in ctx.groups if g.op is None]
    busy = waiting[0] if waiting else None
    op = _op(busy.op) if busy else None
    params: dict[str, ParamValue] = {
        "world_size": ctx.ws,
        "busy_rank": min(busy.ranks) if busy else 0,
        "op": op or "all_gather",
        **ctx.shape_params,
    }
    where = ", ".join(f"rank(s) {g.ranks} at {g.call_site}" for g in idle) or "the suspect ranks"
    ctx.reasons.append(
        f"rank(s) {busy.ranks if busy else '?'} wait in {op or 'a collective'} while {where} are in none: "
        "work done by some ranks only (rank-0-only checkpoint/eval/logging) calls a collective the others never reach"
    )
    return ctx.choice("rank_conditional_collective", params)


def _from_missing(ctx: _Ctx) -> TemplateChoice:
    ctx.reasons.append(
        "some ranks of the world are gone while the others wait: the classic cause is a rank that ran out of batches "
        "and left the loop early (uneven data across ranks)"
    )
    return ctx.choice("uneven_batches", {"world_size": ctx.ws})


def _from_all_in_same(ctx: _Ctx) -> TemplateChoice | None:
    p2p = [g for g in ctx.groups if g.op in P2P_DIRECTION]
    if not p2p:
        return None
    ctx.reasons.append(
        f"every rank waits in {p2p[0].op} at {p2p[0].call_site}: with every rank in a blocking {p2p[0].op}, none is "
        "on the other side of its exchange (a send/recv ordering deadlock)"
    )
    return ctx.choice("send_recv_order", {"world_size": ctx.ws, **ctx.shape_params})


_CHOOSERS: dict[str, Callable[[_Ctx], TemplateChoice | None]] = {
    "mismatched_collectives": _from_mismatch,
    "divergent_ranks": _from_divergent,
    "missing_ranks": _from_missing,
    "all_in_same_collective": _from_all_in_same,
}


# finding kind -> (template, why); the first finding with a template wins, in this priority order.
_FINDING_TEMPLATES: tuple[tuple[str, str, str], ...] = (
    (
        "collective_mismatch",
        "shape_mismatch",
        "ranks called the same collective with different tensor shapes or dtypes",
    ),
    ("unused_parameters", "ddp_unused_params", "DDP found parameters that received no gradient"),
    ("dataloader_worker_killed", "dataloader_worker_crash", "a DataLoader worker process died"),
    ("cuda_oom", "cuda_oom_growth", "CUDA ran out of memory"),
    ("address_in_use", "port_in_use", "the rendezvous port was already taken"),
    ("rendezvous_failure", "unreachable_master", "ranks could not reach the rendezvous store"),
    ("collective_timeout", "skip_collective", "a collective timed out: most often a rank never entered it"),
    (
        "peer_closed",
        "uneven_batches",
        "a peer closed its connection: most often a rank that left the loop early",
    ),
)


def _int_fact(facts: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        val = facts.get(name)
        if isinstance(val, bool):
            continue
        if isinstance(val, int):
            return val
        if isinstance(val, str) and val.isdigit():
            return int(val)
    return None


_SIGNALS = {
    "killed": "SIGKILL",
    "segmentation fault": "SIGSEGV",
    "bus error": "SIGBUS",
    "terminated": "SIGTERM",
}
for _name in ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGTERM"):
    _SIGNALS[_name.lower()] = _name


def _mismatch_params(finding: Finding, ws: int, reasons: list[str]) -> dict[str, ParamValue]:
    """Op, element count, odd rank and what differs, from a collective_mismatch finding's facts."""
    facts = finding.facts
    params: dict[str, ParamValue] = {}
    op = _op(
        str(facts.get("op") or facts.get("op_type") or "")
        .replace("_BASE", "")
        .strip("_")
        .replace("ALL", "ALL_")
    )
    if op in ("all_reduce", "all_gather", "broadcast"):
        params["op"] = op
    shape = str(facts.get("shape") or "")
    dims = [d.strip() for d in shape.strip("[]()").split(",") if d.strip()]
    numel = _int_fact(facts, "numel", "element_count", "numel_in")
    if numel is None and dims and all(d.isdigit() for d in dims):
        numel = 1
        for d in dims:
            numel *= int(d)
    if numel and 0 < numel <= 1_000_000:
        params["numel"] = numel
    other = _int_fact(facts, "other_rank")
    if other is not None and 0 <= other < ws:
        params["odd_rank"] = other
    differ = str(facts.get("differ") or "").lower()
    if "dtype" in differ:
        params["mismatch"] = "dtype"
    if params:
        reasons.append(
            "from the finding: "
            + ", ".join(f"{k}={v!r}" for k, v in params.items())
            + (f" ({differ})" if differ else "")
        )
    return params


def choose_from_findings(findings: Iterable[Finding], world_size: int | None = None) -> TemplateChoice:
    """Pick a template from triage findings (the root-cause kind first, victims' kinds last)."""
    found = list(findings)
    kinds = [f.kind for f in found]
    ranks = {r for f in found for r in f.ranks}
    ws = max(2, min(8, world_size or (max(ranks) + 1 if ranks else 2)))
    for kind, template, why in _FINDING_TEMPLATES:
        finding = next((f for f in found if f.kind == kind), None)
        if finding is None:
            continue
        reasons = [f"finding {kind}: {finding.message}", f"{why} -> template {template}"]
        params: dict[str, ParamValue] = {}
        if template != "cuda_oom_growth":
            params["world_size"] = ws
        if template == "skip_collective":
            op = _op(str(finding.facts.get("op_type") or finding.facts.get("op") or ""))
            if op and op != "barrier":
                params["op"] = op
                reasons.append(f"the timed-out collective was {op}")
        if template == "shape_mismatch":
            params.update(_mismatch_params(finding, ws, reasons))
        if template == "dataloader_worker_crash":
            sig = _SIGNALS.get(str(finding.facts.get("signal", "")).strip().lower())
            if sig:
                params["signal"] = sig
                reasons.append(f"the worker died of {sig}")
        if template == "port_in_use":
            reasons.append("the repro binds a port first and then asks the rendezvous store to listen on it")
        return TemplateChoice(template=template, params=params, reasons=reasons, from_kind=kind)
    listed = ", ".join(sorted(set(kinds))) or "none"
    raise InvalidInput(
        f"no repro template matches the findings in this report (kinds: {listed}).",
        fix="Templates exist for: "
        + ", ".join(k for k, _, _ in _FINDING_TEMPLATES)
        + ". For other failures, render one "
        "by name (`rankscope repro list`) or write the repro by hand from the skill's playbook.",
    )
