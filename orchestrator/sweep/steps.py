"""The running trials' steps, as their trainers report them (orchestrator/dispatch/steps.py), forwarded from the
sweep's own thread: to Optuna (each measured step's tokens/s/GPU as the trial's intermediate value at the trainer's
step index) and to MLflow (the child run's `step/` metrics, warm-up steps included), then the cannot-win rule asked
(orchestrator/search/pruning.py); a trial it prunes is stopped through its feed and recorded PRUNED (record.py).

Backends without steps (analytic, replay) get no feed: nothing is reported for their trials.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from orchestrator.dispatch.steps import StepFeed
from orchestrator.errors import LeaseLost
from orchestrator.redact import redact_text
from orchestrator.search.pruning import CannotWinPruner
from orchestrator.storage import studies
from orchestrator.sweep.record import Proposal
from orchestrator.sweep.session import Session

log = logging.getLogger("moe_autotune")


class StepWatcher:
    """The feeds of the sweep's running trials, by trial number."""

    def __init__(self, session: Session):
        self.session = session
        self.enabled = bool(getattr(session.backend, "reports_steps", False))
        stop = session.spec.stopping
        self.pruner = CannotWinPruner(stop.cannot_win_margin, stop.min_measured_steps) \
            if self.enabled and stop.cannot_win_margin is not None else None  # no steps, nothing to judge
        self._running: dict[int, tuple[Proposal, StepFeed, studies.StoredTrial]] = {}
        self._mlflow_said = False

    def feed(self, proposal: Proposal) -> StepFeed | None:
        """A new feed for `proposal`'s trial (None when its backend reports no steps)."""
        if not self.enabled:
            return None
        trial = proposal.trial
        stored = studies.running_trial(trial.storage, trial.study, trial.number)
        feed = StepFeed()
        self._running[trial.number] = (proposal, feed, stored)
        return feed

    def poll(self) -> None:
        """Report what the running trials reported since the last poll; stop those that cannot win."""
        for number in list(self._running):
            proposal, feed, stored = self._running[number]
            reason = self._report(proposal, stored, feed.take())
            if reason is not None:
                feed.stop(reason)

    def finished(self, proposal: Proposal) -> None:
        """`proposal`'s trial ended: its last steps are reported (before its tell), its feed forgotten."""
        entry = self._running.pop(proposal.trial.number, None)
        if entry is not None:
            self._report(proposal, entry[2], entry[1].take(), ask=False)

    def _report(self, proposal: Proposal, stored: studies.StoredTrial, steps: list[dict[str, Any]],
                ask: bool = True) -> str | None:
        """Store and log `steps`; the cannot-win rule's reason to stop the trial, or None."""
        if not steps:
            return None
        self.session.lease.fence()  # intermediate values are writes
        measured = [s for s in steps if s.get("phase") == "measured" and _finite(s.get("tokens_per_sec_per_gpu"))]
        for step in measured:
            stored.report(step["step"], float(step["tokens_per_sec_per_gpu"]))
        self._log(proposal.trial.number, steps)
        if not ask or not measured or self.pruner is None or proposal.size.fidelity != "full":
            return None
        return self.pruner.reason(self.session.study, stored.frozen())

    def _log(self, number: int, steps: list[dict[str, Any]]) -> None:
        """The steps on the trial's child run; MLflow out of reach costs the live curve, not the sweep (said once)."""
        tracker = self.session.tracker
        if tracker is None:
            return
        try:
            tracker.log_steps(number, steps)
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 -- the trial's record still reaches MLflow when it ends
            if not self._mlflow_said:
                self._mlflow_said = True
                log.warning("MLflow: the running trials' steps are not logged (%s)",
                            redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0]))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
