"""GPU-hours per answer: what each way of searching spends before its best layout is within 2% of the exhaustive
optimum, and how often it stops with a winner more than 2% worse (issue 59 item 5).

The landscapes are bench/search_efficiency.py's (its CASES, its landscapes and its "truth": the cost model with a
deliberate error per dimension value, 2% run-to-run noise), so the figures sit beside that section's. Every seed draws
one truth per case, and every strategy searches that same truth. Each sweep is followed trial by trial:

  the winner     the sweep's answer as it stores it (orchestrator/sweep/loop.py _record_answer): the calibrated
                 search's, the measured layout it believes fastest; another search's, the best measured. "Within 2%"
                 once its true throughput is at least 98% of the optimum (the best truly fitting layout)
  GPU-hours      each trial charged as the sweep charges a what-if trial (orchestrator/sweep/fidelity.py,
                 Sizing.gpu_seconds): num_gpus x (STARTUP_S + steps run x the layout's true step time); an OOM: start-up
                 plus one step. "to within 2%" sums the trials up to the one that brought the winner within 2%;
                 "spent" sums every trial the sweep ran before it stopped (what the answer cost)
  wrong stop     the sweep ended (its budget, its own stop rule, nothing left) with a winner more than 2% worse

A replay trial has no steps, so the per-trial stop rules are modelled: a trial runs WARMUP untimed steps and up to
MEASURED timed ones (20 in all, the search-efficiency charge); each timed step's time is the layout's true step time
times the trial's run noise (exp N(0, 0.02), as in search efficiency) times a step noise exp(N(0, STEP_NOISE)) of its
own. Drawn per (seed, layout), so a layout measures the same under every strategy. With the rules on, after each timed
step the spec's rules (orchestrator/spec/stopping.py defaults, the functions of search_spaces/stopping.py) decide:
`measured_enough` (95% interval of the step times within 2%, at least 3 steps: the trial ends, its figure the mean so
far) first, as the trainer decides it the moment a step ends; then `cannot_win` (the upper bound of its per-step
tokens/s/GPU, raised by 5%, below the best complete trial's lower bound: pruned, no measurement, the search is told
PRUNED as the sweep tells it). `will_not_fit` is not credited: every strategy charges an OOM start-up plus one step, the
charge the rule makes true of a real trainer; with the rule on, the OOM's extrapolated peak (taken as the true peak)
is what the search's memory correction reads.

Strategies (the sweep's own samplers through Optuna's ask/tell and the sweep's Screen, bench/search_efficiency.py):

  whole trials, N trials before issue 59: the calibrated search (rules of thumb first), every trial 20 steps, stops at
                         n_trials (60: the baseline the targets halve)
  + convergence          budget.converge_below 0.05 (the spec's default; converge_margin 0.02): stops once the
                         calibrated search's posterior chance that a layout is more than 2% faster than its answer falls
                         below 5% (orchestrator/sweep/loop.py _check_converged, asked after every trial as the sweep
                         asks it), n_trials the ceiling
  stop rules             the per-trial rules above; a pruned trial's reported steps are its intermediate values, whose
                         median the calibrated search learns as its figure (orchestrator/search/samplers.py), as in
                         the sweep; it is no measurement (never the winner). With convergence and n_trials 60: the
                         candidate; with n_trials 8: the spec's defaults as they are
  grid (NeMo AC)         NeMo Auto-Configurator's way: the layouts predicted to fit, in its loop order (TP, PP, CP, EP,
                         MBS, smallest first; `--search grid`, no rules of thumb), every trial 20 steps, to n_trials
  DeepSpeed, N idle      DeepSpeed autotuner's way: stop after N trials in a row without a new best
                         (tuner_early_stopping), every trial 20 steps; on the default search's order (its best here).
                         N = 3 and 5, and the smallest N (of AS_RIGHT_N) whose sweeps stop wrong no more often than the
                         candidate's: DeepSpeed set to be as right, what it then spends

A stop that does not change what the search proposes (n_trials, convergence, N without improvement) cuts one run
short, so the strategies on one search share its run: three sweeps per seed and case (default, with the stop rules,
grid).

`run(quick=False) -> dict`; `python bench/gpu_hours.py [--quick] [--seeds N]` prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from search_spaces.catalog.hardware import load_gpu  # noqa: E402
from search_spaces.catalog.models import load_model  # noqa: E402
from search_spaces.result import TrialResult  # noqa: E402
from search_spaces.stopping import cannot_win, interval, measured_enough  # noqa: E402

from bench import search_efficiency as se  # noqa: E402
from orchestrator.records import TrialRecord  # noqa: E402
from orchestrator.spec.schema import Budget  # noqa: E402
from orchestrator.spec.stopping import Stopping  # noqa: E402
from orchestrator.storage import studies  # noqa: E402
from orchestrator.sweep.convergence import Convergence  # noqa: E402
from orchestrator.sweep.fidelity import Sizing, TrialSize  # noqa: E402

TARGET = se.TARGET
BUDGET = se.BUDGET  # the search-efficiency budget: the baseline's sweeps run to it
SPEC_N_TRIALS = Budget().n_trials  # the spec's default n_trials
WARMUP, MEASURED = 2, se.STEPS - 2  # 20 steps in all, the search-efficiency charge; warm-up the spec's default
STEP_NOISE = 0.02  # step-to-step noise of a timed step's time (stated, not measured)
CONVERGE = Budget(converge_below=0.05)  # converge_margin: the spec's default (0.02)
STOPPING = Stopping()  # the spec's defaults: measured_within 0.02, min_measured_steps 3, cannot_win_margin 0.05
PATIENCE = (3, 5)
SEEDS = 30  # per case: about 5 minutes on 2 shared cores


@dataclasses.dataclass(frozen=True)
class Measurement:
    status: str  # ok | oom | pruned
    figure: float | None  # measured tokens/s/GPU (ok only)
    low: float | None  # its lower bound (95% interval of the per-step figures), ok only
    steps: int  # steps run, warm-up included
    memory: float | None  # what the search is told of its peak memory
    reported: tuple[float, ...] = ()  # a pruned trial: the timed steps' tokens/s/GPU it reported


@dataclasses.dataclass(frozen=True)
class TrialRun:
    """One trial a sweep ran."""
    index: int  # the layout's position in the landscape
    status: str
    figure: float | None
    true: float  # the layout's true tokens/s/GPU (0 when it does not truly fit)
    hours: float  # GPU-hours charged
    steps: int
    chance: float | None  # after it: P(a layout beats the answer by > the margin), when asked
    answer: float | None = None  # after it: the true tokens/s/GPU of the sweep's answer (None: the best measured)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one sweep runs: its search, whether the per-trial rules apply, whether it asks for convergence."""
    search: str = "calibrated"
    rules_of_thumb: bool = True
    rules: bool = False
    converge: bool = False
    budget: int = BUDGET


