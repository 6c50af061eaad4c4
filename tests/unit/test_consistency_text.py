"""``print(check_consistency(...))`` is a short summary an agent can read whole, for any model size."""

from __future__ import annotations

from rankscope.analysis.consistency import compare_fingerprints
from rankscope.models.consistency import Fingerprint, RankFingerprints, TensorKind


def _names() -> list[str]:
    """30 tensors: an embedding, 4 backbone blocks of 6, a head of 2, a norm of 2... in module order."""
    names = ["embed.weight", "embed.pos"]
    for i in range(4):
        names += [
            f"backbone.layers.{i}.{p}" for p in ("attn.q", "attn.k", "attn.v", "mlp.w1", "mlp.w2", "norm")
        ]
    return [*names, "head.weight", "head.bias", "norm.weight", "norm.bias"]


def _ranks(
    names: list[str], odd: set[str], kind: TensorKind = "param", world: int = 4
) -> dict[int, RankFingerprints]:
    """Every rank the same, except ranks 1-3 on the ``odd`` tensors (each its own values)."""
    out: dict[int, RankFingerprints] = {}
    for r in range(world):
        fps = [
            Fingerprint(
                name=n,
                kind=kind,
                shape=[64, 64],
                dtype="float32",
                numel=4096,
                checksum=f"{(r if n in odd else 0):08x}-4096",
                sum=float(r if n in odd else 0) + 0.5,
                abs_max=1.0,
            )
            for n in names
        ]
        out[r] = RankFingerprints(rank=r, world_size=world, which="params", fingerprints=fps)
    return out


def test_thirty_tensors_twelve_divergent_fit_and_are_all_named() -> None:
    names = _names()
    assert len(names) == 30
    odd = {n for n in names if n.startswith(("backbone.layers.2.", "backbone.layers.3."))}
    assert len(odd) == 12
    report = compare_fingerprints(_ranks(names, odd))
    text = str(report)
    assert len(text.encode()) <= 1500, len(text)
    assert text.startswith("INCONSISTENT: 12 of 30 compared tensors differ")
    for n in odd:
        module = n.rpartition(".")[0]
        assert any(line.startswith(f"  {module} (") and n in line for line in text.splitlines()), n
    assert "  backbone.layers.2.attn (ranks 1-3 vs rank 0: values): backbone.layers.2.attn.q," in text
    assert "consistent: 18 of 30 compared tensors (all of embed, head, norm)" in text
    assert "\nnext: " in text
    assert text == format(report) and "fingerprints" not in text  # no pydantic repr


def test_a_huge_model_stays_bounded_and_counts_by_module() -> None:
    names = [f"model.layers.{i}.{p}" for i in range(400) for p in ("q", "k", "v", "o", "w1", "w2")]
    odd = {n for n in names if ".layers.1" in n}
    text = str(compare_fingerprints(_ranks(names, odd, world=2)))
    assert len(text.encode()) <= 1500, len(text)
    assert f"  model.layers ({len(odd)} tensors; rank 1 vs rank 0: values)" in text


def test_grads_that_differ_after_the_sync_are_not_averaged() -> None:
    names = _names()
    odd = {n for n in names if n.startswith("backbone.")}
    report = compare_fingerprints(_ranks(names, odd, kind="grad"))
    assert {d.reason for d in report.divergent} == {"not_averaged"}
    assert "were not averaged across ranks" in report.summary
    assert report.next_steps[0].skill_section == "skill/wrong-results.md#gradients-not-averaged"
    text = str(report)
    assert "grads not averaged across ranks" in text and len(text.encode()) <= 1500


def test_consistent_report_is_one_line() -> None:
    report = compare_fingerprints(_ranks(_names(), set()))
    assert str(report) == "CONSISTENT: all 30 compared tensors are identical across ranks 0-3"


def test_many_top_level_modules_are_cut_with_a_count() -> None:
    names = [f"expert{i}.weight" for i in range(500)]
    text = str(compare_fingerprints(_ranks(names, set(names), world=2)))
    assert len(text.encode()) <= 1500, len(text)
    assert "more module groups (model_dump() lists all)" in text and "  expert0.* (1 tensors" in text


def test_gradients_of_which_all_sit_under_their_module() -> None:
    names = [f"{n}.grad" for n in _names()]
    odd = {n for n in names if n.startswith("head.")}
    text = str(compare_fingerprints(_ranks(names, odd, kind="grad")))
    assert (
        "  head (ranks 1-3 vs rank 0: grads not averaged across ranks): head.weight.grad, head.bias.grad"
        in text
    )
