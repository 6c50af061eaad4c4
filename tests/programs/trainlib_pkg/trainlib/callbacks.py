"""Callbacks run by the Trainer at the end of fit."""

from __future__ import annotations

import torch.distributed as dist


class Callback:
    def on_fit_end(self, trainer: object) -> None:
        """Called on every rank once the batch loop is over."""


class Checkpoint(Callback):
    def on_fit_end(self, trainer: object) -> None:
        dist.barrier()  # every rank must be done before the checkpoint is written