def noise(seed: int, index: int) -> tuple[float, np.ndarray]:
    """A layout's run noise and its timed steps' noises under seed `seed`: the same under every strategy."""
    rng = np.random.default_rng([seed, index])
    return float(rng.normal(0.0, se.NOISE)), rng.normal(0.0, STEP_NOISE, MEASURED)


def measure(truth: se.Truth, i: int, seed: int, rules: bool, best_low: float,
            run_noise: tuple[float, np.ndarray] | None = None) -> Measurement:
    """Run layout `i`'s trial: its steps, the rules deciding after each timed one when `rules` is on."""
    if not truth.fits[i]:
        return Measurement("oom", None, None, 1, float(truth.memory[i]) if rules else None)
    run, steps = run_noise if run_noise is not None else noise(seed, i)
    values = truth.tokens[i] * np.exp(run + steps)  # per-step tokens/s/GPU; a step's time is one over it
    for k in range(1, MEASURED + 1) if rules else ():
        seen = values[:k]
        if measured_enough(list(1.0 / seen), STOPPING.measured_within or 0.0, STOPPING.min_measured_steps):
            return _ok(seen, WARMUP + k, truth.memory[i])
        if cannot_win(list(seen), best_low, STOPPING.cannot_win_margin or 0.0, STOPPING.min_measured_steps):
            return Measurement("pruned", None, None, WARMUP + k, float(truth.memory[i]),
                               tuple(float(v) for v in seen))
    return _ok(values, WARMUP + MEASURED, truth.memory[i])


def _ok(values: np.ndarray, steps: int, memory: float) -> Measurement:
    found = interval(list(values))
    figure = float(np.mean(values))
    return Measurement("ok", figure, found.low if found is not None else figure, steps, float(memory))


