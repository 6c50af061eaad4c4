"""How ``rankscope stacks`` finds a rank that runs rankscope.probe's flight recorder: the marker the
rank holds open (/proc/PID/fd) and the handler it installed (SigCgt in /proc/PID/status)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from rankscope.capabilities.recorder.pickup import Probe, probe_of
from rankscope.probe.flight import MARKER_PREFIX
from rankscope.runtime import procfs


def test_a_held_marker_names_the_dump_folder_and_signal(tmp_path: Path) -> None:
    marker = tmp_path / f"{MARKER_PREFIX}{os.getpid()}.json"
    marker.write_text(json.dumps({"signal": int(signal.SIGUSR2), "pid": os.getpid()}))
    assert probe_of(os.getpid()) is None  # written but not held: a dead rank's leftover
    with open(marker, "rb"):
        assert probe_of(os.getpid()) == Probe(dump_dir=tmp_path, signal=int(signal.SIGUSR2))
        assert Probe(tmp_path, 12).trace(3) == tmp_path / "fr_trace_rank_3"


def test_a_broken_marker_is_no_probe(tmp_path: Path) -> None:
    marker = tmp_path / f"{MARKER_PREFIX}1.json"
    marker.write_text("{not json")
    with open(marker, "rb"):
        assert probe_of(os.getpid()) is None


def test_caught_signals_reads_the_handlers_installed() -> None:
    # Python's own KeyboardInterrupt handler, set here: a suite started in the background
    # (``cmd &`` in a script) inherits SIGINT ignored, and Python then leaves it so
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert signal.SIGINT in procfs.caught_signals(os.getpid())
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.SIG_DFL)
    previous = signal.signal(signal.SIGUSR2, lambda s, f: None)
    try:
        assert signal.SIGUSR2 in procfs.caught_signals(os.getpid())
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert signal.SIGUSR2 not in procfs.caught_signals(os.getpid())
    assert procfs.caught_signals(2**22 + 12345) == frozenset()  # no such process


def test_listening_on_any_ipv6_is_the_sign_of_a_worker_server() -> None:
    import socket

    me = os.getpid()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as v4:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        assert v4.fileno() >= 0 and not procfs.listens_on_any_ipv6(me)  # gloo/NCCL bind one address
    try:
        v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:  # a kernel without IPv6 has no such listener either
        assert not procfs.listens_on_any_ipv6(me)
        return
    with v6:
        v6.bind(("::", 0))
        assert not procfs.listens_on_any_ipv6(me)  # bound, not listening
        v6.listen()
        assert procfs.listens_on_any_ipv6(me)
        assert procfs.socket_inodes(me)
    assert not procfs.listens_on_any_ipv6(me)
