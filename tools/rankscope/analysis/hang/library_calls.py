"""A library call that is itself a collective: which one a rank is in, read from its stack.

The hangs met most often are not ``dist.all_reduce`` in the job's own code but a library call
made on one rank only that every rank of its group must make (``optim.consolidate_state_dict()``
under ``if rank == 0:``). The call is the outermost library function between the job's innermost
frame and the collective below it: that is the line the job wrote, and the one to move.

It is decided from the stack and the source, so a library nobody listed works too: a
c10d or functional-collective frame below the call (the CPU waits in it, as on gloo), or, when
the CPU waits elsewhere inside the call (on NCCL the collective is enqueued and the CPU stops at
the next GPU wait, ``.item()``), a collective called on the source lines read above the library's
frames. :data:`KNOWN_CALLS` adds the words for torch's own (whose source is not read) and says
they are collectives when no frame below shows it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from rankscope.analysis.hang.collectives import C10D_OPS, FrameKind, classify_python_frame, short_name
from rankscope.analysis.hang.conditions import LOOK_BACK
from rankscope.analysis.hang.frames import is_user_frame, lib_where
from rankscope.models.core import CallSite, Frame

KNOWN_CALLS: dict[tuple[str, str], str] = {
    ("distributed/optim/zero_redundancy_optimizer.py", "consolidate_state_dict"): (
        "ZeroRedundancyOptimizer.consolidate_state_dict"
    ),
    ("distributed/checkpoint/state_dict_saver.py", "save"): "torch.distributed.checkpoint.save",
    ("distributed/checkpoint/state_dict_saver.py", "async_save"): "torch.distributed.checkpoint.async_save",
    (
        "distributed/checkpoint/state_dict_saver.py",
        "save_state_dict",
    ): "torch.distributed.checkpoint.save_state_dict",
    ("distributed/checkpoint/state_dict_loader.py", "load"): "torch.distributed.checkpoint.load",
    (
        "distributed/checkpoint/state_dict_loader.py",
        "load_state_dict",
    ): "torch.distributed.checkpoint.load_state_dict",
    ("distributed/checkpoint/state_dict.py", "get_model_state_dict"): "get_model_state_dict",
    ("distributed/checkpoint/state_dict.py", "get_optimizer_state_dict"): "get_optimizer_state_dict",
    ("distributed/checkpoint/state_dict.py", "get_state_dict"): "get_state_dict",
    ("distributed/checkpoint/state_dict.py", "set_model_state_dict"): "set_model_state_dict",
    ("distributed/checkpoint/state_dict.py", "set_optimizer_state_dict"): "set_optimizer_state_dict",
    ("distributed/checkpoint/state_dict.py", "set_state_dict"): "set_state_dict",
    ("distributed/tensor/_api.py", "full_tensor"): "DTensor.full_tensor",
    ("distributed/tensor/_api.py", "redistribute"): "DTensor.redistribute",
    ("nn/utils/clip_grad.py", "clip_grad_norm_"): "clip_grad_norm_",
    ("distributed/fsdp/fully_sharded_data_parallel.py", "clip_grad_norm_"): (
        "FullyShardedDataParallel.clip_grad_norm_"
    ),
    ("distributed/fsdp/fully_sharded_data_parallel.py", "summon_full_params"): (
        "FullyShardedDataParallel.summon_full_params"
    ),
    ("distributed/fsdp/fully_sharded_data_parallel.py", "full_optim_state_dict"): (
        "FullyShardedDataParallel.full_optim_state_dict"
    ),
    ("distributed/fsdp/fully_sharded_data_parallel.py", "optim_state_dict"): (
        "FullyShardedDataParallel.optim_state_dict"
    ),
    ("nn/modules/batchnorm.py", "forward"): "SyncBatchNorm.forward",
    ("nn/parallel/distributed.py", "__init__"): "DistributedDataParallel(...)",
    ("nn/parallel/distributed.py", "join"): "DistributedDataParallel.join",
    ("distributed/algorithms/join.py", "__exit__"): "Join (DDP's join)",
    ("distributed/algorithms/join.py", "__enter__"): "Join (DDP's join)",
}
"""(file fragment, function) -> the name the answer gives: torch's calls that are collectives.

