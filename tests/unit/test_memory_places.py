"""A leak's place is the stack of the blocks that are kept, and its answer quotes what keeps them.

One library line (model.py's head) reached from two or three script lines (the training forward,
an evaluation, a sampling call) is two or three places, each with its own kept ratio: the one whose
blocks stay is named with its own script line and that line's caller, and the statements of its
function that store the result are read from the script beside the snapshots. A forward kept
whole (its output with the activations autograd saved) is named as a live graph. Checked on
builder snapshots in the real layout and on a real H200 capture (tests/data/h200/oom_eval_kept).
"""

from __future__ import annotations

from pathlib import Path

from rankscope import api
from rankscope.analysis.memory import analyze_snapshot, diagnose
from rankscope.analysis.memory.graph import kept_graphs
from rankscope.analysis.memory.keeper import keeper_words, keeping_statements
from rankscope.capabilities.memory import job_sources, read_snapshots, snapshot_files
from rankscope.capabilities.triage import triage_logs
from tests.paths import DATA
from tests.snapshot_builder import Forward, GiB, Job, MiB, out_of_memory, run_steps, start_job

SCRIPT = """import torch

from model import LM

previews = {}


def evaluate(model, batch, outputs):
    model.eval()
    logits = model(batch)
    outputs.append(logits)
    model.train()
    return float(logits.float().mean())


def sample(model, prompt, step):
    out = model(prompt)
    if step % 6 == 5:
        previews[step] = out[:, -1]
    return out.argmax(-1).tolist()


def main():
    model = LM().cuda()
    opt = torch.optim.AdamW(model.parameters())
    outputs = []
    for step, batch in enumerate(batches()):
        logits = model(batch)
        loss = logits.float().mean()
        loss.backward()
        opt.step()
        if step % 5 == 4:
            evaluate(model, batch, outputs)
        if step % 2 == 1:
            sample(model, batch[:1], step)


if __name__ == "__main__":
    main()
"""
LINES = SCRIPT.splitlines()


def at(text: str, after: int = 0) -> int:
    """The 1-based number of the first line of SCRIPT from ``after`` on that holds ``text``."""
    return next(i + 1 for i, line in enumerate(LINES) if i >= after and text in line)


JOB = Job(
    script="/workspace/lm/train.py",
    model="/workspace/lm/model.py",
    main_line=at("    main()", at("__main__")),
    params_line=at("LM().cuda()"),
    optim_line=at("AdamW"),
)
TRAIN = Forward(line=at("logits = model(batch)", at("def main")), train=True)
EVAL = Forward(
    line=at("logits = model(batch)"),
    func="evaluate",
    caller=at("evaluate(model", at("def main")),
    every=5,
    keep=1,
    graph=True,
)
SAMPLE = Forward(
    line=at("out = model(prompt)"), func="sample", caller=at("sample(model", at("def main")), every=2, keep=3,
    activations=4, act_bytes=64 * MiB, out_bytes=300 * MiB,
)  # fmt: skip


def job_folder(tmp: Path, forwards: list[Forward], steps: int = 40, oom: Forward | None = None) -> Path:
    """A job folder: its train.py and one rank's snapshot after ``steps`` steps (at an OOM in ``oom``)."""
    (tmp / "train.py").write_text(SCRIPT)
    b = start_job(JOB)
    run_steps(b, JOB, forwards, range(steps), {})
    if oom is not None:
        out_of_memory(b, JOB, oom, capacity=80 * GiB)
    b.dump(tmp / "snapshot-rank0.pickle")
    return tmp


def places(tmp: Path) -> dict[str | None, tuple[int, int | None]]:
    """Per script line (with its caller) at model.py's head: (live blocks, kept_every of its leak suspect)."""
    summaries, _ = read_snapshots(snapshot_files([str(tmp)]))
    s = summaries[0]
    head = f"{JOB.model}:{JOB.head_line} in forward"
    kept = {x.script: x.kept_every for x in s.leak_suspects if x.site == head}
    return {t.script: (t.blocks, kept.get(t.script)) for t in s.top_sites if t.site == head}


def line(fw: Forward) -> str:
    return f"{JOB.script}:{fw.line} in {fw.func}"


