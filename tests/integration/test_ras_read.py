"""The RAS client against a server that speaks NCCL's client protocol (src/ras/client_support.cc:
``CLIENT PROTOCOL`` -> ``SERVER PROTOCOL 2``, ``TIMEOUT``/``SET FORMAT`` -> ``OK`` or ``ERROR``,
``STATUS`` -> the report, then the server closes), and ``stacks --ras`` on a live job."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rankscope.api import dump_stacks
from rankscope.capabilities.ras_read import query, ras_address, read_ras
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess
from rankscope.options import DumpOptions
from tests.jobs import JobFactory

DATA = Path(__file__).parents[1] / "data" / "ras"
READY_S = 90.0


class FakeRas:
    """A RAS listener: answers each ``STATUS`` with the next of ``answers`` (the last one repeats)."""

    def __init__(self, answers: list[str], *, json_format: bool = True, greeting: str | None = None) -> None:
        self.answers = answers
        self.json_format = json_format
        self.greeting = greeting
        self.commands: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        served = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                served += self._session(conn, served)

    def _session(self, conn: socket.socket, served: int) -> int:
        buf = b""
        json_on = False
        while True:
            while b"\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return 0
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            cmd = line.decode().strip()
            self.commands.append(cmd)
            if self.greeting is not None:
                conn.sendall(self.greeting.encode())
                return 0
            upper = cmd.upper()
            if upper.startswith("CLIENT PROTOCOL "):
                conn.sendall(b"SERVER PROTOCOL 2\n")
            elif upper.startswith("TIMEOUT "):
                conn.sendall(b"OK\n")
            elif upper == "SET FORMAT JSON":
                json_on = self.json_format
                conn.sendall(b"OK\n" if self.json_format else b"ERROR: Unknown command SET FORMAT json\n")
            elif upper == "STATUS":
                answer = self.answers[min(served, len(self.answers) - 1)]
                assert answer.lstrip().startswith("{") == json_on
                conn.sendall(answer.encode())
                return 1
            else:
                conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())

    def close(self) -> None:
        self.sock.close()


@contextmanager
def fake_ras(answers: list[str], **kw: object) -> Iterator[FakeRas]:
    server = FakeRas(answers, **kw)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.close()


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_query_speaks_the_protocol_and_reads_json() -> None:
    with fake_ras([text("status_rank5_behind.json")]) as ras:
        status = query("127.0.0.1", ras.port)
    assert status.format == "json" and status.communicators[0].ranks[5].launched == 312
    assert ras.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]


def test_a_server_without_json_answers_in_text() -> None:
    with fake_ras([text("status_text_mismatch.txt")], json_format=False) as ras:
        status = query("127.0.0.1", ras.port)
    assert status.format == "text" and status.communicators[0].ranks[0].comm_rank == 5


def test_something_else_on_the_port_is_not_ras() -> None:
    with (
        fake_ras([""], greeting="HTTP/1.1 400 Bad Request\r\n\r\n") as ras,
        pytest.raises(InvalidInput, match="is not NCCL RAS"),
    ):
        query("127.0.0.1", ras.port)


def _job(env_pids: int = 8) -> Job:
    return Job(
        job_id="j",
        world_size=8,
        ranks=[RankProcess(rank=r, pid=41000 + r, host="h") for r in range(env_pids)],
    )


def test_read_ras_twice_finds_the_rank_that_stays_behind() -> None:
    answers = [text("status_rank5_behind.json"), text("status_rank5_behind_again.json")]
    with fake_ras(answers) as ras:
        env = {41000: {"NCCL_RAS_ADDR": f"127.0.0.1:{ras.port}"}}
        result, note = read_ras(_job(), env, confirm_s=0.1)
    assert result is not None and result.suspect_ranks == [5] and result.confidence == "high"
    assert note == f"NCCL RAS read twice at 127.0.0.1:{ras.port} (json)"


def test_read_ras_says_why_it_read_nothing() -> None:
    result, note = read_ras(_job(), {1: {"NCCL_RAS_ENABLE": "0"}})
    assert result is None and "NCCL_RAS_ENABLE=0" in note
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there once closed
    result, note = read_ras(_job(), {1: {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}}, confirm_s=0.0)
    assert result is None and note.startswith(f"NCCL RAS not read: NCCL RAS at 127.0.0.1:{port}")


def test_ras_address() -> None:
    assert ras_address({}) == ("localhost", 28028)
    assert ras_address({1: {"NCCL_RAS_ADDR": "[::1]:28100"}}) == ("::1", 28100)
    assert ras_address({1: {}, 2: {"NCCL_RAS_ENABLE": "0"}}) is None


def test_stacks_with_ras_on_a_live_job(jobs: JobFactory, pyspy_works: str) -> None:
    """``--ras`` reads the job's RAS address from its ranks' environment and reads it twice; on a
    gloo job its counts change nothing in the verdict."""
    with fake_ras([text("status_all_launched.json")]) as ras:
        job = jobs.torchrun(
            "hang_subgroup.py",
            nproc=4,
            args=["--groups", "helper"],
            env={"NCCL_RAS_ADDR": f"127.0.0.1:{ras.port}"},
        )
        job.wait_ready(timeout=READY_S)
        report = dump_stacks(job.pid, DumpOptions(ras=True))
        plain = dump_stacks(job.pid)
    assert f"NCCL RAS read twice at 127.0.0.1:{ras.port} (json)" in report.job.notes
    assert ras.commands.count("STATUS") == 2
    assert report.verdict.kind == plain.verdict.kind and "NCCL RAS" not in report.verdict.summary
    assert not any("NCCL RAS" in n for n in plain.job.notes)


def test_ras_is_not_asked_while_a_rank_creates_a_communicator() -> None:
    from rankscope.capabilities.stacks import _ras
    from rankscope.models.core import Frame, RankStack, ThreadStack

    def stack(rank: int, function: str) -> RankStack:
        frames = [Frame(function=function, file="/t/distributed_c10d.py", line=1)]
        return RankStack(
            rank=rank,
            pid=41000 + rank,
            host="h",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        )

    with fake_ras([text("status_all_launched.json")]) as ras:
        env = {41000: {"NCCL_RAS_ADDR": f"127.0.0.1:{ras.port}"}}
        result, note = _ras(_job(), [stack(0, "all_reduce"), stack(1, "init_process_group")], env)
    assert result is None and "ranks [1] are creating a communicator" in note
    assert ras.commands == []
