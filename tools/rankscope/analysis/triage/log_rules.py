"""The rule table of log triage: which log lines mean what, and what to do about them.

Each rule has literal ``needles`` (cheap substring tests that the shell also uses
to skip uninteresting lines without decoding them) and an optional regex whose
named groups become the finding's facts. The message texts come from the
PyTorch, gloo and NCCL sources (ProcessGroupNCCL.cpp, gloo/transport/tcp/pair.cc,
torch/utils/data/dataloader.py, torch/distributed/elastic/...), so a rule
matches what a real job prints, not a paraphrase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from rankscope.models.core import NextStep, Severity

Role = Literal["cause", "victim", "context"]
"""``cause``: the event can start a failure on its own rank; ``victim``: it is
how a rank reacts to another rank's failure; ``context``: neither by itself."""

_CE = "skill/communication-errors.md"
_CR = "skill/crashes.md"


@dataclass(frozen=True)
class Rule:
    """One recognisable event."""

    kind: str
    needles: tuple[str, ...]
    message: str
    explanation: str
    fix: str
    severity: Severity = "error"
    role: Role = "cause"
    pattern: re.Pattern[str] | None = None
    require_match: bool = False
    next_steps: tuple[NextStep, ...] = field(default_factory=tuple)


def _step(action: str, section: str, tool: str | None = None) -> NextStep:
    return NextStep(action=action, tool=tool, skill_section=section)


# What to do after an NCCL watchdog timeout, whichever of its message shapes was seen.
_WATCHDOG_STEPS = (
    _step(
        "Read the lagging rank's stack while the job still hangs.", f"{_CE}#collective-timeout", "dump_stacks"
    ),
    _step(
        "Analyse the flight-recorder dumps if TORCH_FR_BUFFER_SIZE was set.",
        f"{_CE}#collective-timeout",
        "analyze_flight_recorder",
    ),
)

_NUM = r"-?\d+"
_SIZE = r"[\d.]+ [KMGTP]?i?B"

EXIT_WITHOUT_DESTROY_FIX = (
    "Call torch.distributed.destroy_process_group() at the end of main() on every rank, after the last "
    "collective (in a `finally:` so an exception exits cleanly too): the backend's threads then stop before "
    "the interpreter does."
)
"""What to do about a rank that aborted at exit (also the SIGABRT finding's fix when this explains it)."""