def test_two_script_lines_through_one_library_line_are_two_places(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, [TRAIN, EVAL])
    main = f"{JOB.script}:{JOB.main_line} in <module>"
    caller = f"{JOB.script}:{EVAL.caller} in main"
    # the training forward frees its output every step; the evaluation keeps all 8 of its own
    assert places(folder) == {f"{line(EVAL)} <- {caller}": (8, 1)}
    report = api.inspect_memory(paths=[str(folder)])
    lead = report.findings[0]
    assert lead.kind == "memory_leak"
    assert lead.facts["script"] == line(EVAL) and lead.facts["caller"] == caller
    assert (
        line(TRAIN) not in lead.message and line(TRAIN) not in (lead.fix or "") and main not in lead.message
    )
    # its activations stay beside its outputs: the graph of each evaluation is alive
    assert lead.message.startswith(
        f"Leak on rank 0: {line(EVAL)} <- {caller} keeps 8 outputs ({JOB.model}:{JOB.head_line} in forward) "
        f"with 16.0 GiB of activations in 64 blocks ({JOB.model}:{JOB.block_line} in forward)"
    )
    assert "autograd graphs are alive" in lead.message
    keeps = f"{JOB.script}:{at('outputs.append(logits)')} `outputs.append(logits)`"
    assert lead.facts["keeps"] == [keeps] and f"kept by {keeps}" in lead.message
    assert (lead.fix or "").startswith(f"{keeps} in evaluate keeps each output with its graph")
    assert "torch.no_grad()" in (lead.fix or "") and "`logits.detach().cpu()`" in (lead.fix or "")


def test_three_script_lines_with_their_own_kept_ratios(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, [TRAIN, EVAL, SAMPLE], steps=60)
    sample_caller = f"{JOB.script}:{SAMPLE.caller} in main"
    found = places(folder)
    # evaluate keeps each of its 12 calls, sample every 3rd of its 30: each place its own ratio
    assert found[f"{line(EVAL)} <- {JOB.script}:{EVAL.caller} in main"] == (12, 1)
    assert found[f"{line(SAMPLE)} <- {sample_caller}"] == (10, 3)
    assert not any(line(TRAIN) in (k or "") for k in found)
    summaries, _ = read_snapshots(snapshot_files([str(folder)]))
    sample_only = [
        s.model_copy(
            update={"leak_suspects": [x for x in s.leak_suspects if line(SAMPLE) in (x.script or "")]}
        )
        for s in summaries
    ]
    lead = diagnose(sample_only, job_sources(summaries, [folder]))
    assert lead is not None and lead.facts["script"] == line(SAMPLE) and lead.facts["kept_every"] == 3
    keeps = f"{JOB.script}:{at('previews[step] =')} `previews[step] = out[:, -1]`"
    assert lead.facts["keeps"] == [keeps]
    assert "graph" not in lead.message  # sample's activations are freed: only a view of its output stays
    assert "keeps every 3rd tensor" in (lead.fix or "") and "`out[:, -1].detach().cpu()`" in (lead.fix or "")


def test_the_oom_in_the_training_forward_names_the_evaluation(tmp_path: Path) -> None:
    """The OOM's traceback is in the training forward; the kept blocks are the evaluation's."""
    folder = job_folder(tmp_path, [TRAIN, EVAL], steps=42, oom=TRAIN)
    r = triage_logs([str(folder)])
    assert r.decided_by == "memory_snapshots" and r.findings[0].facts["script"] == line(EVAL)
    assert r.next_steps[0].action.startswith(f"Fix: {JOB.script}:{at('outputs.append(logits)')}")


def test_without_the_script_the_place_still_names_the_right_line(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, [TRAIN, EVAL])
    (folder / "train.py").unlink()
    lead = api.inspect_memory(paths=[str(folder)]).findings[0]
    assert "keeps" not in lead.facts and (lead.fix or "").startswith(
        f"Run evaluate ({line(EVAL)} <- {JOB.script}:{EVAL.caller} in main) under torch.no_grad()"
    )
    folder = job_folder(tmp_path, [TRAIN, SAMPLE])  # no graph kept: the generic fix at the right line
    (folder / "train.py").unlink()
    lead = api.inspect_memory(paths=[str(folder)]).findings[0]
    assert (
        "keeps" not in lead.facts
        and f"made at {line(SAMPLE)} <- {JOB.script}:{SAMPLE.caller} in main" in (lead.fix or "")
    )


