"""rankscope.probe in one process, without init_process_group: fingerprints, printing, dump, errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from rankscope.errors import InvalidInput
from rankscope.probe import check_consistency, dump, placement_report, print_all_ranks
from rankscope.probe.consistency import collect, fingerprint


def test_checksum_is_exact_and_summaries_are_right() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5
    a = fingerprint("t", t)
    flipped = t.clone()
    flipped.view(torch.int32)[1, 2] ^= 1  # one bit of one element
    b = fingerprint("t", flipped)
    assert a.checksum != b.checksum and a.checksum == fingerprint("t", t.clone()).checksum
    assert a.shape == [3, 4] and a.dtype == "float32" and a.numel == 12
    assert a.sum == pytest.approx(6.0) and a.abs_max == 6.0 and a.nan == a.inf == 0
    nan = fingerprint("n", torch.tensor([1.0, float("nan"), float("inf"), -3.0]))
    assert (nan.nan, nan.inf, nan.abs_max) == (1, 1, 3.0)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.ones(3, dtype=torch.bfloat16),
        torch.tensor([1, -7, 3], dtype=torch.int64),
        torch.tensor([True, False]),
        torch.ones(2, dtype=torch.complex64),
        torch.empty(0),
        torch.tensor(2.5),
        torch.ones(4, 4).t(),  # non-contiguous
        torch.empty(3, device="meta"),
    ],
)
def test_every_kind_of_tensor_fingerprints(tensor: torch.Tensor) -> None:
    fp = fingerprint("x", tensor)
    assert fp.shape == list(tensor.shape) and fp.checksum


def test_optimizer_state_includes_scalars() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    fps, _ = collect(opt)
    names = {f.name for f in fps}
    assert {"state.0.exp_avg", "state.0.exp_avg_sq", "param_groups.0.lr"} <= names
    lr = next(f for f in fps if f.name == "param_groups.0.lr")
    assert lr.dtype == "py:float" and lr.sum == 1e-3


def test_which_selects_params_grads_buffers() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert [f.name for f in collect(model, "buffers")[0]] == [
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    grads = collect(model, "grads")[0]
    assert all(f.dtype == "none" and f.kind == "grad" for f in grads)  # before backward: no grads
    assert len(collect(model, "all")[0]) == 4 + 4 + 3


def test_local_report_without_init_process_group() -> None:
    report = check_consistency(torch.nn.Linear(3, 3))
    assert report.consistent and report.ranks == [0] and report.world_size == 1
    assert "not initialised" in report.notes[0] and "one rank only" in report.summary


def test_print_all_ranks_locally() -> None:
    buf = io.StringIO()
    lines = print_all_ranks("loss", 1.5, "\nsecond", file=buf)
    assert lines == ["  rank 0: loss 1.5 ", "  rank 0: second"]
    assert buf.getvalue() == "  rank 0: loss 1.5 \n  rank 0: second\n"


def test_dump_writes_rank_world_and_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-42")
    path = dump(torch.nn.Linear(2, 2), tmp_path / "fp")
    data = json.loads(path.read_text())
    assert path.name == "fingerprints-rank0.json"
    assert data["world_size"] == 1 and data["job_id"] == "run-42" and len(data["fingerprints"]) == 2
    place = dump(torch.nn.Linear(2, 2), tmp_path / "pl", kind="placements")
    assert json.loads(place.read_text())["tensors"][0]["layout"] == "plain"


def test_bad_input_is_invalid_input_with_a_fix() -> None:
    for call in (
        lambda: check_consistency(object()),
        lambda: check_consistency({"a": 1}),
        lambda: check_consistency(torch.ones(1), which="weights"),
        lambda: placement_report(torch.ones(1)),
        lambda: dump(torch.ones(1), "/tmp", kind="memory"),
    ):
        with pytest.raises(InvalidInput) as exc:
            call()
        assert exc.value.fix


def test_a_dump_holds_its_busy_file_while_it_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that asked for a dump waits while the busy file is there (the first recorder dump
    imports torch._inductor: seconds), and gives up early on a rank that never started one."""
    from rankscope.probe import flight

    seen: list[bool] = []

    def files(out: Path, rank: int, reason: str) -> list[str]:
        seen.append((out / f"{flight.BUSY_PREFIX}{rank}").exists())
        return ["x"]

    monkeypatch.setattr(flight, "_dump_files", files)
    assert flight.dump_now(tmp_path) == ["x"] and seen == [True]
    assert not list(tmp_path.glob(f"{flight.BUSY_PREFIX}*"))
    monkeypatch.undo()
    written = flight.dump_now(tmp_path)  # the real dump, no process group: the stacks at least
    assert any(Path(p).name.startswith(flight.STACKS_PREFIX) for p in written)
    assert not list(tmp_path.glob(f"{flight.BUSY_PREFIX}*"))