RULES: tuple[Rule, ...] = (
    Rule(
        kind="fr_dump_signal",
        needles=("Received a dump signal due to a collective timeout",),
        pattern=re.compile(
            r"Received a dump signal due to a collective timeout from\s+(?:rank (?P<detector>\d+)|this local rank)"
            r".*?Last enqueued (?:NCCL )?work: (?P<last_enqueued>-?\d+), last completed (?:NCCL )?work: "
            r"(?P<last_completed>-?\d+)"
        ),
        message="NCCL: dump signal after a timeout",
        explanation=(
            "PG 0's heartbeat monitor on this rank heard that another rank timed out and dumped its flight "
            "recorder; the line carries this rank's last enqueued and completed work on PG 0. A rank whose last "
            "enqueued work is below the failing sequence number never issued that collective: it is the laggard, "
            "and it usually does not time out itself (nothing of it is pending)."
        ),
        fix="Compare its last enqueued work with the sequence number the others timed out on.",
        severity="info",
        role="context",
        next_steps=_WATCHDOG_STEPS,
    ),
    Rule(
        kind="collective_timeout",
        needles=("Watchdog caught collective operation timeout",),
        pattern=re.compile(
            r"(?:\[(?:PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\]]*?) )?(?:PG (?P<pg>\d+) )?Rank (?P<rank>\d+)\] )?"
            r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
            r"(?:, NumelIn=(?P<numel_in>-?\d+), NumelOut=(?P<numel_out>-?\d+))?.*?Timeout\(ms\)=(?P<timeout_ms>\d+)\)"
            r"(?: ran for (?P<ran_for_ms>\d+) milliseconds)?"
        ),
        message="NCCL watchdog: collective timed out",
        explanation=(
            "A collective ran longer than the process-group timeout on this rank, which waited in it; the cause is "
            "usually a rank that never entered the same collective (behind, stuck elsewhere, or in another one)."
        ),
        fix=(
            "Look at the rank whose last enqueued work is behind, whose op or size differs, or that reports no "
            "timeout (suspect_ranks). Do not just raise the timeout."
        ),
        next_steps=_WATCHDOG_STEPS,
    ),
    Rule(
        kind="collective_timeout",
        needles=(
            "Timeout at NCCL work",
            "failure detected by watchdog at work sequence id",
            "detected by watchdog at work",
        ),
        pattern=re.compile(
            r"(?:\[(?:PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\]]*?) )?(?:PG (?P<pg>\d+) )?Rank (?P<rank>\d+)\] )?"
            r".*?(?:Timeout at NCCL work|at work sequence id|detected by watchdog at work):? (?P<seq>\d+)"
            r"(?:.*?last enqueued (?:NCCL )?work: (?P<last_enqueued>-?\d+))?"
            r"(?:.*?last completed (?:NCCL )?work: (?P<last_completed>-?\d+))?"
        ),
        message="NCCL watchdog: work timed out",
        explanation=(
            "The watchdog reports the work it was waiting for and how far this rank got: 'last enqueued' is the "
            "last collective the rank issued, 'last completed' the last one that finished. A rank whose last "
            "enqueued work is lower than the others' never reached the collective they are waiting in."
        ),
        fix="Find the rank with the lowest last enqueued work (suspect_ranks) and read what it was doing instead.",
        next_steps=_WATCHDOG_STEPS,
    ),
    Rule(
        kind="collective_timeout",
        needles=(
            "for recv operation to complete",
            "for send operation to complete",
            "failed to pass monitoredBarrier",
        ),
        pattern=re.compile(
            r"(?:Timed out waiting (?P<timeout_ms>\d+)ms for (?P<op>recv|send) operation to complete)"
            r"|(?:Ranks? (?P<barrier_ranks>\d+(?:, \d+)*) failed to pass monitoredBarrier in (?P<barrier_ms>\d+) ms)"
        ),
        require_match=True,
        message="gloo: collective timed out",
        explanation=(
            "gloo gave up waiting for a peer's data within the process-group timeout. The peer never sent it: it is "
            "behind, stuck, or running a different collective."
        ),
        fix="The ranks that did not report this timeout are the suspects; read their stacks or logs.",
        next_steps=(
            _step(
                "Read the other ranks' stacks while the job hangs.",
                f"{_CE}#collective-timeout",
                "dump_stacks",
            ),
        ),
    ),
    Rule(
        kind="peer_closed",
        needles=(
            "Connection closed by peer",
            "Connection reset by peer",
            "remote process exited or there was a network error",
        ),
        pattern=re.compile(r"\[(?P<peer_addr>[^\]]+)\]:(?P<peer_port>\d+)"),
        role="victim",
        message="peer connection closed",
        explanation=(
            "The other end of a connection went away mid-collective. The rank that prints this is a victim: the "
            "peer crashed, was killed, or exited early."
        ),
        fix="Look at the ranks that did not print this: their log shows why they exited.",
        next_steps=(
            _step(
                "Find the rank that exited first (suspect_ranks) and read its error.", f"{_CE}#peer-closed"
            ),
        ),
    ),
    Rule(
        kind="collective_mismatch",
        needles=("Detected mismatch between collectives",),
        pattern=re.compile(
            r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(?P<seq>\d+),?\s*"
            r"OpType=(?P<op>\w+)(?:, TensorShape=(?P<shape>\[[^\]]*\]))?.*?but Rank (?P<other_rank>\d+) is running "
            r"collective: CollectiveFingerPrint\(SequenceNumber=(?P<other_seq>\d+),?\s*OpType=(?P<other_op>\w+)"
            r"(?:, TensorShape=(?P<other_shape>\[[^\]]*\]))?(?:.*Collectives differ in the following aspects:\s*(?P<differ>.*))?"
        ),
        message="collectives differ between ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
        explanation=(
            "The ranks called different collectives, or the same one with different shapes, at the same sequence "
            "number. Without DETAIL mode this is a hang or garbage; DETAIL checks each call's fingerprint first."
        ),
        fix="Make every rank issue the same collectives in the same order with the same shapes (look for rank-dependent branches).",
        next_steps=(
            _step(
                "Find the rank-dependent branch at the call site.",
                f"{_CE}#collective-mismatch",
                "dump_stacks",
            ),
        ),
    ),
    Rule(
        kind="collective_mismatch",
        needles=(
            "op.preamble.length <= op.nbytes",
            "must be equal to world_size times",
            "Tensor list input and output",
            "mismatch between collectives",
        ),
        pattern=re.compile(
            r"op\.preamble\.length <= op\.nbytes\. (?P<received_bytes>\d+) vs (?P<expected_bytes>\d+)"
        ),
        message="collective size mismatch",
        explanation="Ranks passed tensors of different sizes to the same collective; gloo noticed the byte counts differ.",
        fix="Make the tensor shapes equal on all ranks (pad, or all-gather the sizes first).",
        next_steps=(
            _step(
                "Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see each rank's shapes.",
                f"{_CE}#collective-mismatch",
            ),
        ),
    ),
    Rule(
        kind="unused_parameters",
        needles=("Expected to have finished reduction in the prior iteration",),
        message="DDP: parameters did not receive gradients",
        explanation=(
            "DDP's reducer waits for a gradient for every parameter each iteration. Some parameters were not used to "
            "compute the loss, so the previous reduction never finished."
        ),
        fix=(
            "Pass find_unused_parameters=True to DistributedDataParallel (costs a graph traversal per step), or make "
            "every parameter contribute to the loss; if the unused set never changes, static_graph=True is cheaper."
        ),
        next_steps=(
            _step(
                "Name the unused parameters with TORCH_DISTRIBUTED_DEBUG=INFO.", f"{_CR}#unused-parameters"
            ),
        ),
    ),
    Rule(
        kind="unused_parameters",
        needles=("which did not receive grad for rank",),
        pattern=re.compile(
            r"(?P<what>Parameter indices|Parameters) which did not receive grad for rank (?P<rank>\d+): (?P<unused>.*)"
        ),
        message="DDP: parameters did not receive gradients",
        explanation="DDP lists the parameters (indices, or names with TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL) that got no gradient.",
        fix="Use those parameters in the forward pass, or pass find_unused_parameters=True.",
        next_steps=(
            _step("Map the indices to names with TORCH_DISTRIBUTED_DEBUG=INFO.", f"{_CR}#unused-parameters"),
        ),
    ),
    Rule(
        kind="cuda_oom",
        needles=("CUDA out of memory", "OutOfMemoryError"),
        pattern=re.compile(
            r"Tried to allocate (?P<requested>" + _SIZE + r")"
            r"(?:\. GPU (?P<gpu>\d+) has a total capacity of (?P<total_capacity>"
            + _SIZE
            + r") of which (?P<free>"
            + _SIZE
            + r") is free)?"
            r"(?:.*?Of the allocated memory (?P<allocated_by_pytorch>"
            + _SIZE
            + r") is allocated by PyTorch, and "
            r"(?P<reserved_unallocated>" + _SIZE + r") is reserved by PyTorch but unallocated)?"
        ),
        message="CUDA out of memory",
        explanation=(
            "The caching allocator could not find a block of the requested size. When 'reserved but unallocated' is "
            "large, the memory is fragmented rather than used up."
        ),
        fix=(
            "Lower the per-rank batch or activation memory (activation checkpointing, FSDP resharding); for "
            "fragmentation set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
        ),
        next_steps=(
            _step("Inspect the rank's memory and the allocator state.", "skill/oom.md", "inspect_memory"),
        ),
    ),
    Rule(
        kind="dataloader_worker_killed",
        needles=("DataLoader worker (pid",),
        pattern=re.compile(
            r"DataLoader worker \(pid(?:\(s\))? (?P<worker_pids>[\d, ]+)\) (?:exited unexpectedly|is killed by signal: (?P<signal>[^.\n]+))"
            r"(?:.*?with exit code (?P<exitcode>-?\d+))?"
        ),
        message="DataLoader worker died",
        explanation=(
            "A DataLoader worker process was killed (often by the OOM killer: each worker holds a copy of the dataset "
            "state) or crashed; the training rank then raises and its peers see it disappear."
        ),
        fix=(
            "Check `dmesg` for the OOM killer; lower num_workers or prefetch_factor, avoid Python lists of objects in "
            "the dataset (copy-on-read), and check /dev/shm size."
        ),
        next_steps=(
            _step(
                "Check /dev/shm, memory and the workers per rank.",
                f"{_CR}#dataloader-worker-killed",
                "collect_env",
            ),
        ),
    ),
    Rule(
        kind="shm_exhausted",
        needles=(
            "No space left on device",
            "insufficient shared memory",
            "Unexpected bus error encountered in worker",
        ),
        pattern=re.compile(r"unable to write to file <?(?P<shm_file>/torch_[^>: ]*)>?"),
        message="shared memory (/dev/shm) exhausted",
        explanation=(
            "DataLoader workers pass batches through shared memory in /dev/shm. Containers default to a 64 MB "
            "/dev/shm, which a few workers exhaust; the result is 'No space left on device' or a bus error."
        ),
        fix="Give the container more shared memory (`docker run --shm-size=16g`, a Kubernetes emptyDir with medium: Memory), or lower num_workers.",
        next_steps=(
            _step("Check /dev/shm size and use on the node.", f"{_CR}#shm-exhausted", "collect_env"),
        ),
    ),
    Rule(
        kind="address_in_use",
        needles=("EADDRINUSE", "Address already in use", "address already in use"),
        pattern=re.compile(r"port: (?P<port>\d+)(?:, useIpv6: (?P<ipv6>\w+))?(?:, code: (?P<code>-?\d+))?"),
        message="master port already in use",
        explanation=(
            "The rendezvous store (TCPStore on MASTER_ADDR:MASTER_PORT) could not listen: another job, or a zombie of "
            "a previous run, holds the port."
        ),
        fix="Pick a free port (--master_port, or --rdzv_endpoint=host:0 style auto-pick), or find and stop the process holding it (`ss -ltnp`).",
        next_steps=(_step("List jobs still running on this host.", f"{_CE}#address-in-use", "list_jobs"),),
    ),
    Rule(
        kind="rendezvous_failure",
        needles=(
            "RendezvousTimeoutError",
            "RendezvousClosedError",
            "RendezvousConnectionError",
            "DistStoreError",
            "waiting for clients",
            "The client socket has timed out",
            "DistNetworkError",
        ),
        pattern=re.compile(
            r"(?:Timed out after (?P<timeout_s>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<expected>\d+) clients joined)"
        ),
        message="rendezvous failed",
        explanation=(
            "The ranks could not all meet at the rendezvous store in time: a node did not start, started with a "
            "different --nnodes/--rdzv_id, or cannot reach MASTER_ADDR:MASTER_PORT (firewall, wrong interface)."
        ),
        fix="Check that every node runs the same launch command (nnodes, rdzv_id, endpoint) and can reach the endpoint; see which node is missing.",
        next_steps=(
            _step("Compare the environment of the nodes.", f"{_CE}#rendezvous-failure", "collect_env"),
        ),
    ),
    Rule(
        kind="nccl_error",
        needles=(
            "NCCL error in",
            "ncclInternalError",
            "ncclSystemError",
            "ncclUnhandledCudaError",
            "ncclInvalidUsage",
            "ncclRemoteError",
            "unhandled cuda error",
            "unhandled system error",
        ),
        pattern=re.compile(
            r"NCCL error in: (?P<where>[^,]+), (?P<reason>[^(\n,]+?)(?= \(run with|, NCCL version|$)"
            r"(?: \(run with NCCL_DEBUG=INFO for details\))?(?:, NCCL version (?P<nccl_version>[\w.+-]+))?"
        ),
        message="NCCL error",
        explanation=(
            "NCCL returned an error. 'unhandled cuda error' means a CUDA call inside NCCL failed (often a GPU fault "
            "or an earlier illegal memory access); 'system error' is usually networking or shared memory; 'remote "
            "error' means another rank failed."
        ),
        fix="Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) to see the failing call; check the kernel log for Xid errors.",
        next_steps=(
            _step(
                "Collect the node's GPUs, NCCL variables and Xid errors.", f"{_CE}#nccl-error", "collect_env"
            ),
        ),
    ),
    Rule(
        kind="nccl_error",
        needles=(" NCCL WARN ",),
        pattern=re.compile(
            r"(?P<nccl_host>[\w.-]+):(?P<nccl_pid>\d+):(?P<nccl_tid>\d+) \[(?P<cuda_device>\d+)\] (?:\S+:\d+ )?NCCL WARN (?P<warning>.*)"
        ),
        severity="warning",
        message="NCCL warning",
        explanation="NCCL printed a warning (NCCL_DEBUG=WARN or INFO); these usually precede the error a rank raises.",
        fix="Read the warning text; 'Cuda failure' points at the GPU, 'NET/...' at the network.",
        next_steps=(
            _step(
                "Collect the node's NCCL variables and network interfaces.",
                f"{_CE}#nccl-error",
                "collect_env",
            ),
        ),
    ),
    Rule(
        kind="duplicate_gpu",
        needles=("Duplicate GPU detected",),
        pattern=re.compile(
            r"Duplicate GPU detected : rank (?P<rank>\d+) and rank (?P<other_rank>\d+) both on CUDA device "
            r"(?P<bus_id>\w+)"
        ),
        message="two ranks on one GPU (NCCL: Duplicate GPU detected)",
        explanation=(
            "NCCL refuses a communicator in which two ranks use the same GPU, so init fails with "
            "ncclInvalidUsage on both. The ranks never chose their own device: no "
            "torch.cuda.set_device(LOCAL_RANK) before the first collective, or a launcher that gives every "
            "rank the same CUDA_VISIBLE_DEVICES. A configuration error, not a GPU fault."
        ),
        fix=(
            "One GPU per rank: call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
            "init_process_group (or pass device_id=torch.device('cuda', local_rank)), or fix the launcher's "
            "device mapping (per-rank CUDA_VISIBLE_DEVICES, Slurm --gpus-per-task/--gpu-bind); run no more "
            "ranks per node than it has GPUs."
        ),
        next_steps=(
            _step(  # the fix is known from the log alone; collect_env sees only a job that still runs
                "Give each rank its own GPU as the fix says, then rerun. While a job runs, collect_env shows "
                "each rank's LOCAL_RANK and CUDA_VISIBLE_DEVICES.",
                f"{_CE}#gpu-shared",
                None,
            ),
        ),
    ),
    Rule(
        kind="device_assert",
        needles=("Assertion `",),
        pattern=re.compile(
            r"(?P<kernel_file>[^\s:]+):(?P<kernel_line>\d+): (?P<kernel>.+?): block: \[(?P<block>[^\]]*)\], "
            r"thread: \[(?P<thread>[^\]]*)\] Assertion `(?P<assertion>.*)` failed"
        ),
        require_match=True,
        message="device-side assert",
        explanation=(
            "A CUDA kernel's own check failed on the GPU; the line names the kernel's source file and the "
            "condition. The Python traceback that follows ('device-side assert triggered') may point at a later "
            "call, because CUDA reports errors asynchronously. A program bug, not a hardware fault."
        ),
        fix=(
            "Fix the input the assertion names; rerun with CUDA_LAUNCH_BLOCKING=1 (debugging only) so the "
            "traceback points at the op that launched the kernel."
        ),
        next_steps=(_step("Check the inputs of the op the assertion names.", f"{_CR}#device-side-assert"),),
    ),
    Rule(
        kind="thread_died",
        needles=("Exception in thread ",),
        pattern=re.compile(r"Exception in thread (?P<thread>.+?)(?: \(\w+\))?:\s*$"),
        require_match=True,
        message="a thread died",
        explanation=(
            "A Python thread of this rank (a data reader, a prefetcher, a logger) raised and died; the rank "
            "itself goes on. Whatever waits for that thread's output (a queue.get() without a timeout) then "
            "waits forever, and the other ranks wait for this one in their next collective until the "
            "watchdog or the scheduler ends the job: the thread's exception is the root cause."
        ),
        fix=(
            "Fix the exception at the thread's call site; make the consumer fail fast: pass the exception to "
            "the consumer (put it on the queue and raise it there) or get(timeout=...), so the rank dies "
            "with the real error instead of hanging."
        ),
        next_steps=(_step("Open the thread's call site (facts.call_site).", f"{_CR}#thread-died"),),
    ),
    Rule(
        kind="launcher_stopped",
        needles=("death signal, shutting down workers",),
        pattern=re.compile(r"Received (?P<signum>\d+) death signal"),
        severity="warning",
        role="context",
        message="torchrun was stopped from outside",
        explanation=(
            "torchrun itself received a signal (a scheduler's time limit or cancel, a user's kill) and stopped "
            "its workers with SIGTERM. Nothing in the job failed on its own at that moment: a job stopped this "
            "way after it made no progress was hung, and the workers' SIGTERMs are the consequence."
        ),
        fix=(
            "Find why the job stopped progressing: the flight-recorder dumps or saved stacks of that moment, or "
            "a rank's error earlier in the log."
        ),
        next_steps=(
            _step(
                "Read the recorder dumps and saved stacks with the log (pass the whole folder).",
                f"{_CR}#dead-job",
                "triage_logs",
            ),
        ),
    ),
    Rule(
        kind="cuda_error",
        needles=(
            "CUDA error:",
            "Cuda failure",
            "CUBLAS_STATUS_",
            "CUDNN_STATUS_",
            "illegal memory access",
            "device-side assert triggered",
        ),
        pattern=re.compile(
            r"(?:CUDA error: (?P<cuda_error>[^\n]+?)(?:$|\n|\. ))|(?:Cuda failure '?(?P<cuda_failure>[^'\n]+)'?)"
        ),
        message="CUDA error",
        explanation=(
            "A CUDA call failed. CUDA errors are sticky and asynchronous: the line that reports it is often not the "
            "kernel that caused it, and NCCL's watchdog may be the first to notice."
        ),
        fix="Rerun the failing rank with CUDA_LAUNCH_BLOCKING=1 (debugging only) to get the real call site; check for Xid errors.",
        next_steps=(
            _step("Check the node's GPUs and kernel log for Xid errors.", f"{_CR}#cuda-error", "collect_env"),
        ),
    ),
    Rule(
        kind="gpu_xid",
        needles=("NVRM: Xid",),
        pattern=re.compile(
            r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+),(?: pid=(?P<pid>'?[^,]*'?),)?(?: name=(?P<name>[^,]*),)?\s*(?P<detail>.*)"
        ),
        severity="critical",
        message="GPU Xid error in the kernel log",
        explanation="The NVIDIA driver reported an Xid: a GPU-level fault (see facts.meaning).",
        fix="See facts.meaning; hardware Xids (48, 63, 64, 74, 79, 92, 94, 95) need the node drained and checked.",
        next_steps=(
            _step(
                "Collect the node's GPU state (ECC, Xid) and drain it if hardware.",
                f"{_CR}#gpu-xid",
                "collect_env",
            ),
        ),
    ),
    Rule(
        kind="exit_without_destroy",
        needles=(
            "terminate called without an active exception",
            "destroy_process_group() was not called",
            "process group has NOT been destroyed",
        ),
        message="aborted at exit ('terminate called without an active exception'): destroy_process_group() was not called",
        explanation=(
            "The script reached its end with the process group still alive: its backend threads (gloo's, "
            "NCCL's watchdog) were still joinable when the interpreter exited, so libstdc++ printed 'terminate "
            "called without an active exception' and aborted the rank (SIGABRT, exit -6), or torch warned "
            "that destroy_process_group() was not called. The training itself finished; the crash is at exit."
        ),
        fix=EXIT_WITHOUT_DESTROY_FIX,
        next_steps=(
            _step(
                "Add dist.destroy_process_group() at the end of main() on every rank and run again.",
                f"{_CR}#exit-without-destroy",
            ),
        ),
    ),
    Rule(
        kind="killed_by_signal",
        needles=("Signal ", "terminated with signal", "Segmentation fault", "Bus error", "Killed process"),
        pattern=re.compile(
            r"(?:Signal (?P<signum>\d+) \((?P<signal>SIG\w+)\) received by PID (?P<pid>\d+))"
            r"|(?:process (?P<rank>\d+) terminated with signal (?P<signal2>SIG\w+))"
            r"|(?:Killed process (?P<oom_pid>\d+) \((?P<oom_comm>[^)]*)\))"
            r"|(?P<crash>Segmentation fault|Bus error)"
        ),
        require_match=True,
        message="process killed by a signal",
        explanation="A rank process died from a signal.",
        fix="See facts.signal.",
        next_steps=(
            _step(
                "Check memory limits and the kernel log for the OOM killer.",
                f"{_CR}#killed-by-signal",
                "collect_env",
            ),
        ),
    ),
)

