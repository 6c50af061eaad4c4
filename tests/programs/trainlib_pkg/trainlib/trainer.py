"""The Trainer: a batch loop that skips batches with a non-finite loss, then its callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from trainlib.callbacks import Callback


class Trainer:
    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        self.step = 0

    def _average_gradients(self, grad: torch.Tensor) -> None:
        dist.all_reduce(grad)

    def fit(self, batches: Iterable[torch.Tensor], loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for batch in batches:
            loss = loss_fn(batch)
            if not torch.isfinite(loss):
                continue  # skip a bad batch: on this rank only
            self._average_gradients(torch.full((4,), float(loss)))
            self.step += 1
        for callback in self.callbacks:
            callback.on_fit_end(self)