Each was read in torch 2.13's source: ZeRO's consolidate_state_dict broadcasts every shard
(``_broadcast_object``); DCP's save/load gather the plan (``_DistWrapper.reduce_scatter``,
``all_gather_object``); the state_dict helpers unshard FSDP/DTensor parameters
(``DTensor.full_tensor`` -> ``redistribute`` -> functional all_gather); ``clip_grad_norm_`` over
DTensor parameters reduces the norm (``_get_total_norm``, a DTensor all_reduce); FSDP's
summon_full_params all-gathers (``_unshard``); SyncBatchNorm's forward all-gathers the
statistics; DDP's construction verifies and broadcasts the parameters
(``_verify_param_shape_across_processes``, ``_sync_module_states``); its join all-reduces
(``Join.__exit__``, ``_notify_procs_to_terminate``). Some names are qualified by class only
in py-spy's output (``DTensor.full_tensor``): the table matches on the last component, and a
forward counts only in its own class (SyncBatchNorm's, not every module's in batchnorm.py)."""

_CLASS_ONLY: dict[tuple[str, str], str] = {
    ("nn/modules/batchnorm.py", "forward"): "SyncBatchNorm",
    ("nn/parallel/distributed.py", "__init__"): "DistributedDataParallel",
    ("nn/parallel/distributed.py", "join"): "DistributedDataParallel",
    ("distributed/algorithms/join.py", "__exit__"): "Join",
    ("distributed/algorithms/join.py", "__enter__"): "Join",
    ("distributed/tensor/_api.py", "full_tensor"): "DTensor",
    ("distributed/tensor/_api.py", "redistribute"): "DTensor",
}
"""Entries that count only in one class of their file, by the qualified name py-spy gives (Python
3.11+). An unqualified name (older Pythons) is not taken: ``forward`` of batchnorm.py may be any
BatchNorm's; a collective frame below the call still names it."""

PLUMBING_FILES: tuple[str, ...] = (
    "torch/distributed/c10d_logger.py",
    "torch/utils/_contextlib.py",
    "torch/_dynamo/eval_frame.py",
    "torch/_compile.py",
    "torch/distributed/checkpoint/logger.py",
    "torch/distributed/checkpoint/utils.py",
    "/contextlib.py",
    "/functools.py",
    "/typing_extensions.py",
)
"""Files of wrappers and dispatch between a call and its body: never the call's name."""

PLUMBING_NAMES: frozenset[str] = frozenset(
    {
        "_call_impl",
        "_wrapped_call_impl",
        "__call__",
        "wrapper",
        "wrapped",
        "inner",
        "inner_func",
        "decorate_context",
        "_no_grad_wrapper",
        "_fn",
        "apply",
    }
)
"""Function names of decorators' wrappers and nn.Module's dispatch (``model(x)`` runs them)."""

_WRAPPER = re.compile(r"wrap|decorat")
"""A function defined inside another whose name says it wraps (``Metric._wrap_compute.<locals>.wrapped_func``)."""

COLLECTIVE_CALL = re.compile(
    r"\b(?:dist|c10d|torch\.distributed|distributed_c10d)\.(\w+)\(|"
    r"\b(?:funcol|_functional_collectives)\.(\w+)\(|"
    r"\b(all_reduce\w*|all_gather\w*|broadcast\w*|reduce_scatter\w*|all_to_all\w*|gather_object|"
    r"scatter_object_list|barrier)\("
)
"""A collective called on a source line (``dist.all_gather_object(states, mine)``)."""

_SETUP = frozenset({"new_group", "new_subgroups", "init_process_group", "destroy_process_group"})
"""c10d calls that set groups up: not the collective a library call waits in."""

_COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/_functional_collectives.py")


@dataclass(frozen=True)
class LibraryCall:
    """The library call a rank is in: its name, the frame that is it, and the job's line that made it."""

    name: str
    frame: Frame
    site: CallSite
    how: str
    """What says it is a collective: the collective below it, or the source read above its lines."""

    @property
    def where(self) -> str:
        """``torch/distributed/optim/zero_redundancy_optimizer.py:564``: the call's own frame."""
        return lib_where(self.frame)


