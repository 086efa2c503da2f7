"""Each step as it runs: reported (rank 0 appends one JSON line per step to `--progress`, flushed), and the two rules
the trainer applies itself (search_spaces/stopping.py): measured enough (`--stop-within`) and will not fit
(`--memory-limit-gib`).

After every step the ranks agree on its figures with two small all-reduces outside the timed region: the slowest
rank's step time (each step ends when the slowest rank finishes it), the largest peak memory, and the loss summed
over the ranks that hold it. Every rank then decides from the same numbers, so they stop at the same step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from search_spaces import stopping

from trainers import measure


@dataclass
class Decision:
    """Why the trial stopped before its last step: the rule, its reason, its figures."""
    rule: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


class StepWatch:
    """What the loop calls after each step; `decision` once a rule has stopped the trial."""

    def __init__(self, args, device: torch.device, optimizer, tokens_per_step: int, world: int, rank: int,
                 holds_loss: bool):
        self.device, self.optimizer, self.world, self.rank = device, optimizer, world, rank
        self.warmup, self.holds_loss = args.warmup, holds_loss
        self.tokens_per_step = tokens_per_step
        self.within, self.min_measured = args.stop_within, args.min_measured
        self.limit = args.memory_limit_gib
        self.progress = _open_progress(args.progress) if rank == 0 else None
        self.active = bool(args.progress or self.within or self.limit)
        self.measured: list[float] = []
        self.decision: Decision | None = None
        self._states_gib = self._optimizer_states_gib() if self.limit else 0.0

    def after_step(self, step: int, seconds: float, schedule_peak_gib: float, loss: list[float] | None) -> bool:
        """Report step `step` and apply the rules; True: stop now (`decision` says why)."""
        if not self.active:
            return False
        peak, predicted, seconds, loss_value = self._agreed(step, seconds, schedule_peak_gib, loss)
        phase = "warmup" if step < self.warmup else "measured"
        if phase == "measured":
            self.measured.append(seconds)
        self.decision = self._decide(predicted)
        self._report({"step": step, "phase": phase, "step_time_s": seconds,
                      "tokens_per_sec_per_gpu": self.tokens_per_step / seconds / self.world if seconds > 0 else None,
                      "peak_memory_gib": peak, "loss": loss_value,
                      **({"stop_rule": self.decision.rule} if self.decision else {})})
        return self.decision is not None

    def _agreed(self, step: int, seconds: float, schedule_peak_gib: float,
                loss: list[float] | None) -> tuple[float, float, float, float | None]:
        """(peak GiB, the peak extrapolated to the next step, step seconds, loss), the same on every rank."""
        peak = measure.peak_memory_gib(self.device)["allocated"]
        predicted = peak
        if step == 0 and self.limit:  # the optimizer states appear at the first optimizer step
            added = self._optimizer_states_gib() - self._states_gib
            predicted = stopping.extrapolated_peak(peak, schedule_peak_gib, added)
        most = torch.tensor([seconds, peak, predicted], dtype=torch.float64, device=self.device)
        total = torch.tensor(loss if loss and self.holds_loss else [0.0, 0.0], dtype=torch.float64,
                             device=self.device)
        if self.world > 1 and dist.is_initialized():
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        seconds, peak, predicted = (float(v) for v in most.tolist())
        loss_sum, tokens = (float(v) for v in total.tolist())
        return peak, predicted, seconds, loss_sum / tokens if tokens else None

    def _decide(self, predicted_gib: float) -> Decision | None:
        if self.limit:
            why = stopping.will_not_fit(predicted_gib, self.limit)
            if why:
                return Decision(stopping.WILL_NOT_FIT, why, {"predicted_peak_gib": predicted_gib,
                                                             "memory_limit_gib": self.limit})
        if self.within:
            found = stopping.measured_enough(self.measured, self.within, self.min_measured)
            if found is not None:
                why = f"measured enough: step time {found.text()}, within ±{self.within:.1%}"
                return Decision(stopping.MEASURED_ENOUGH, why, {"stop_within": self.within})
        return None

    def _optimizer_states_gib(self) -> float:
        tensors = measure.optimizer_tensors(self.optimizer)
        return measure.unique_storage_bytes(tensors) / measure.GIB

    def _report(self, line: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.write(json.dumps(line) + "\n")
            self.progress.flush()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None


def _open_progress(path: str | None):
    if not path:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "w", encoding="utf-8")  # open for the whole run, closed by StepWatch.close


def annotate(result, decision: Decision | None) -> None:
    """A measured result's interval (the steady-state step time's 95% t-interval, when two steps or more were
    measured) and, when a rule stopped it early, the rule and its reason."""
    found = stopping.interval(result.step_times_s)
    if found is not None:
        result.extra["step_time_interval_s"] = [found.low, found.high]
    result.extra["measured_steps"] = len(result.step_times_s)
    if decision is not None:
        result.extra.update(stop_rule=decision.rule, stop_reason=decision.reason, **decision.figures)


def fill_will_not_fit(result, decision: Decision, gathered: list, steps_run: int) -> None:
    """The result of a trial stopped before its OOM: status oom, the reason, the extrapolated peak as its peak
    memory (what it would have reached) beside each rank's measured one."""
    measured = [g["peak"]["allocated"] for g in gathered]
    result.status, result.error = "oom", decision.reason
    result.failure_class, result.failure_reason = "oom", decision.reason
    result.peak_memory_gib = decision.figures.get("predicted_peak_gib")
    result.peak_memory_gib_per_rank = measured
    result.extra.update(stop_rule=decision.rule, stop_reason=decision.reason, measured_peak_gib=max(measured),
                        steps_run=steps_run, **decision.figures)