SIGNAL_MEANING: dict[str, tuple[Severity, str, str]] = {
    "SIGKILL": (
        "critical",
        "SIGKILL cannot be caught: on a training node it is most likely the kernel's OOM killer (host memory, not GPU), "
        "or a scheduler/cgroup limit (Slurm, Kubernetes memory limit: exit 137).",
        "Check `dmesg`/`journalctl -k` for 'Out of memory: Killed process'; lower host memory use (DataLoader workers, "
        "pinned memory, CPU offload) or raise the job's memory limit.",
    ),
    "SIGTERM": (
        "info",
        "SIGTERM is how torchrun stops the remaining ranks after one failed (or how a scheduler ends a job): the rank "
        "that received it is usually not the cause.",
        "Look for the rank that failed first with another error.",
    ),
    "SIGSEGV": (
        "critical",
        "A segmentation fault in native code (a C++/CUDA extension, a library version mismatch, or a corrupted install).",
        "Run with `python -X faulthandler` and PYTHONFAULTHANDLER=1 to get the Python stack; check versions with collect_env.",
    ),
    "SIGBUS": (
        "critical",
        "A bus error in a training process is almost always exhausted shared memory (/dev/shm) used by DataLoader workers.",
        "Enlarge /dev/shm (docker --shm-size) or lower num_workers.",
    ),
    "SIGABRT": (
        "error",
        "An abort: on an NCCL job usually the watchdog tearing the process down after a collective timeout "
        "or error (TORCH_NCCL_ASYNC_ERROR_HANDLING), which every rank that timed out gets; otherwise a failed "
        "C++ check.",
        "Read the lines before it on the same rank: a watchdog timeout or a c10::Error names the reason.",
    ),
    "SIGINT": (
        "info",
        "Interrupted (Ctrl-C or the launcher).",
        "Nothing to fix unless nobody pressed Ctrl-C.",
    ),
}

