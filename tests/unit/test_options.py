"""Every option reaches every path: the local capture, ssh, srun, kubectl and the debug server.

A face builds one :class:`DumpOptions` and every layer below takes it whole. These tests set each
field, alone, to a value other than its default and prove that it arrives where it acts: in
py-spy's command line and the capture's own steps on this host; in the ``rankscope stacks``
command each remote host runs (read back with the CLI's own parser, so a flag the parser would
read differently fails too); and, for the debug server, in what it asks the ranks' servers or in
the note that says why it cannot apply it. A new field without a flag, or without a value here,
fails :func:`test_every_field_is_covered` until it is wired through.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rankscope.capabilities import discovery, judge, remote, stacks
from rankscope.capabilities.recorder import debug_server
from rankscope.cli import build_parser
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess, RankStack, StacksReport, ThreadStack, Verdict
from rankscope.options import (
    DEFAULTS,
    OPTION_FLAGS,
    DumpOptions,
    StacksTarget,
    option_flags,
)
from rankscope.runtime import net, pyspy, subproc
from tests.paths import DATA

ASKED: dict[str, Any] = {
    "native": True,
    "locals": True,
    "nonblocking": True,
    "counters": False,
    "flight_recorder": False,
    "ras": True,
    "window": 7.5,
    "timeout": 33.0,
}
"""A value other than the default for every field of DumpOptions."""

FIELDS = [f.name for f in dataclasses.fields(DumpOptions)]


def _asked(name: str) -> DumpOptions:
    return dataclasses.replace(DEFAULTS, **{name: ASKED[name]})


def test_every_field_is_covered() -> None:
    """A new option needs its flag (so it reaches the other hosts) and a value in this test."""
    assert set(OPTION_FLAGS) == set(FIELDS) == set(ASKED)
    assert set(pyspy.DUMP_FLAGS) <= set(FIELDS)
    assert set(debug_server.DEBUG_SERVER_LIMITS) | {"timeout", "flight_recorder"} == set(FIELDS)
    for name in FIELDS:
        assert getattr(_asked(name), name) != getattr(DEFAULTS, name), name


def _parsed(argv: list[str]) -> DumpOptions:
    """``rankscope stacks ARGV`` as the CLI reads it: the options it would capture with."""
    parser, _ = build_parser("stacks")
    return DumpOptions.from_values(parser.parse_args(["stacks", *argv]))


@pytest.mark.parametrize("name", FIELDS)
def test_the_cli_reads_back_every_flag(name: str) -> None:
    """The flags a host is given are the flags the CLI reads: each option survives the trip."""
    options = _asked(name)
    assert _parsed(option_flags(options)) == options
    assert _parsed([]) == DEFAULTS


# ---------------------------------------------------------------------------------------------
# Remote hosts: ssh, srun, kubectl run the real argv builders; only the process is not started
# ---------------------------------------------------------------------------------------------


def _report(host: str, ranks: list[int]) -> StacksReport:
    procs = [RankProcess(rank=r, pid=100 + r, host=host) for r in ranks]
    return StacksReport(
        job=Job(job_id="j", world_size=2, ranks=procs, hosts=[host]),
        verdict=Verdict(kind="inconclusive", summary="x"),
        stacks=[RankStack(rank=r, pid=100 + r, host=host) for r in ranks],
    )


@dataclass
class _Runs:
    """What the fan-out asked to run: each argv and the time it was given."""

    calls: list[tuple[list[str], float]] = field(default_factory=list)

    def run(self, argv: list[str], timeout: float, env: Any = None) -> subproc.Completed:
        self.calls.append((argv, timeout))
        if argv[0] == "srun":
            out = "\n".join(
                f"{i}: {line}"
                for i, host in enumerate(("n1", "n2"))
                for line in _report(host, [i]).model_dump_json(indent=1).splitlines()
            )
            return subproc.Completed(0, out, "", False, 0.1)
        host = "n1" if "n1" in argv else "n2"
        return subproc.Completed(
            0, _report(host, [0 if host == "n1" else 1]).model_dump_json(), "", False, 0.1
        )


def _remote_command(via: str, argv: list[str]) -> list[str]:
    """The ``rankscope stacks ...`` command inside one ssh/srun/kubectl command line (inside the
    ``sh -c SCRIPT rankscope ARGS`` that looks for rankscope on the host, when it is not given)."""
    if via == "ssh":
        command = shlex.split(argv[argv.index("--") + 1])
    elif via == "kubectl":
        command = argv[argv.index("--") + 1 :]
    else:
        command = argv[argv.index("--kill-on-bad-exit=0") + 1 :]
    return ["rankscope", *command[4:]] if command[:2] == ["sh", "-c"] else command


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> _Runs:
    seen = _Runs()
    monkeypatch.setattr(remote, "_run", seen.run)
    monkeypatch.setattr(remote, "_need", lambda binary, via: None)
    return seen


@pytest.mark.parametrize("via", ["ssh", "srun", "kubectl"])
@pytest.mark.parametrize("name", FIELDS)
def test_every_option_reaches_every_remote_host(name: str, via: str, runs: _Runs) -> None:
    options = _asked(name)
    job = "4242" if via == "srun" else None
    report = remote.dump_stacks_remote(StacksTarget(hosts=("n[1-2]",), via=via, job=job), options, pid=7)  # type: ignore[arg-type]
    assert sorted(r.rank for r in report.job.ranks) == [0, 1]
    assert len(runs.calls) == (1 if via == "srun" else 2)
    for argv, wall in runs.calls:
        command = _remote_command(via, argv)
        assert command[:4] == ["rankscope", "stacks", "--local", "--json"]
        assert command[4:6] == ["--pid", "7"]
        # every option arrives, the timeout a share of ours so the host answers before we give up
        assert _parsed(command[4:]) == options.for_remote_host()
        assert _parsed(command[4:]).timeout < options.timeout
        # and the host is waited for as long as its timeout and window take
        assert wall >= options.timeout + options.window


# ---------------------------------------------------------------------------------------------
# The debug server: what it asks each rank's server, or the note that says why not
# ---------------------------------------------------------------------------------------------

FAULTHANDLER = (
    "Thread 0x00007fdba67ccb80 (most recent call first):\n"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
    '  File "/job/train.py", line 41 in main\n'
    '  File "/job/train.py", line 46 in <module>\n'
)


@pytest.mark.parametrize("name", FIELDS)
def test_every_option_reaches_the_debug_server_or_is_named(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, float]] = []
    store: list[float] = []

    def post(url: str, timeout: float, limit: int) -> bytes:
        asked.append((url.rsplit("/", 1)[-1], timeout))
        return FAULTHANDLER.encode() if url.endswith("dump_traceback") else b"{}"

    def urls(addr: str, port: int, timeout: float) -> list[str]:
        store.append(timeout)
        return ["http://h0:1", "http://h1:1"]

    monkeypatch.setattr(debug_server, "debug_server_urls", urls)
    monkeypatch.setattr(net, "http_post", post)

    def collect(options: DumpOptions) -> tuple[StacksReport, list[tuple[str, float]]]:
        asked.clear()
        target = StacksTarget(hosts=("127.0.0.1:29500",), via="debug-server")
        return remote.dump_stacks_remote(target, options), list(asked)

    plain, plain_asked = collect(DEFAULTS)
    report, seen = collect(_asked(name))
    assert {what for what, _ in plain_asked} == {"dump_traceback", "fr_trace_json"}
    if name == "timeout":
        assert {t for _, t in seen} == {ASKED["timeout"]} and store[-1] == min(ASKED["timeout"], 15.0)
    elif name == "flight_recorder":
        assert {what for what, _ in seen} == {"dump_traceback"}  # no recorder traces asked for
    else:
        [note] = [n for n in report.job.notes if "debug server" in n]
        assert OPTION_FLAGS[name] in note and debug_server.DEBUG_SERVER_LIMITS[name] in note, note
        assert OPTION_FLAGS[name] not in " ".join(plain.job.notes)


# ---------------------------------------------------------------------------------------------
# This host: py-spy's command line and each step of the capture, with the processes faked
# ---------------------------------------------------------------------------------------------


def _frame(name: str, file: str, line: int, locals_: list[dict[str, Any]] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "filename": file, "line": line}
    if locals_ is not None:
        out["locals"] = locals_
    return out


def _pyspy_json(pid: int, argv: list[str]) -> list[dict[str, Any]]:
    """What py-spy prints for rank ``pid - 100``: rank 0 in all_reduce, rank 1 in barrier, under a
    loop whose counter ``step`` is a local (printed only with --locals)."""
    op = "all_reduce" if pid == 100 else "barrier"
    with_locals = "--locals" in argv
    step = [{"name": "step", "repr": "5", "arg": False}] if with_locals else None
    frames = [
        _frame(op, "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2000, None),
        _frame("main", "/job/train.py", 41, step),
        _frame("<module>", "/job/train.py", 46, None),
    ]
    return [{"thread_id": 1, "os_thread_id": pid, "thread_name": "MainThread", "frames": frames}]


@dataclass
class _Capture:
    """What a local capture did: py-spy command lines and timeouts, and the steps it took."""

    argvs: list[list[str]] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)
    window_s: list[float] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)


class _FakeWindow:
    """A progress window that does not wait: it notes how long it was asked to last."""

    seen: _Capture

    def __init__(self) -> None:
        self.started = 0.0
        self.pids: list[int] = []

    @classmethod
    def open(cls, pids: list[int], exe: str) -> _FakeWindow:
        window = cls()
        window.pids = pids
        return window

    def first_look(self, pid: int, threads: list[ThreadStack] | None) -> None:
        pass

    def sample(self, procs: list[RankProcess], states: dict[int, str]) -> None:
        pass

    def close(self, until: float, last_look: Any) -> tuple[list[Any], dict[int, list[ThreadStack]]]:
        self.seen.window_s.append(until - self.started)
        return [], last_look(self.pids)

    def stop(self) -> dict[int, Any]:
        return {}


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Capture]:
    seen = _Capture()
    ranks = [
        RankProcess(rank=r, pid=100 + r, host="h", launcher="torchrun", state="sleeping") for r in (0, 1)
    ]
    job = Job(job_id="j", launcher="torchrun", world_size=2, ranks=ranks, hosts=["h"], backend="gloo")

    class Proc:
        def __init__(self, argv: list[str]) -> None:
            self.argv = argv

    def start(pid: int, options: DumpOptions, exe: str | None = None) -> Proc:
        argv = pyspy.dump_argv(pid, options, exe or "py-spy")
        seen.argvs.append(argv)
        seen.timeouts.append(options.timeout)
        return Proc(argv)

    def finish(proc: Proc) -> list[dict[str, Any]]:
        return _pyspy_json(int(proc.argv[proc.argv.index("--pid") + 1]), proc.argv)

    def step(name: str, result: Any) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            seen.steps.append(name)
            return result

        return record

    _FakeWindow.seen = seen
    monkeypatch.setattr(pyspy, "check_pyspy", lambda exe=None: "py-spy")
    monkeypatch.setattr(pyspy, "start_dump", start)
    monkeypatch.setattr(pyspy, "finish_dump", finish)
    monkeypatch.setattr(pyspy, "wait_first", lambda started: started[0])
    monkeypatch.setattr(discovery, "find_job", lambda pid=None, job_id=None: job)
    monkeypatch.setattr(discovery, "proc_state", lambda pid: "sleeping")
    monkeypatch.setattr(discovery, "read_environ", lambda pid: {})
    monkeypatch.setattr(stacks, "Window", _FakeWindow)
    monkeypatch.setattr(stacks, "gpu_utilisation", lambda job: {})
    monkeypatch.setattr(stacks, "find_probes", lambda job: {})
    monkeypatch.setattr(stacks, "pick_up", step("flight recorder: this run's dumps", None))
    monkeypatch.setattr(
        judge, "exception_dump_note", step("flight recorder: the store's exception dump", None)
    )
    monkeypatch.setattr(judge, "debug_server_flight", step("flight recorder: the debug server", None))
    monkeypatch.setattr(stacks, "worker_servers", lambda job: True)
    monkeypatch.setattr(stacks, "read_ras", step("NCCL RAS", (None, "RAS read")))
    monkeypatch.setattr(stacks, "source_lines", lambda stacks_: {})
    yield seen


def _counters(report: StacksReport) -> dict[int, dict[str, int]]:
    return {s.rank or 0: s.counters for s in report.stacks if s.counters}


def _kept_locals(report: StacksReport) -> bool:
    return any(f.locals for s in report.stacks for t in s.threads for f in t.frames)


@pytest.mark.parametrize("name", FIELDS)
def test_every_option_reaches_the_local_capture(name: str, capture: _Capture) -> None:
    plain = stacks.dump_stacks(None, DEFAULTS)
    before = dataclasses.replace(capture)
    capture.argvs, capture.timeouts, capture.window_s, capture.steps = [], [], [], []
    options = _asked(name)
    report = stacks.dump_stacks(None, options)
    first = capture.argvs[:2]  # the capture's own dump of each rank
    if name in pyspy.DUMP_FLAGS:
        assert all(pyspy.DUMP_FLAGS[name] in argv for argv in first), first
        assert not all(pyspy.DUMP_FLAGS[name] in argv for argv in before.argvs[:2]) or name == "locals"
    if name == "locals":  # the window reads locals anyway; asked for, they stay in the answer
        assert _kept_locals(report) and not _kept_locals(plain)
    if name == "nonblocking":
        assert all("--nonblocking" in argv for argv in capture.argvs)
    if name == "timeout":
        assert set(capture.timeouts) == {ASKED["timeout"]} and set(before.timeouts) == {DEFAULTS.timeout}
    if name == "window":
        assert capture.window_s == [ASKED["window"]] and before.window_s == [DEFAULTS.window]
    if name == "counters":
        assert _counters(plain) and not _counters(report)
    if name == "flight_recorder":
        recorder = {s for s in before.steps if s.startswith("flight recorder")}
        assert recorder and not recorder & set(capture.steps)
    if name == "ras":
        assert "NCCL RAS" in capture.steps and "NCCL RAS" not in before.steps
    assert report.verdict.kind == plain.verdict.kind == "mismatched_collectives"


def test_a_native_single_look_reads_its_counters_from_its_own_dumps(capture: _Capture) -> None:
    """A ``--native`` dump loads libtorch's symbols (most of a second of CPU per rank); taking
    locals in it costs almost nothing more, and spares the second round of dumps a single look
    otherwise makes for the counters. The answer is the same, locals still dropped."""
    one_pass = stacks.dump_stacks(None, DumpOptions(native=True, window=0))
    assert len(capture.argvs) == 2  # one dump per rank, no second pass
    assert all("--native" in argv and "--locals" in argv for argv in capture.argvs), capture.argvs
    assert _counters(one_pass) == {0: {"train.py:main:step": 5}, 1: {"train.py:main:step": 5}}
    assert stacks.SAME_DUMP_COUNTERS in one_pass.job.notes and not _kept_locals(one_pass)
    capture.argvs = []
    two_passes = stacks.dump_stacks(None, DumpOptions(window=0))
    assert len(capture.argvs) == 4 and not any("--locals" in argv for argv in capture.argvs[:2])
    assert _counters(two_passes) == _counters(one_pass)
    assert one_pass.verdict == two_passes.verdict


def test_a_bad_value_is_refused_where_the_options_are_built() -> None:
    with pytest.raises(InvalidInput, match="window"):
        DumpOptions(window=500)
    with pytest.raises(InvalidInput, match="timeout"):
        DumpOptions(timeout=0)


def test_the_target_parses_hosts_once_and_says_whether_it_is_remote() -> None:
    assert StacksTarget().remote is False
    assert StacksTarget(via="srun").remote and StacksTarget(via="kubectl", job="bert").remote
    # the CLI's one string and the MCP list (cut at every comma by some clients) agree
    one = StacksTarget(hosts=("node[01-03,07],gpu-a1",))
    assert one.hosts == ("node01", "node02", "node03", "node07", "gpu-a1") and one.remote
    assert StacksTarget(hosts=("node[01-03", "07]", "gpu-a1")) == one
    assert StacksTarget(hosts="node[01-03,07],gpu-a1") == one  # type: ignore[arg-type]  # the text itself
    assert dataclasses.replace(one, via="local").hosts == one.hosts  # parsing twice changes nothing
    assert json.dumps(list(StacksTarget(hosts=("ssh://u@[::1]:22",)).hosts or ())) == '["ssh://u@[::1]:22"]'
    for bad in (
        dict(hosts=()),
        dict(via="carrier-pigeon"),
        dict(namespace="ml"),
        dict(job="1234"),
        dict(hosts=("n1",), rankscope_cmd=" "),
    ):
        with pytest.raises(InvalidInput):
            StacksTarget(**bad)  # type: ignore[arg-type]


def test_a_window_asks_the_recorder_once_at_each_end(
    capture: _Capture, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Ranks that opened a channel are asked for a dump at the window's start (the capture's
    recorder and the window's first end at once) and at its end: twice in all, never three times."""
    from rankscope.capabilities.recorder import pickup

    folder = DATA / "flight" / "gloo_skip"
    asked: list[list[Path]] = []

    def request(job: Job, have: list[Path], **kw: Any) -> list[Path]:
        asked.append(list(have))
        return [folder / f"fr_trace_rank_{r}" for r in (0, 1)]

    probe = pickup.Probe(dump_dir=tmp_path, signal=10)
    monkeypatch.setattr(stacks, "find_probes", lambda job: {100: probe, 101: probe})
    monkeypatch.setattr(pickup, "request_dumps", request)
    monkeypatch.setattr(pickup, "find_dumps", lambda job, environs=None, probes=None: [])
    report = stacks.dump_stacks(None, DEFAULTS)
    assert asked == [[], []]  # fresh at both ends, whatever the ranks wrote before
    assert "flight recorder: 2 dump(s) this run wrote, analysed with the stacks" in report.job.notes
    assert "flight recorder: this run's dumps" not in capture.steps  # the one ask served the pickup too