def charger(land: se.Landscape) -> Callable[[se.Truth, int, int], float]:
    """GPU-hours of a trial of layout i that ran `steps` steps, as the sweep charges a what-if trial."""
    case = land.case
    sizing = Sizing(load_model(case.model), load_gpu(case.gpu), case.num_gpus, min(case.num_gpus, 8),
                    case.num_gpus, "full", None, 0)

    def charge(truth: se.Truth, i: int, steps: int) -> float:
        tokens = truth.tokens[i] if truth.fits[i] else land.pred_tokens[i]
        step_s = land.layouts[i].gbs * case.seq_len / (tokens * case.num_gpus)
        size = TrialSize("full", land.layouts[i], case.num_gpus, None)
        result = TrialResult(status="ok", step_time_s=float(step_s), extra={"source": "replay"})
        used, _ = dataclasses.replace(sizing, steps=steps).gpu_seconds(size, result)
        return (used or 0.0) / 3600.0
    return charge


class Sampler(se.SweepSampler):
    """search_efficiency's driver of the sweep's samplers; a pruned trial is told PRUNED, no value, its reported
    steps stored as its intermediate values, as the sweep tells it (orchestrator/sweep/steps.py, record.py): the
    calibrated search learns their median (orchestrator/search/samplers.py)."""

    def observe(self, layout, status, tokens, memory, reported: tuple[float, ...] = ()):
        if status != "pruned":
            return super().observe(layout, status, tokens, memory)
        trial = self.pending.pop(layout.key())
        stored = studies.running_trial(trial.storage, trial.study, trial.number)
        for step, value in enumerate(reported, start=WARMUP):
            stored.report(step, value)
        TrialRecord.write(trial, status="pruned", result=TrialResult(status="pruned", peak_memory_gib=memory))
        trial.set_constraint("memory_over_limit_gib", 0.0)
        trial.set_constraint("not_measured_ok", 1.0)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def chance_of_better(self, tried: set[str], best: float) -> float | None:
        ask = getattr(self.sampler, "chance_of_better", None)
        return None if ask is None else float(ask(self.study, tried, best, CONVERGE.converge_margin))

    def answer(self) -> str | None:
        """The key of the layout the sweep would store as its answer now (orchestrator/sweep/loop.py
        _record_answer); None for a search with no belief (the best measured is the answer)."""
        ask = getattr(self.sampler, "answer", None)
        layout = None if ask is None else ask(self.study)
        return None if layout is None else layout.key()


def sweep(land: se.Landscape, truth: se.Truth, seed: int, plan: Plan,
          charge: Callable[[se.Truth, int, int], float]) -> list[TrialRun]:
    """The trials one sweep runs on `truth` up to `plan.budget`. The chance of a better layout is asked after each
    trial until it first falls below CONVERGE.converge_below (later ones decide nothing)."""
    position = {k: i for i, k in enumerate(land.keys)}
    sampler = Sampler(land, seed, plan.search, rules_of_thumb=plan.rules_of_thumb)
    tried: set[str] = set()
    runs: list[TrialRun] = []
    best = best_low = 0.0
    converged = False
    while len(runs) < plan.budget:
        layout = sampler.propose(tried)
        if layout is None:
            break
        tried.add(layout.key())
        i = position[layout.key()]
        m = measure(truth, i, seed, plan.rules, best_low)
        sampler.observe(layout, m.status, m.figure, m.memory, m.reported)
        if m.status == "ok" and m.figure is not None:
            best, best_low = max(best, m.figure), max(best_low, m.low or 0.0)
        chance = None
        if plan.converge and not converged and best > 0:
            chance = sampler.chance_of_better(tried, best)
            converged = (chance is not None and chance < (CONVERGE.converge_below or 0.0)
                         and len(runs) + 1 >= Convergence.MIN_TRIALS)
        true = float(truth.tokens[i]) if truth.fits[i] else 0.0
        answer = sampler.answer()
        answer_true = None if answer is None else float(truth.tokens[position[answer]])
        runs.append(TrialRun(i, m.status, m.figure, true, charge(truth, i, m.steps), m.steps, chance, answer_true))
    return runs


# ---- when a sweep stops, and what it got ----------------------------------------------------------------------

StopRule = Callable[[Sequence[TrialRun]], int]


