"""What a suspect's DataLoader worker waits on, in words: the pure half of following a rank into its
children (the shell dumps them and reads /proc; tests/integration/test_workers_live.py runs it)."""

from __future__ import annotations

from rankscope.analysis.hang.workers import (
    KernelWait,
    kernel_phrase,
    thread_busy,
    unread_worker_line,
    waits_on_children,
    waits_on_threads,
    worker_busy,
    worker_line,
)
from rankscope.models.core import Frame

TORCH = "/venv/lib/python3.11/site-packages/torch/"
STDLIB = "/usr/lib/python3.11/"
DATA = "/job/data.py"

WORKER = [
    Frame(function="ShardDataset.__getitem__", file=DATA, line=29),
    Frame(function="_MapDatasetFetcher.fetch", file=f"{TORCH}utils/data/_utils/fetch.py", line=54),
    Frame(function="_worker_loop", file=f"{TORCH}utils/data/_utils/worker.py", line=374),
]
IDLE = [
    Frame(function="Connection._poll", file=f"{STDLIB}multiprocessing/connection.py", line=440),
    Frame(function="Queue.get", file=f"{STDLIB}multiprocessing/queues.py", line=113),
    Frame(function="_worker_loop", file=f"{TORCH}utils/data/_utils/worker.py", line=330),
]
RANK = [
    Frame(function="Connection._poll", file=f"{STDLIB}multiprocessing/connection.py", line=440),
    Frame(function="_BaseDataLoaderIter.__next__", file=f"{TORCH}utils/data/dataloader.py", line=725),
    Frame(function="main", file="/job/train.py", line=42),
]


def test_a_rank_in_its_dataloader_waits_on_its_children_and_a_worker_on_data_is_busy() -> None:
    assert waits_on_children(RANK) and not waits_on_children(RANK[2:])
    assert worker_busy(WORKER) and not worker_busy(IDLE) and not worker_busy([])


def test_a_worker_waiting_for_work_deep_in_its_queue_get_is_idle() -> None:
    """Its index queue's get reaches selectors' poll (Python 3.11): still waiting for work, not on data;
    a worker fetching is busy wherever it waits (a file, a lock, a queue of the dataset's own)."""
    deep = [Frame(function="_PollLikeSelector.select", file=f"{STDLIB}selectors.py", line=415), *IDLE]
    assert not worker_busy(deep)
    in_queue = [Frame(function="Queue.get", file=f"{STDLIB}queue.py", line=180), *WORKER]
    assert worker_busy(in_queue)


def test_the_workers_line_and_what_it_waits_on() -> None:
    fifo = KernelWait(
        wchan="wait_for_partner", syscall="openat", path="/data/shard2", kind="fifo", fstype="ext4"
    )
    line = worker_line(2, 311, WORKER, fifo, {(DATA, 29): '        with open(self.path, "rb") as f:'})
    assert line == (
        "rank 2's DataLoader worker (pid 311) waits at data.py:29 in ShardDataset.__getitem__ "
        '(`with open(self.path, "rb") as f:`), in the kernel at wait_for_partner (openat /data/shard2, a FIFO '
        "(named pipe) that no process has opened from the other end: the open blocks until one does)"
    )


def test_kernel_waits_in_words() -> None:
    pipe = KernelWait(wchan="pipe_read", syscall="read", path="pipe:[123]", kind="pipe")
    assert (
        kernel_phrase(pipe) == "in the kernel at pipe_read (read pipe:[123], a pipe: no process writes to it)"
    )
    nfs = KernelWait(
        wchan="rpc_wait_bit_killable", syscall="read", path="/mnt/d/x.bin", kind="file", fstype="nfs4"
    )
    assert "/mnt/d/x.bin on nfs4: a network file system that does not answer" in kernel_phrase(nfs)
    lock = KernelWait(wchan="futex_do_wait", syscall="futex")
    assert (
        kernel_phrase(lock)
        == "in the kernel at futex_do_wait (a lock or condition (futex) another thread or process holds)"
    )
    sock = KernelWait(wchan="sk_wait_data", syscall="recvfrom", path="socket:[9]", kind="socket")
    assert kernel_phrase(sock) == "in the kernel at sk_wait_data (recvfrom socket:[9], a socket)"
    assert kernel_phrase(KernelWait()) == "in the kernel"


def test_a_rank_waiting_on_its_own_threads_and_the_thread_that_is_busy() -> None:
    """The main thread in queue.Queue.get waits on its threads; a thread in the job's own code (an
    open() that never returns) is busy; one idle in a queue, or torch's own with no user frame, is not."""
    waiting = [
        Frame(function="Condition.wait", file=f"{STDLIB}threading.py", line=327),
        Frame(function="Queue.get", file=f"{STDLIB}queue.py", line=171),
        Frame(function="main", file="/job/train.py", line=42),
    ]
    assert waits_on_threads(waiting) and not waits_on_threads(RANK[2:])
    reader = [WORKER[0], Frame(function="read_shards", file=DATA, line=40)]
    assert thread_busy(reader) and not thread_busy(waiting[:2]) and not thread_busy(IDLE)
    pin = [Frame(function="_pin_memory_loop", file=f"{TORCH}utils/data/_utils/pin_memory.py", line=50)]
    assert not thread_busy(pin)
    line = worker_line(2, 77, reader, KernelWait(wchan="futex_do_wait", syscall="futex"), {}, "thread reader")
    assert line.startswith(
        "rank 2's thread reader (tid 77) waits at data.py:29 in ShardDataset.__getitem__, "
    )


def test_a_worker_in_a_librarys_dataset_is_placed_in_its_own_frames_not_its_parents() -> None:
    """A forked worker's stack goes on below _worker_loop with its rank's frames (main): a dataset of
    an installed package has no user frame above the loop, so the worker's innermost frame is named."""
    hub = "/venv/lib/python3.11/site-packages/hub/data.py"
    frames = [
        Frame(function="Remote.read", file=hub, line=88),
        Frame(function="HubDataset.__getitem__", file=hub, line=40),
        Frame(function="_MapDatasetFetcher.fetch", file=f"{TORCH}utils/data/_utils/fetch.py", line=54),
        Frame(function="_worker_loop", file=f"{TORCH}utils/data/_utils/worker.py", line=374),
        Frame(function="main", file="/job/train.py", line=42),
    ]
    line = worker_line(2, 311, frames, KernelWait(wchan="sk_wait_data", syscall="recvfrom"), {})
    assert line.startswith("rank 2's DataLoader worker (pid 311) waits at hub/data.py:88 in Remote.read, "), (
        line
    )


def test_a_worker_whose_stack_cannot_be_read_still_says_where_it_sleeps() -> None:
    """A worker in D state on a dead NFS mount cannot be attached; its kernel wait still tells."""
    nfs = KernelWait(
        wchan="rpc_wait_bit_killable", syscall="read", path="/mnt/d/x.bin", kind="file", fstype="nfs4"
    )
    line = unread_worker_line(2, 311, "in D state: uninterruptible sleep", nfs)
    assert line is not None and line.startswith(
        "rank 2's DataLoader worker (pid 311) could not be read (in D state: uninterruptible sleep), in the kernel "
        "at rpc_wait_bit_killable (read /mnt/d/x.bin on nfs4: a network file system that does not answer)"
    ), line
    assert unread_worker_line(2, 311, "py-spy: gone", KernelWait(wchan="0")) is None