ASSERT_CUDA_ERROR: tuple[str, tuple[NextStep, ...]] = (
    "A kernel's assertion failed: the 'Assertion ... failed' line printed before this traceback names the "
    "kernel and the condition (the device_assert finding). A program bug, not a GPU fault: fix the op's "
    "inputs; CUDA_LAUNCH_BLOCKING=1 (debugging only) makes the traceback point at the right line.",
    (_step("Read the assertion and the op's inputs.", f"{_CR}#device-side-assert"),),
)
"""The fix and steps of a 'device-side assert triggered' CUDA error, which has nothing to do with Xids."""

XID_MEANING: dict[int, str] = {
    13: "Graphics engine exception: usually an application bug (illegal memory access); can be hardware if it repeats.",
    31: "GPU memory page fault: usually an application bug (illegal address), occasionally driver.",
    43: "GPU stopped processing: the application hit a fault; the GPU recovers.",
    45: "Preemptive cleanup after another error (the process was killed); look at the Xid before it.",
    48: "Double-bit ECC error: hardware; the GPU needs a reset and the node should be drained.",
    61: "Internal micro-controller breakpoint/warning: driver or firmware problem.",
    62: "Internal micro-controller halt: driver or firmware problem; reset the GPU.",
    63: "ECC page retirement or row remapping recorded: hardware memory fault.",
    64: "ECC page retirement or row remapping failure: hardware; drain the node.",
    74: "NVLink error: hardware or cabling; NCCL over NVLink will fail or hang.",
    79: "GPU has fallen off the bus: hardware, power or PCIe; drain the node.",
    92: "High single-bit ECC error rate: hardware degrading.",
    94: "Contained ECC error: the affected application must restart.",
    95: "Uncontained ECC error: all applications on the GPU are affected; reset the GPU.",
    109: "Context switch timeout: a kernel ran too long or the GPU hung.",
    119: "GSP RPC timeout: firmware/driver hang; reset the GPU.",
    120: "GSP error: firmware/driver fault; reset the GPU.",
}