def fixed(n: int) -> StopRule:
    """Run to n trials (or until nothing is left)."""
    return lambda runs: min(n, len(runs))


def converged(below: float, n: int, min_trials: int = Convergence.MIN_TRIALS) -> StopRule:
    """Stop after the first trial (the `min_trials`-th at the earliest, as the sweep) whose chance of a better layout
    is below `below`; else at n trials."""
    def stop(runs: Sequence[TrialRun]) -> int:
        for k, run in enumerate(runs[:n], 1):
            if k >= min_trials and run.chance is not None and run.chance < below:
                return k
        return min(n, len(runs))
    return stop


def patience(idle: int, n: int) -> StopRule:
    """DeepSpeed's early stopping: stop once `idle` trials in a row brought no new best measured figure."""
    def stop(runs: Sequence[TrialRun]) -> int:
        best, since = 0.0, 0
        for k, run in enumerate(runs[:n], 1):
            if run.figure is not None and run.figure > best:
                best, since = run.figure, 0
            else:
                since += 1
            if since >= idle:
                return k
        return min(n, len(runs))
    return stop


@dataclasses.dataclass(frozen=True)
class Outcome:
    reached: int | None  # the trial that brought the winner within 2% (1-based), None if it never did
    hours_to_reach: float  # GPU-hours up to and including that trial (inf when never)
    trials: int  # trials run before the sweep stopped
    spent: float  # GPU-hours of those trials
    wrong: bool  # stopped with a winner more than 2% worse than the optimum


def outcome(runs: Sequence[TrialRun], target: float) -> Outcome:
    """What a sweep that ran exactly `runs` got: when its winner first was within 2% (`target`: 98% of the
    optimum's true tokens/s/GPU), what it spent, and whether it ended wrong."""
    winner: TrialRun | None = None
    answer: float | None = None  # the winner's true tokens/s/GPU
    reached, hours, to_reach = None, 0.0, math.inf
    for k, run in enumerate(runs, 1):
        hours += run.hours
        if run.status == "ok" and run.figure is not None and (winner is None or run.figure > (winner.figure or 0.0)):
            winner = run
        answer = run.answer if run.answer is not None else winner.true if winner is not None else None
        if reached is None and answer is not None and answer >= target:
            reached, to_reach = k, hours
    wrong = answer is None or answer < target
    return Outcome(reached, to_reach, len(runs), hours, wrong)


# ---- the strategies, side by side ------------------------------------------------------------------------------

PLANS = {"default": Plan(converge=True), "rules": Plan(rules=True, converge=True),
         "grid": Plan(search="grid", rules_of_thumb=False)}
BELOW = CONVERGE.converge_below or 0.0
BASELINE = f"whole trials, {BUDGET} trials (before issue 59)"
CANDIDATE = f"stop rules + convergence, n_trials {BUDGET}"
# name -> (the sweep whose trials it runs, when it stops); sweeps whose stop does not change what they propose share
# one run: a stop rule only cuts the run short
STRATEGIES: dict[str, tuple[str, StopRule]] = {
    BASELINE: ("default", fixed(BUDGET)),
    f"whole trials, {SPEC_N_TRIALS} trials": ("default", fixed(SPEC_N_TRIALS)),
    f"whole trials + convergence, n_trials {BUDGET}": ("default", converged(BELOW, BUDGET)),
    f"stop rules, {BUDGET} trials": ("rules", fixed(BUDGET)),
    CANDIDATE: ("rules", converged(BELOW, BUDGET)),
    f"the spec's defaults (stop rules + convergence, n_trials {SPEC_N_TRIALS})": ("rules",
                                                                               converged(BELOW, SPEC_N_TRIALS)),
    "grid (NeMo AC)": ("grid", fixed(BUDGET)),
    **{f"DeepSpeed: stop after {n} without improvement": ("default", patience(n, BUDGET)) for n in PATIENCE},
}
# DeepSpeed's N set as a user would have to set it to be as right as the candidate: the smallest N of these whose
# sweeps stop wrong no more often than the candidate's (N = 3 and 5 stop cheaper, and wrong in 20-83% of sweeps)
AS_RIGHT, AS_RIGHT_N = "DeepSpeed: N without improvement, as right as the candidate", (8, 10, 12, 15, 20, 25, 30, 40)
COMPARISONS = ("grid (NeMo AC)", *(f"DeepSpeed: stop after {n} without improvement" for n in PATIENCE))


