"""Pure memory analysis: snapshots, per-rank imbalance, and sharding budgets.

Everything here takes data (an unpickled ``_dump_snapshot`` dict, parsed
/proc text, a placement list) and returns models. No files, no /proc, no
subprocesses, no torch import: the shell in ``rankscope.capabilities.memory`` does I/O and
may pass in torch's own ``_memory_viz`` helpers (``block_extra``,
``frame_filter``) so that rankscope reads snapshots exactly as PyTorch's
viewer does; the fallbacks below mirror them for hosts without torch.

Modules: ``frames`` (sites and places: a library line with the script line and caller that
reached it), ``snapshot`` (one snapshot), ``diagnosis`` (the one finding of several), ``graph`` (a
forward kept with its autograd graph), ``keeper``
(the statements of the job's code that keep a leak's tensors), ``imbalance``, ``budget``, ``probe``.

Snapshot layout (``torch.cuda.memory._snapshot`` docstring): ``segments`` (each
with ``total_size``, ``segment_type`` 'small'/'large', ``blocks`` whose
``state`` is ``active_allocated`` / ``active_pending_free`` / ``inactive``,
``requested_size``, ``frames``) and ``device_traces`` (one list per device of
entries with ``action`` alloc / free_requested / free_completed /
segment_alloc / segment_free / segment_map / segment_unmap / oom / snapshot,
``addr`` (``device_free`` for oom), ``size``, ``frames``). Frames are
innermost first.
"""

from __future__ import annotations

from rankscope.analysis.memory.budget import budget_input_from_data as budget_input_from_data
from rankscope.analysis.memory.budget import compute_budget as compute_budget
from rankscope.analysis.memory.budget import dtype_bytes as dtype_bytes
from rankscope.analysis.memory.budget import layer_unit as layer_unit
from rankscope.analysis.memory.budget import optimizer_states as optimizer_states
from rankscope.analysis.memory.diagnosis import diagnose as diagnose
from rankscope.analysis.memory.frames import NO_FRAMES as NO_FRAMES
from rankscope.analysis.memory.frames import SKILL as SKILL
from rankscope.analysis.memory.frames import SMALL_POOL_MAX as SMALL_POOL_MAX
from rankscope.analysis.memory.frames import BlockExtra as BlockExtra
from rankscope.analysis.memory.frames import FrameFilter as FrameFilter
from rankscope.analysis.memory.frames import is_user_file as is_user_file
from rankscope.analysis.memory.imbalance import compare_snapshots as compare_snapshots
from rankscope.analysis.memory.imbalance import imbalance as imbalance
from rankscope.analysis.memory.imbalance import live_findings as live_findings
from rankscope.analysis.memory.imbalance import parse_kb_fields as parse_kb_fields
from rankscope.analysis.memory.imbalance import parse_nvidia_smi_apps as parse_nvidia_smi_apps
from rankscope.analysis.memory.probe import probe_findings as probe_findings
from rankscope.analysis.memory.probe import probe_report as probe_report
from rankscope.analysis.memory.snapshot import analyze_snapshot as analyze_snapshot
from rankscope.analysis.memory.snapshot import fragmentation as fragmentation
from rankscope.analysis.memory.snapshot import rank_from_filename as rank_from_filename
from rankscope.analysis.memory.snapshot import snapshot_findings as snapshot_findings
from rankscope.analysis.units import parse_size as parse_size  # the budget parses --gpu-memory