def _path(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def _plumbing(frame: Frame) -> bool:
    path = _path(frame)
    base = short_name(frame.function)
    nested = ".<locals>." in frame.function
    return (
        any(path.endswith(p) or p in path for p in PLUMBING_FILES)
        or base in PLUMBING_NAMES
        or (nested and _WRAPPER.search(base) is not None)
    )


def known_name(frame: Frame) -> str | None:
    """The table's name for a frame, or None."""
    path, base = _path(frame), short_name(frame.function)
    for (frag, fn), name in KNOWN_CALLS.items():
        if base != fn or not path.endswith(frag):
            continue
        owner = _CLASS_ONLY.get((frag, fn))
        if owner is None or frame.function.startswith(f"{owner}."):
            return name
    return None


def _is_collective_api(frame: Frame) -> bool:
    path = _path(frame)
    return any(path.endswith(f) for f in _COLLECTIVE_FILES)


def _collective_below(frames: list[Frame]) -> str | None:
    """The collective the outermost c10d or functional frame below the call names (the API the
    library called: ``gather_object``, not the ``all_gather`` it issues inside)."""
    found: str | None = None
    for frame in frames:
        op = None if frame.native else classify_python_frame(frame.function, frame.file).op
        if op is not None and op not in _SETUP:
            found = op
    return found


def _framework_below(frames: list[Frame]) -> str | None:
    """``FSDP unshard``: a framework's communication frame below the call (FSDP, DTensor, DDP)."""
    for frame in frames:
        kind = FrameKind() if frame.native else classify_python_frame(frame.function, frame.file)
        if kind.framework is not None:
            return f"{kind.framework} {kind.phase}"
    return None


def _collective_in_source(frames: list[Frame], source: Mapping[tuple[str, int], str]) -> str | None:
    """A collective called on the source lines read just above the library frames' lines."""
    for frame in frames:
        if frame.native or frame.line is None:
            continue
        for n in range(frame.line, max(0, frame.line - LOOK_BACK), -1):
            text = source.get((frame.file, n), "").split("#", 1)[0]
            m = COLLECTIVE_CALL.search(text)
            if m is None or (m.group(1) is not None and m.group(1) not in C10D_OPS):
                continue
            return f"`{text.strip()[:80]}` ({lib_where(frame.model_copy(update={'line': n}))})"
    return None


def library_call(
    frames: list[Frame], source: Mapping[tuple[str, int], str] | None = None
) -> LibraryCall | None:
    """The library call, itself a collective, that a main thread is in (innermost frames first), or None.

    None when the job's own frame calls the collective directly (``dist.barrier()``), when no
    library frame runs below the job's innermost frame, or when nothing says the call is a
    collective: no collective frame below it, no framework's communication frame (FSDP's unshard,
    DTensor's redistribute), no collective on the source read above its lines, and not one of
    :data:`KNOWN_CALLS`.
    """
    python = [f for f in frames if not f.native]
    user = next((i for i, f in enumerate(python) if is_user_frame(f)), None)
    if user is None or user == 0:
        return None
    inside = python[:user]
    call = next((f for f in reversed(inside) if not _plumbing(f)), None)
    if call is None or _is_collective_api(call):
        return None
    below = inside[: inside.index(call) + 1]
    op = _collective_below(below)
    name = known_name(call)
    if op is not None:
        how = f"it waits in {op} inside it"
    elif (inside_fw := _framework_below(below)) is not None:
        how = f"its CPU waits inside it, in {inside_fw}"
    elif (read := _collective_in_source(below, source or {})) is not None:
        how = f"it calls a collective: {read}"
    elif name is not None:
        how = f"its CPU waits inside it, at {lib_where(python[0])}"
    else:
        return None
    outer = python[user]
    site = CallSite(file=outer.file, line=outer.line, function=outer.function)
    return LibraryCall(name=name or call.function, frame=call, site=site, how=how)


__all__ = ["KNOWN_CALLS", "LibraryCall", "known_name", "library_call"]
