"""Sharding budgets: per-rank bytes of params, grads and optimizer states for a plan and its alternatives."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankscope.analysis.memory.frames import SKILL
from rankscope.analysis.units import fmt_bytes
from rankscope.models.core import Finding, NextStep
from rankscope.models.memory import (
    BudgetInput,
    BudgetReport,
    ParamInfo,
    PlanBudget,
)

# ------------------------------------------------------------------ budget

_DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "tf32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}
_OPTIMIZER_STATES = {
    "adam": 2.0,
    "adamw": 2.0,
    "fusedadam": 2.0,
    "lamb": 2.0,
    "nadam": 2.0,
    "radam": 2.0,
    "sgd": 1.0,
    "sgd_momentum": 1.0,
    "sgd_nomomentum": 0.0,
    "none": 0.0,
    "adagrad": 1.0,
    "rmsprop": 1.0,
    "lion": 1.0,
    "adafactor": 0.0,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ('torch.bfloat16', 'bf16', 'float8_e4m3fn')."""
    name = dtype.lower().removeprefix("torch.")
    if name.startswith("float8") or name.startswith("fp8"):
        return 1
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(_DTYPE_BYTES))}, float8_*")
    return _DTYPE_BYTES[name]


def optimizer_states(optimizer: str) -> float:
    """Optimizer state tensors per parameter element (Adam keeps exp_avg and exp_avg_sq: 2)."""
    name = optimizer.lower().replace("-", "_")
    try:
        return float(name)
    except ValueError:
        pass
    if name not in _OPTIMIZER_STATES:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; use one of {', '.join(sorted(_OPTIMIZER_STATES))} or a number"
        )
    return _OPTIMIZER_STATES[name]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _dim0_shard(shape: Sequence[int], world: int) -> int:
    """Elements of the largest dim-0 shard FSDP2 keeps per rank (it pads to equal chunks)."""
    if not shape:
        return 1
    return math.ceil(shape[0] / world) * _numel(shape[1:])


_LAYER = re.compile(r"^(.*?(?:^|\.)\d+)(?:\.|$)")


def layer_unit(fqn: str) -> str:
    """The per-layer FSDP unit of a parameter: the prefix up to its first numeric part ('layers.3'), '' for the root."""
    m = _LAYER.match(fqn)
    return m.group(1) if m else ""


def budget_input_from_data(data: Any, world_size: int | None = None) -> BudgetInput:
    """Accept rankscope's ``BudgetInput`` JSON, or a placement report's parameter list.

    Placement reports name fields a little differently depending on where they
    come from (live probe or DCP metadata); this reads the common spellings and
    picks, for a multi-rank report, the rank holding the most bytes.
    """
    if (
        isinstance(data, Mapping)
        and isinstance(data.get("ranks"), list)
        and data["ranks"]
        and isinstance(data["ranks"][0], Mapping)
        and _param_list(data["ranks"][0])
    ):
        options = [budget_input_from_data(r, world_size or data.get("world_size")) for r in data["ranks"]]
        return max(
            options,
            key=lambda b: sum(
                _numel(p.local_shape if p.local_shape is not None else p.shape) for p in b.params
            ),
        )
    if isinstance(data, list):
        data = {"params": data}
    if not isinstance(data, Mapping):
        raise ValueError("the placement input is neither a JSON object nor a list of parameters")
    raw = _param_list(data)
    if raw is None:
        raise ValueError(
            "no parameter list found: expected a 'params' list of {fqn, shape, local_shape, dtype, placements, unit}"
        )
    units = _fsdp_units(data)
    params: list[ParamInfo] = []
    for p in raw:
        fqn = str(p.get("fqn") or p.get("name") or p.get("key") or "")
        if p.get("kind", "param") != "param" or fqn.split(".", 1)[0] in _NOT_MODEL:
            continue  # buffers, optimizer state and other checkpoint entries are not parameters
        shape = p.get("global_shape") or p.get("shape") or p.get("size") or []
        local = p.get("local_shape")
        placements = p.get("placements") or []
        unit = p.get("fsdp_unit", p.get("unit"))
        if unit is None and units:
            unit = max(
                (u for u in units if u == "" or fqn == u or fqn.startswith(u + ".")), key=len, default=None
            )
        params.append(
            ParamInfo(
                fqn=fqn,
                shape=[int(x) for x in shape],
                local_shape=[int(x) for x in local] if local is not None else None,
                dtype=str(p.get("dtype") or "float32").removeprefix("torch."),
                placements=[
                    str(x) if not isinstance(x, Mapping) else str(x.get("kind") or x) for x in placements
                ],
                unit=unit,
            )
        )
    ws = world_size or data.get("world_size") or _mesh_size(data)
    fsdp = bool(units) if isinstance(data.get("wrapping"), list) else None
    return BudgetInput(world_size=int(ws) if ws else None, rank=data.get("rank"), fsdp=fsdp, params=params)


