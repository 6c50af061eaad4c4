"""The watch folder (issue 42): the models a watcher writes and triage reads, round-tripped through
the one helper both sides use, owner-only, redacted, atomic, bounded."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rankscope.capabilities import watch_folder as wf
from rankscope.errors import InvalidInput, NothingToRead
from rankscope.models.core import Frame, Job, RankStack, ThreadStack
from rankscope.models.look import HostLook
from rankscope.models.watch import (
    IncidentManifest,
    IncidentPiece,
    WatchAttempt,
    WatchManifest,
    WatchSelection,
    WatchSettings,
)

SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def _settings() -> WatchSettings:
    return WatchSettings(
        interval_s=2.0,
        stall_s=20.0,
        job_timeout_s=1800.0,
        job_timeout_source="env",
        max_incidents=3,
        max_incident_bytes=1 << 20,
    )


def _watch() -> WatchManifest:
    return WatchManifest(
        selection=WatchSelection(folder="/tmp/job", job_id="42"),
        watcher_pid=123,
        watcher_host="node1",
        started_at=wf.utc_now(),
        state="watching",
        job_id="42",
        command=["torchrun", f"--token={SECRET}", "train.py"],
        attempts=[WatchAttempt(n=1, first_seen=wf.utc_now(), pids={"node1": [10, 11]})],
        settings=_settings(),
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_watch_manifest_round_trips_owner_only_and_redacted(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    wf.write_watch(folder, _watch())
    back = wf.read_watch(folder)
    assert back.job_id == "42" and back.attempts[0].pids == {"node1": [10, 11]}
    assert back.settings.job_timeout_source == "env"
    assert SECRET not in (folder / "watch.json").read_text()
    assert _mode(folder) == 0o700 and _mode(folder / "watch.json") == 0o600
    assert wf.is_watch_folder(folder) and not wf.is_watch_folder(tmp_path)


def test_incident_written_first_incomplete_then_complete_with_its_look(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    when = "2026-11-28T03:00:12+00:00"
    name = wf.incident_name(1, when)
    assert name == "001-20261128T030012Z"
    path = wf.new_incident(folder, IncidentManifest(name=name, stall_suspected_at=when))
    assert not wf.read_incident(path).complete  # a watcher killed now leaves this
    frames = [Frame(function="read_shard", file="/job/train.py", line=12)]
    look = HostLook(
        host="node1",
        job=Job(job_id="42"),
        stacks=[
            RankStack(
                rank=2, pid=12, host="node1", threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
            )
        ],
    )
    size = wf.write_look(path, look)
    piece = IncidentPiece(name="look", file=wf.look_file("node1"), captured_at=wf.utc_now(), bytes=size)
    done = wf.read_incident(path).model_copy(update={"pieces": [piece], "complete": True})
    wf.write_incident(path, done)
    assert wf.read_incident(path).complete
    assert [lk.stacks[0].rank for lk in wf.read_looks(path)] == [2]
    assert _mode(path / "look-node1.json") == 0o600 and _mode(path) == 0o700
    view = wf.read_view(folder) if wf.is_watch_folder(folder) else None
    assert view is None  # no watch.json yet: only the incident was written
    wf.write_watch(folder, _watch())
    view = wf.read_view(folder)
    assert [i.looks for i in view.incidents] == [["look-node1.json"]]


def test_prune_keeps_the_newest_incidents(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    for n in range(1, 5):
        when = f"2026-11-28T03:00:1{n}+00:00"
        wf.new_incident(folder, IncidentManifest(name=wf.incident_name(n, when), stall_suspected_at=when))
    assert wf.prune_incidents(folder, keep=2) == ["001-20261128T030011Z", "002-20261128T030012Z"]
    assert [p.name[:3] for p in wf.incident_paths(folder)] == ["003", "004"]


def test_a_folder_no_watch_wrote_gets_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NothingToRead) as missing:
        wf.read_watch(tmp_path)
    assert "watch --out" in missing.value.fix
    (tmp_path / "watch.json").write_text("{ cut sh")
    with pytest.raises(InvalidInput):
        wf.read_watch(tmp_path)


def test_text_pieces_are_redacted(tmp_path: Path) -> None:
    wf.write_text(tmp_path / "logs" / "rank0.log", f"HF_TOKEN={SECRET}\nstep 3\n")
    text = (tmp_path / "logs" / "rank0.log").read_text()
    assert SECRET not in text and "step 3" in text
    assert wf.seconds_between("2026-11-28T03:00:00+00:00", "2026-11-28T03:01:30+00:00") == 90.0


def test_a_detached_watch_is_given_flags_the_watch_command_takes(tmp_path: Path) -> None:
    from rankscope.capabilities.watch import WatchConfig
    from rankscope.capabilities.watch_start import detach_argv
    from rankscope.cli import build_parser
    from rankscope.options import DumpOptions

    config = WatchConfig(
        out=tmp_path / "w",
        selection=WatchSelection(folder=str(tmp_path), pid=123, job_id="torchrun:x"),
        interval_s=0.5,
        stall_s=3,
        busy_stall_s=9,
        confirm_s=0.5,
        resume_s=2,
        job_timeout_s=30,
        linger_s=5,
        max_incidents=4,
        max_incident_bytes=1 << 20,
        options=DumpOptions(window=2, timeout=10, native=True),
    )
    argv = detach_argv(config)
    assert "--detach" not in argv
    parser, _ = build_parser("watch")
    args = parser.parse_args(argv[3:])
    assert (args.pid, args.job, args.stall, args.busy_stall, args.linger) == (123, "torchrun:x", 3, 9, 5)
    assert (args.max_incident_bytes, args.window, args.native) == (1 << 20, 2, True)


def test_bad_watch_settings_and_other_hosts_get_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.cli import main

    assert main(["watch", "--out", str(tmp_path), "--interval", "0"]) == 2
    assert "interval_s must be positive" in capsys.readouterr().err
    assert main(["watch", "--out", str(tmp_path), "--hosts", "a,b"]) == 2
    err = capsys.readouterr().err
    assert "--hosts" in err and "Fix:" in err
