"""A metric that syncs its state across ranks on ``compute()``, like torchmetrics or evaluate."""

from __future__ import annotations

import torch.distributed as dist


class Accuracy:
    """Counts right answers per rank; ``compute()`` gathers every rank's counts (a collective)."""

    def __init__(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, correct: int, total: int) -> None:
        self.correct += correct
        self.total += total

    def _sync(self) -> list[tuple[int, int]]:
        states: list[tuple[int, int]] = [(0, 0)] * dist.get_world_size()
        dist.all_gather_object(states, (self.correct, self.total))
        return states

    def compute(self) -> float:
        states = self._sync() if dist.is_initialized() else [(self.correct, self.total)]
        return sum(c for c, _ in states) / max(1, sum(t for _, t in states))