def _median(values: Sequence[float]) -> float:
    """Nearest-rank median (inf = never within 2%), as bench/search_efficiency.py's."""
    return se._rank(values, 0.5)


def summarise(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    return {"runs": len(outcomes),
            "reached": sum(o.reached is not None for o in outcomes),
            "hours_to_reach_median": _median([o.hours_to_reach for o in outcomes]),
            "trials_to_reach_median": _median([math.inf if o.reached is None else float(o.reached)
                                               for o in outcomes]),
            "spent_median": _median([o.spent for o in outcomes]),
            "trials_median": _median([float(o.trials) for o in outcomes]),
            "wrong_stops": sum(o.wrong for o in outcomes)}


def run_case(case: se.Case, seeds: int, cap: int) -> dict[str, Any]:
    land = se.build_landscape(case, cap)
    charge = charger(land)
    outcomes: dict[str, list[Outcome]] = {name: [] for name in STRATEGIES}
    patient: dict[int, list[Outcome]] = {n: [] for n in AS_RIGHT_N}
    for seed in range(seeds):
        truth = se.draw_truth(land, 1000 * seed + 17)  # search_efficiency's truths
        runs = {kind: sweep(land, truth, seed, plan, charge) for kind, plan in PLANS.items()}
        for name, (kind, stop) in STRATEGIES.items():
            outcomes[name].append(outcome(runs[kind][:stop(runs[kind])], truth.target))
        for n in AS_RIGHT_N:
            patient[n].append(outcome(runs["default"][:patience(n, BUDGET)(runs["default"])], truth.target))
    strategies = {name: summarise(o) for name, o in outcomes.items()}
    wrong = strategies[CANDIDATE]["wrong_stops"]
    idle = next((n for n in AS_RIGHT_N if sum(o.wrong for o in patient[n]) <= wrong), None)
    if idle is not None:
        outcomes[AS_RIGHT] = patient[idle]
        strategies[AS_RIGHT] = {**summarise(patient[idle]), "n": idle}
    return {"case": case.name, "layouts": len(land.layouts), "outcomes": outcomes, "strategies": strategies}


TARGETS = {"half_to_reach": "median GPU-h to within 2% at most half of whole trials'",
           "half_spent": "median GPU-h spent at most half of whole trials'",
           "wrong_le_5pct": "wrong stops <= 5%",
           "beats_to_reach": "beats grid and DeepSpeed (N=3, 5): median GPU-h to within 2%",
           "beats_spent": "beats grid and DeepSpeed (N=3, 5): median GPU-h spent",
           "beats_as_right": "beats DeepSpeed as right as it (smallest N as few wrong stops): median GPU-h spent",
           "default_le_12_trials": "the calibrated search: median trials to within 2% <= 12"}


def targets(row: dict[str, Any], candidate: str = CANDIDATE) -> dict[str, bool]:
    """Issue 59's targets on one case, for `candidate` against the baseline (whole trials) and the comparisons."""
    s = row["strategies"]
    base, cand = s[BASELINE], s[candidate]
    return {"half_to_reach": cand["hours_to_reach_median"] <= 0.5 * base["hours_to_reach_median"],
            "half_spent": cand["spent_median"] <= 0.5 * base["spent_median"],
            "wrong_le_5pct": cand["wrong_stops"] <= 0.05 * cand["runs"],
            "beats_to_reach": all(cand["hours_to_reach_median"] < s[c]["hours_to_reach_median"] for c in COMPARISONS),
            "beats_spent": all(cand["spent_median"] < s[c]["spent_median"] for c in COMPARISONS),
            "beats_as_right": AS_RIGHT not in s or cand["spent_median"] < s[AS_RIGHT]["spent_median"],
            "default_le_12_trials": base["trials_to_reach_median"] <= 12}


def run(quick: bool = False, seeds: int | None = None, cap: int | None = None, verbose: bool = False) -> dict:
    seeds = seeds or (4 if quick else SEEDS)
    cap = cap or (1500 if quick else 5000)
    start = time.monotonic()
    out: dict[str, Any] = {"target": TARGET, "budget": BUDGET, "seeds": seeds, "cap": cap, "warmup": WARMUP,
                           "measured": MEASURED, "startup_s": se.STARTUP_S, "step_noise": STEP_NOISE,
                           "run_noise": se.NOISE, "converge_below": BELOW,
                           "converge_margin": CONVERGE.converge_margin, "stopping": STOPPING.model_dump(),
                           "cases": []}
    for case in se.CASES[:2] if quick else se.CASES:
        t0 = time.monotonic()
        row = run_case(case, seeds, cap)
        row.pop("outcomes")
        row["targets"] = targets(row)
        row["seconds"] = round(time.monotonic() - t0, 1)
        out["cases"].append(row)
        if verbose:
            print(f"{case.name}: {row['layouts']} layouts, {row['seconds']} s", file=sys.stderr)
    out["seconds"] = round(time.monotonic() - start, 1)
    return out


def _h(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:,.0f}"


def _n(value: float) -> str:
    return f">{BUDGET}" if math.isinf(value) else f"{value:.0f}"


def table(result: dict) -> str:
    """Markdown table of run()'s figures, one row per case and strategy."""
    lines = ["| case | strategy | within 2% | GPU-h to within 2% (median) | trials to within 2% (median) "
             "| GPU-h spent (median) | trials run (median) | wrong stops |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["cases"]:
        label = f"{row['case']} ({row['layouts']} layouts)"
        for name, s in row["strategies"].items():
            bold = "**" if name == CANDIDATE else ""
            name = f"{name} (N = {s['n']})" if "n" in s else name
            lines.append(f"| {label} | {bold}{name}{bold} | {s['reached']}/{s['runs']} | "
                         f"{_h(s['hours_to_reach_median'])} | {_n(s['trials_to_reach_median'])} | "
                         f"{_h(s['spent_median'])} | {_n(s['trials_median'])} | "
                         f"{s['wrong_stops']}/{s['runs']} ({s['wrong_stops'] / s['runs']:.0%}) |")
            label = ""
    return "\n".join(lines)


def verdicts(result: dict) -> list[str]:
    """The issue's targets, met or not, per case: the candidate's."""
    lines = ["| target | " + " | ".join(row["case"] for row in result["cases"]) + " |",
             "|---|" + "---|" * len(result["cases"])]
    for key, text in TARGETS.items():
        cells = []
        for row in result["cases"]:
            cells.append("met" if row["targets"][key] else "**not met**")
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return lines


def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    return [f"The search-efficiency landscapes (made-up truths from the cost model, not measurements), {r['seeds']} "
            f"seeds per case, every strategy on the same truths. A trial: {r['startup_s']:.0f} s start-up, "
            f"{r['warmup']} warm-up and up to {r['measured']} timed steps of the layout's true step time, times its "
            f"GPUs; an OOM start-up plus one step. A replay trial has no steps: the per-trial stop rules (spec "
            f"`stopping:` defaults) are modelled on simulated steps, step-to-step noise exp(N(0, {r['step_noise']})) "
            f"(a stated figure, not a measured one) over the run noise exp(N(0, {r['run_noise']})). Convergence: "
            f"`budget.converge_below: {r['converge_below']}`, margin {r['converge_margin']:.0%}. Within 2% = the "
            "sweep's answer (the calibrated search's: the measured layout it believes fastest; the grid's: its best "
            "measured) truly within 2% of the best truly fitting layout; GPU-h to within 2% sums the trials until "
            "then, spent sums every trial until the sweep stopped; a wrong stop ended with a "
            f"winner more than 2% worse. Budget {r['budget']} trials; medians are nearest-rank (\"not reached\" / "
            f"\">{r['budget']}\": in fewer than half the sweeps). Bold: the candidate (the calibrated search with the "
            "stop rules and convergence, n_trials the ceiling; it learns a pruned trial's reported steps).", "",
            table(r), "", f"Issue 59's targets, per case (the candidate against whole trials to {r['budget']} trials, "
            "the calibrated search before issue 59):", "",
            *verdicts(r)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 cases, 4 seeds, at most 1500 layouts each")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--cap", type=int, default=None, help="layouts kept per case")
    args = parser.parse_args()
    result = run(quick=args.quick, seeds=args.seeds, cap=args.cap, verbose=True)
    print("\n".join(section(result)))
    print(f"\n({result['seconds']} s)")


if __name__ == "__main__":
    main()
