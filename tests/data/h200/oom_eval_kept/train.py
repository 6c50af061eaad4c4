"""Trains a small model; every 5th step evaluates it and keeps the outputs (still attached to
the autograd graph) for a report: the graph of every evaluation stays alive until memory runs out."""
import os, sys, torch
from model import Model

OUT = os.environ.get("OUTDIR", ".")


def evaluate(model, batch, history):
    scores = model(batch)  # grad enabled: the graph of this forward stays with `scores`
    history.append(scores)  # kept for the end-of-run report
    return scores.mean().item()


def main():
    torch.cuda.memory._record_memory_history(max_entries=20000)
    torch.cuda.set_per_process_memory_fraction(6 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    history = []
    try:
        for step in range(100000):
            x = torch.randn(512, 2048, device="cuda")
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 5 == 0:
                evaluate(model, torch.randn(512, 2048, device="cuda"), history)
            if step == 40:
                torch.cuda.memory._dump_snapshot(f"{OUT}/snapshot_rank0_step40.pickle")
                print(f"step {step}: snapshot taken, {torch.cuda.memory_allocated() / 2**20:.0f} MiB allocated", flush=True)
    except torch.OutOfMemoryError:
        torch.cuda.memory._dump_snapshot(f"{OUT}/snapshot_rank0_oom.pickle")
        raise


if __name__ == "__main__":
    main()