def test_a_real_evaluation_kept_with_its_graph() -> None:
    """H200: every 5th step evaluate() keeps its output with grad enabled; the training forward
    reaches the same library line (model.py:11) from train.py:24 and keeps nothing."""
    r = triage_logs([str(DATA / "h200" / "oom_eval_kept")])
    lead = r.findings[0]
    assert lead.kind == "memory_leak" and r.suspect_ranks == [0]
    assert lead.facts["script"] == "/workspace/oom/train.py:10 in evaluate"
    assert lead.facts["caller"] == "/workspace/oom/train.py:29 in main"
    assert "train.py:24" not in lead.message + (lead.fix or "")
    assert "train.py:29 in main keeps 24 outputs (/workspace/oom/model.py:24 in forward)" in lead.message
    assert lead.facts["keeps"] == ["/workspace/oom/train.py:11 `history.append(scores)`"]
    assert "run evaluate under torch.no_grad()" in (lead.fix or "")


def test_the_statements_that_keep_a_result() -> None:
    source = """import torch
cache = {}
best = None


class Loop:
    def step(self, model, x, log):
        global best
        out = model(x)
        last = out[:, -1]
        log.append(loss_of(out).item())
        self.seen = last
        cache["last"] = last
        best = out
        self.total += out.sum()
        self.count += 1
        return last
"""
    func, keeps = keeping_statements(source, 9)
    assert func == "step"
    assert [(k.line, k.how, k.value) for k in keeps] == [
        (12, "store", "last"),
        (13, "store", "last"),
        (14, "store", "out"),
    ]
    _, all_keeps = keeping_statements(source.replace("        best = out\n", ""), 9)
    assert [k.how for k in all_keeps] == ["store", "store", "accumulate"]
    assert keeping_statements("def f(:\n", 1) == (None, [])
    assert keeping_statements("x = 1\n", 1) == (None, [])
    returned = keeping_statements("def f(m, x):\n    y = m(x)\n    return y * 2\n", 2)
    assert [(k.how, k.text) for k in returned[1]] == [("return", "return y * 2")]
    inline = keeping_statements("def f(m, x, outs):\n    outs.append(m(x))\n", 2)
    assert [(k.how, k.value) for k in inline[1]] == [("append", "m(x)")]


def test_analysis_needs_no_files(tmp_path: Path) -> None:
    """The pure core reads the snapshot dict it is given; sources are the shell's to read."""
    b = start_job(JOB)
    run_steps(b, JOB, [TRAIN, EVAL], range(20), {})
    s = analyze_snapshot(b.build(), "mem.pickle", 0, top=2)
    # the outputs (one small block per kept call) are listed beyond the top places, the graph's
    held = [(t.site, t.script, t.live_bytes, t.blocks) for t in s.top_sites]
    assert [(t.site, t.blocks) for t in s.top_sites] == [
        (f"{JOB.script}:{JOB.optim_line} in main", 1),
        (f"{JOB.model}:{JOB.block_line} in forward", 32),
        (f"{JOB.model}:{JOB.head_line} in forward", 4),
    ]
    (graph,) = kept_graphs(held)
    assert (graph.script, graph.calls, graph.graph_blocks) == (
        f"{line(EVAL)} <- {JOB.script}:{EVAL.caller} in main",
        4,
        32,
    )
    assert diagnose([s]) is not None


def test_a_forward_in_flight_is_no_kept_graph() -> None:
    script = "train.py:42 in main"
    kept = ("model.py:34 in forward", script, 3 * GiB, 3)
    assert kept_graphs([kept, ("model.py:19 in forward", script, 8 * GiB, 16)]) == []  # no multiple
    assert kept_graphs([kept]) == []  # no other line
    assert kept_graphs([kept, ("model.py:19 in forward", None, 8 * GiB, 6)]) == []  # not that call
    assert kept_graphs([kept, ("model.py:19 in forward", script, 8 * GiB, 6)])[0].graph_blocks == 6


def test_a_returned_result_quotes_the_callers_line() -> None:
    """A function that returns its forward's output: its caller's line is what keeps it."""
    source = "def evaluate(model, x):\n    out = model(x)\n    return out\n\n\ndef main(model, xs, outs):\n"
    source += "    for x in xs:\n        outs.append(evaluate(model, x))\n"
    words = keeper_words(
        "model.py:34 in forward",
        "train.py:2 in evaluate <- train.py:8 in main",
        {"train.py": source},
        graph=True,
        every="the tensors",
    )
    assert words.quotes == ["train.py:3 `return out`", "train.py:8 `outs.append(evaluate(model, x))`"]
    assert (words.fix or "").startswith(
        "train.py:3 `return out` in evaluate keeps each output with its graph"
    )
    assert (
        keeper_words("model.py:34 in forward", "train.py:2 in evaluate", {}, graph=False, every="x").fix
        is None
    )