SECTIONS: dict[str, str] = {
    "collective_timeout": f"{_CE}#collective-timeout",
    "peer_closed": f"{_CE}#peer-closed",
    "collective_mismatch": f"{_CE}#collective-mismatch",
    "nccl_error": f"{_CE}#nccl-error",
    "address_in_use": f"{_CE}#address-in-use",
    "rendezvous_failure": f"{_CE}#rendezvous-failure",
    "unused_parameters": f"{_CR}#unused-parameters",
    "cuda_oom": "skill/oom.md",
    "killed_by_signal": f"{_CR}#killed-by-signal",
    "exit_without_destroy": f"{_CR}#exit-without-destroy",
    "dataloader_worker_killed": f"{_CR}#dataloader-worker-killed",
    "shm_exhausted": f"{_CR}#shm-exhausted",
    "cuda_error": f"{_CR}#cuda-error",
    "gpu_xid": f"{_CR}#gpu-xid",
    "duplicate_gpu": f"{_CE}#gpu-shared",
    "device_assert": f"{_CR}#device-side-assert",
    "thread_died": f"{_CR}#thread-died",
    "launcher_stopped": f"{_CR}#dead-job",
    "child_failed": f"{_CR}#child-failed",
}

ALL_NEEDLES: tuple[str, ...] = tuple(dict.fromkeys(n for r in RULES for n in r.needles))