_NOT_MODEL = frozenset(
    {
        "optim",
        "optimizer",
        "optimizers",
        "lr_scheduler",
        "scheduler",
        "dataloader",
        "train_state",
        "extra_state",
    }
)


def _fsdp_units(data: Mapping[str, Any]) -> list[str]:
    """Module fqns wrapped by FSDP (fully_shard or FSDP1) in a placement report's ``wrapping`` list."""
    wrapping = data.get("wrapping")
    if not isinstance(wrapping, list):
        return []
    return [
        str(w.get("fqn", ""))
        for w in wrapping
        if isinstance(w, Mapping) and str(w.get("wrapping", "")).startswith("fsdp")
    ]


def _param_list(data: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    for key in ("params", "parameters", "tensors", "entries", "placements"):
        value = data.get(key)
        if isinstance(value, list) and (not value or isinstance(value[0], Mapping)):
            return value
    return None


def _mesh_size(data: Mapping[str, Any]) -> int | None:
    mesh = data.get("mesh_shape") or data.get("mesh")
    if isinstance(mesh, list) and mesh and all(isinstance(x, int) for x in mesh):
        return math.prod(mesh)
    return None


def _plan(
    name: str,
    params: Sequence[ParamInfo],
    local_elems: Callable[[ParamInfo], int],
    unit_of: Callable[[ParamInfo], str] | None,
    pb: int,
    gb: int,
    ob: int,
    states: float,
    gpu: int | None,
) -> PlanBudget:
    local = sum(local_elems(p) for p in params)
    units: dict[str, int] = {}
    if unit_of is not None:
        for p in params:
            u = unit_of(p)
            units[u] = units.get(u, 0) + _numel(p.shape)
    largest = max(units.items(), key=lambda kv: kv[1]) if units else None
    ag = largest[1] * pb if largest else 0
    rs = largest[1] * gb if largest else 0
    params_b, grads_b, optim_b = local * pb, local * gb, int(local * states * ob)
    total = params_b + grads_b + optim_b + ag + rs
    return PlanBudget(
        plan=name,
        units=len(units) or 1,
        params_bytes=params_b,
        grads_bytes=grads_b,
        optimizer_bytes=optim_b,
        allgather_peak_bytes=ag,
        largest_unit=(largest[0] or "<root>") if largest else None,
        reduce_scatter_peak_bytes=rs,
        total_bytes=total,
        fits=None if gpu is None else total <= gpu,
        headroom_bytes=None if gpu is None else gpu - total,
    )


_BUDGET_NOTES = (
    "Activations, the CUDA context (about 0.5-1 GiB) and NCCL buffers are not included: headroom must cover them.",
    "FSDP peaks assume one unit unsharded at a time; forward/backward prefetch can hold two.",
    "DDP with gradient_as_bucket_view=False keeps a second copy of the gradients in its buckets.",
    "Per-layer units are read from parameter names (the prefix up to the first number, e.g. 'layers.3').",
)


def _plans(
    inp: BudgetInput, world: int, pb: int, gb: int, ob: int, states: float, gpu_memory: int | None
) -> list[PlanBudget]:
    """The plan as given (when the input has local shapes), then DDP, per-layer FSDP and root-only FSDP."""
    params = inp.params
    plans: list[PlanBudget] = []
    if any(p.local_shape is not None for p in params):
        sharded = inp.fsdp is not False and any(
            p.local_shape is not None and any(pl.startswith("Shard") for pl in p.placements) for p in params
        )  # a DTensor (TP) or DDP plan all-gathers nothing per unit
        unit: Callable[[ParamInfo], str] | None = None
        if any(p.unit is not None for p in params):
            unit = lambda p: p.unit or ""  # noqa: E731
        elif sharded:
            unit = lambda p: layer_unit(p.fqn)  # noqa: E731

        def local(p: ParamInfo) -> int:
            return _numel(p.local_shape) if p.local_shape is not None else _numel(p.shape)

        plans.append(_plan("as_given", params, local, unit, pb, gb, ob, states, gpu_memory))
    full = lambda p: _numel(p.shape)  # noqa: E731
    shard = lambda p: _dim0_shard(p.shape, world)  # noqa: E731
    plans.append(_plan("ddp", params, full, None, pb, gb, ob, states, gpu_memory))
    plans.append(
        _plan("fsdp_per_layer", params, shard, lambda p: layer_unit(p.fqn), pb, gb, ob, states, gpu_memory)
    )
    plans.append(_plan("fsdp_root_only", params, shard, lambda p: "", pb, gb, ob, states, gpu_memory))
    return plans


def _fit_findings(plans: Sequence[PlanBudget], gpu_memory: int) -> tuple[list[Finding], str | None]:
    """Whether the plan as given fits the GPU, and the smallest standard plan that does."""
    fitting = [p for p in plans if p.fits and p.plan != "as_given"]
    recommended = min(fitting, key=lambda p: p.total_bytes).plan if fitting else None
    given = plans[0] if plans[0].plan == "as_given" else None
    if given is not None and not given.fits:
        finding = Finding(
            kind="budget_does_not_fit",
            severity="error",
            message=(
                f"the plan as given needs {fmt_bytes(given.total_bytes)} per rank before activations; "
                f"the GPU has {fmt_bytes(gpu_memory)}"
            ),
            fix=(
                f"Switch to {recommended}."
                if recommended
                else "No standard plan fits: add ranks, use "
                "lower-precision optimizer states, or offload (CPUOffloadPolicy)."
            ),
            facts={
                "total_bytes": given.total_bytes,
                "gpu_memory_bytes": gpu_memory,
                "recommended": recommended,
            },
            next_steps=[NextStep(action="Read the budget section.", skill_section=f"{SKILL}#budget")],
        )
        return [finding], recommended
    if recommended is None:
        finding = Finding(
            kind="budget_does_not_fit",
            severity="error",
            message=f"none of DDP, per-layer FSDP or root-only FSDP fits in {fmt_bytes(gpu_memory)} per rank",
            fix="Add ranks, keep optimizer states in lower precision, or offload them (CPUOffloadPolicy).",
            facts={"gpu_memory_bytes": gpu_memory},
        )
        return [finding], None
    return [], recommended


def _unit_finding(plans: Sequence[PlanBudget], params: Sequence[ParamInfo], pb: int) -> list[Finding]:
    """An FSDP unit that holds over half of the model makes sharding pointless at its all-gather."""
    per_layer = next(p for p in plans if p.plan == "fsdp_per_layer")
    total_full = sum(_numel(p.shape) for p in params) * pb
    if not (per_layer.units > 1 and total_full and per_layer.allgather_peak_bytes > 0.5 * total_full):
        return []
    return [
        Finding(
            kind="fsdp_unit_too_large",
            severity="warning",
            message=f"the largest FSDP unit ({per_layer.largest_unit}) holds over half of the model",
            fix="Wrap smaller modules with fully_shard so that no single all-gather materialises most of the model.",
            facts={
                "largest_unit": per_layer.largest_unit,
                "allgather_peak_bytes": per_layer.allgather_peak_bytes,
            },
        )
    ]


def compute_budget(
    inp: BudgetInput,
    *,
    source: str,
    optimizer: str = "adam",
    param_dtype: str = "float32",
    grad_dtype: str | None = None,
    optim_dtype: str = "float32",
    gpu_memory: int | None = None,
    world_size: int | None = None,
) -> BudgetReport:
    """Per-rank bytes of params, grads and optimizer state for the given plan and three standard ones.

    Activations, the CUDA context (~0.5-1 GiB) and NCCL buffers are not
    counted: the headroom is what is left for them.
    """
    world = world_size or inp.world_size
    if not world or world < 1:
        raise ValueError("world size unknown: pass --world-size (the placement input does not say)")
    grad_dtype = grad_dtype or param_dtype
    pb, gb, ob = dtype_bytes(param_dtype), dtype_bytes(grad_dtype), dtype_bytes(optim_dtype)
    states = optimizer_states(optimizer)
    plans = _plans(inp, world, pb, gb, ob, states, gpu_memory)
    findings: list[Finding] = []
    recommended = None
    if gpu_memory is not None:
        findings, recommended = _fit_findings(plans, gpu_memory)
    findings.extend(_unit_finding(plans, inp.params, pb))
    return BudgetReport(
        source=source,
        world_size=world,
        optimizer=optimizer,
        optimizer_states=states,
        param_dtype=param_dtype,
        grad_dtype=grad_dtype,
        optim_dtype=optim_dtype,
        total_params=sum(_numel(p.shape) for p in inp.params),
        gpu_memory_bytes=gpu_memory,
        plans=plans,
        recommended=recommended,
        findings=findings,
        notes=list(_BUDGET_NOTES),
    )
