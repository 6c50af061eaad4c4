"""A tiny training library, installed into site-packages by the tests like Lightning or HF Trainer."""

from trainlib.callbacks import Callback, Checkpoint
from trainlib.trainer import Trainer

__all__ = ["Callback", "Checkpoint", "Trainer"]
