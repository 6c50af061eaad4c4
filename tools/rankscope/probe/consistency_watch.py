"""``watch_consistency``: since when do the ranks differ? A cheap check every N steps that stops at the first divergence.

A wrong result across ranks shows up long after its cause: a gradient averager that captured its
parameter list before part of the model was unfrozen lets those parameters drift apart from the
unfreeze on. One ``check_consistency`` at the end says *what* differs; the watch says *since when*:
every ``every`` steps it runs one gather of fingerprints (no tensor moves), and the first check that
finds a difference records its step and report, prints them on the group's first rank, and ends the
watch, so a long job pays nothing after that. Every rank calls ``step`` at the same steps, and every
rank gets the same report, so all of them stop together.
"""

from __future__ import annotations

import sys
from typing import Any

from rankscope.errors import InvalidInput
from rankscope.models.consistency import ConsistencyReport
from rankscope.probe import _dist
from rankscope.probe.consistency import WHICH, check_consistency


class ConsistencyWatch:
    """The state of one watch: the checks so far, and the first divergent one once it happened."""

    def __init__(
        self,
        obj: Any,
        *,
        every: int,
        which: str,
        group: Any,
        atol: float,
        rtol: float,
        announce: bool,
    ) -> None:
        self.obj = obj
        self.every = every
        self.which = which
        self.group = group
        self.atol, self.rtol = atol, rtol
        self.announce = announce
        self.checks = 0
        self.last_consistent_step: int | None = None
        self.first_divergent_step: int | None = None
        self.report: ConsistencyReport | None = None
        self._count = -1

    @property
    def stopped(self) -> bool:
        """True once a check found a difference: no more gathers."""
        return self.report is not None

    def step(self, step: int | None = None) -> ConsistencyReport | None:
        """Call once per training step on every rank (after the optimizer step for params, after the
        gradient sync for grads). Returns the report of the first divergent check, once; else None."""
        self._count = self._count + 1 if step is None else step
        if self.stopped or self._count % self.every:
            return None
        report = check_consistency(
            self.obj, which=self.which, group=self.group, atol=self.atol, rtol=self.rtol
        )
        self.checks += 1
        if report.consistent:
            self.last_consistent_step = self._count
            return None
        self.first_divergent_step, self.report = self._count, report
        if self.announce and _dist.rank_and_world(self.group)[0] == 0:
            print(str(self), file=sys.stderr, flush=True)
        return report

    def __str__(self) -> str:
        """One line on when, then the divergent check's own summary (bounded like ``str(report)``)."""
        if self.report is None:
            last = (
                f", last at step {self.last_consistent_step}" if self.last_consistent_step is not None else ""
            )
            return f"consistency watch ({self.which}, every {self.every} steps): consistent at {self.checks} checks{last}"
        since = (
            f"; last consistent check: step {self.last_consistent_step}"
            if self.last_consistent_step is not None
            else "; the first check already differed"
        )
        return (
            f"consistency watch ({self.which}): first divergence at step {self.first_divergent_step}{since}; "
            f"watch stopped\n{self.report}"
        )


def watch_consistency(
    obj: Any,
    *,
    every: int = 100,
    which: str = "params",
    group: Any = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    announce: bool = True,
    optimizer: Any = None,
) -> ConsistencyWatch:
    """A watch over ``obj`` (a module, state_dict, optimizer or tensor): call ``.step()`` every training step.

    ``announce`` prints the first divergence on the group's first rank (stderr) when it is found.
    ``optimizer``: the watch steps itself after each ``optimizer.step()`` (a step post hook), so
    adding it to a job is one line: ``watch_consistency(model, every=50, optimizer=opt)``.
    """
    if every < 1:
        raise InvalidInput(f"every={every} must be at least 1", fix="Pass every=N: check once every N steps.")
    if which not in WHICH:
        raise InvalidInput(
            f"which={which!r} is not one of {', '.join(WHICH)}",
            fix="Pass which='params', 'grads', 'buffers' or 'all'.",
        )
    watch = ConsistencyWatch(
        obj, every=every, which=which, group=group, atol=atol, rtol=rtol, announce=announce
    )
    if optimizer is not None:
        if not callable(getattr(optimizer, "register_step_post_hook", None)):
            raise InvalidInput(
                f"optimizer={type(optimizer).__name__} has no register_step_post_hook",
                fix="Pass a torch.optim.Optimizer, or call watch.step() after each optimizer step yourself.",
            )
        optimizer.register_step_post_hook(lambda *_: watch.step())
    return watch
