"""Search efficiency: trials (and GPU-hours) each search strategy needs to get within 2% of the best layout.

Landscapes are made from the cost model, because no one has measured thousands of layouts per cluster:
for each case (model, seq_len, cluster) the legal layouts are enumerated (some dimensions pinned, see CASES;
a seeded sample of CAP of them if there are more), and for every seed a "truth" is drawn:

  true tokens/s = predicted x one factor per (dimension, value), each exp(N(0, 0.10))  (deliberate model error)
  true memory   = predicted x one factor per (dimension, value), each exp(N(0, 0.03))  (fits/OOM can flip)
  a measurement = true tokens/s x exp(N(0, 0.02)) when the truth fits, else status oom   (noise)

The target is 98% of the exhaustive optimum of the truth (best truly fitting layout); a strategy reaches it
at the first trial that measures a layout whose true throughput is at least that. Each run stops there or
after BUDGET trials (then it counts as "> BUDGET"). Strategies:

  calibrated      the sweep's default sampler (orchestrator/search/samplers.py CalibratedSampler): rank by the
                  cost model, correct throughput and memory online from measurements (expected improvement
                  over per-value effects); tries near misses of the memory model. Like every sweep here it runs
                  the rules of thumb (the table layouts nearest to them) first; the row "no rules of thumb"
                  is the search alone (what this benchmark measured before the sweep used it as a sampler)
  tpe             the sweep's `--search tpe`: Optuna's multivariate TPE over the dimensions, the rules of
                  thumb first, cost-model screening (free), repeats told as failures
  random          the sweep's `--search random`: legal layouts predicted to fit, in a seeded random order
  grid (NeMo AC)  the sweep's `--search grid`: legal layouts predicted to fit, in NeMo Auto-Configurator's loop
                  order TP, PP, CP, EP, MBS (then the rest), smallest first
  plain TPE       Optuna TPE over the same dimensions with no prior: no rules of thumb, no screening;
                  combinations that are not legal layouts are told as failures without costing a trial

The first four are the sweep's own samplers driven through Optuna's ask/tell, each trial screened by the
sweep's own Screen (orchestrator/sweep/record.py), so the figures are those of `moe-autotune sweep --search`.

GPU-hours per trial = num_gpus x (STARTUP_S + STEPS x true step time) / 3600 (an OOM trial: start-up plus
one step). `run(quick=False) -> dict`; `python bench/search_efficiency.py [--quick]` prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from search_spaces.catalog.hardware import load_gpu  # noqa: E402
from search_spaces.catalog.models import load_model  # noqa: E402
from search_spaces.cost.costmodel import estimate  # noqa: E402
from search_spaces.errors import SpecError  # noqa: E402
from search_spaces.layouts.layout import SEARCH_DIMENSIONS, Layout  # noqa: E402
from search_spaces.layouts.space import candidate_layouts  # noqa: E402
from search_spaces.result import TrialResult  # noqa: E402

from orchestrator.dispatch.replay import ReplayRow, ReplayTable  # noqa: E402
from orchestrator.records import TrialRecord, enqueue  # noqa: E402
from orchestrator.records.queries import DIRECTIONS  # noqa: E402
from orchestrator.search.prior import ReplayPrior  # noqa: E402
from orchestrator.search.searches import make_sampler  # noqa: E402
from orchestrator.search.space import SweepSpace  # noqa: E402
from orchestrator.spec.schema import parse_spec  # noqa: E402
from orchestrator.sweep.record import Screen  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

TARGET = 0.98
BUDGET = 60
STARTUP_S = 300.0  # job start, model build, first compile: paid by every trial
STEPS = 20
TOKEN_ERROR, MEMORY_ERROR, NOISE = 0.10, 0.03, 0.02
PROPOSALS_PER_TRIAL = 20  # the sweep's default budget.max_proposals_per_trial
SIMPLE = {"cuda_graphs": "none", "dispatcher": "alltoall", "cp_comm_type": "p2p", "optimizer_offload": 0.0}


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    fixed: dict

    @property
    def name(self) -> str:
        return f"{self.model} {self.seq_len // 1024}k on {self.num_gpus}x{self.gpu}"


# Some dimensions are pinned so that each space is enumerated whole (a few thousand layouts).
CASES = [
    Case("qwen3-30b-a3b", "h100", 16, 32768, {**SIMPLE, "precision": "bf16", "mbs": 1, "etp": 1}),
    # gpt-oss has attention sinks: with CP, Transformer Engine runs them with a2a only (rules.py cp_window_sinks)
    Case("gpt-oss-120b", "b200", 64, 131072, {**SIMPLE, "precision": "bf16", "mbs": 1, "etp": 1, "cp": 8,
                                              "cp_comm_type": "a2a"}),
    Case("deepseek-v3", "h100", 256, 65536, {**SIMPLE, "precision": "fp8-tensorwise", "mbs": 1, "etp": 1, "cp": 8}),
]


@dataclasses.dataclass
class Landscape:
    case: Case
    layouts: list[Layout]
    pred_tokens: np.ndarray
    pred_memory: np.ndarray
    limit_gib: float
    prior: ReplayPrior  # the cost model's view, restricted to these layouts
    onehot: dict[tuple[str, str], np.ndarray]  # (dimension, value) -> mask over layouts

    @property
    def keys(self) -> list[str]:
        return [lay.key() for lay in self.layouts]


def build_landscape(case: Case, cap: int, seed: int = 0) -> Landscape:
    model, gpu = load_model(case.model), load_gpu(case.gpu)
    pool = candidate_layouts(model, gpu, case.num_gpus, case.seq_len, fixed=dict(case.fixed) or None)
    if len(pool) > cap:  # a seeded sample keeps the run short (the sweep's TPE then sees a sparse space)
        pool = random.Random(seed).sample(pool, cap)
    keep = []
    for lay in pool:
        est = estimate(model, gpu, case.num_gpus, case.seq_len, lay)
        if est.legal and est.tokens_per_sec_per_gpu:
            keep.append((lay, est))
    table = ReplayTable(path=f"<landscape {case.name}>", model=case.model, gpu=case.gpu,
                        num_gpus=case.num_gpus, seq_len=case.seq_len)
    table.rows = {lay.key(): ReplayRow(lay, "ok", TrialResult(
        status="ok", tokens_per_sec_per_gpu=est.tokens_per_sec_per_gpu, tflops_per_gpu=est.tflops_per_gpu,
        peak_memory_gib=est.peak_memory_gib), i) for i, (lay, est) in enumerate(keep)}
    spec = parse_spec({"name": "bench", "model": case.model, "gpu": case.gpu, "nodes": 1,
                       "gpus_per_node": case.num_gpus, "seq_len": case.seq_len, "backend": "analytic",
                       "tracking_uri": "none"})
    prior = ReplayPrior(spec, table)
    layouts = [lay for lay, _ in keep]
    onehot: dict[tuple[str, str], np.ndarray] = {}
    for i, lay in enumerate(layouts):
        for dim, value in lay.params(SEARCH_DIMENSIONS).items():
            onehot.setdefault((dim, str(value)), np.zeros(len(layouts), dtype=bool))[i] = True
    return Landscape(case, layouts, np.array([e.tokens_per_sec_per_gpu for _, e in keep]),
                     np.array([e.peak_memory_gib for _, e in keep]), float(gpu.memory_gib), prior, onehot)


@dataclasses.dataclass
class Truth:
    tokens: np.ndarray
    memory: np.ndarray
    fits: np.ndarray
    target: float
    rng: np.random.Generator

    def measure(self, i: int) -> tuple[str, float | None, float | None]:
        if not self.fits[i]:
            return "oom", None, None
        return "ok", float(self.tokens[i] * math.exp(self.rng.normal(0.0, NOISE))), float(self.memory[i])


def draw_truth(land: Landscape, seed: int) -> Truth:
    rng = np.random.default_rng(seed)
    tok_log = np.zeros(len(land.layouts))
    mem_log = np.zeros(len(land.layouts))
    for key in sorted(land.onehot):  # sorted: the same factors for the same seed
        mask = land.onehot[key]
        tok_log[mask] += rng.normal(0.0, TOKEN_ERROR)
        mem_log[mask] += rng.normal(0.0, MEMORY_ERROR)
    tokens = land.pred_tokens * np.exp(tok_log)
    memory = land.pred_memory * np.exp(mem_log)
    fits = memory <= land.limit_gib
    best = float(tokens[fits].max()) if fits.any() else float("inf")
    return Truth(tokens, memory, fits, TARGET * best, np.random.default_rng(seed + 7919))


def trial_gpu_hours(land: Landscape, truth: Truth, i: int) -> float:
    case = land.case
    tokens = truth.tokens[i] if truth.fits[i] else land.pred_tokens[i]
    step_s = land.layouts[i].gbs * case.seq_len / (tokens * case.num_gpus)
    steps = STEPS if truth.fits[i] else 1
    return case.num_gpus * (STARTUP_S + steps * step_s) / 3600.0


# ---- strategies: propose(tried keys) -> Layout | None ; observe(layout, status, tokens, memory) --------

class SweepSampler:
    """One of the sweep's samplers (`--search NAME`), driven as the sweep drives it: ask a trial, turn its
    params into a layout, screen it with the cost model (free), tell the measurement."""

    def __init__(self, land: Landscape, seed: int, search: str, rules_of_thumb: bool = True):
        self.prior = land.prior
        self.space = SweepSpace.from_prior(self.prior)
        self.sampler = make_sampler(search, self.space, self.prior, seed)
        self.screen = Screen(self.prior.memory_limit_gib, self.sampler.memory_margin)
        # make_sampler's samplers are Optuna samplers with SweepSampler's hooks (the protocol names the hooks only)
        self.study = optuna.create_study(directions=DIRECTIONS,
                                         sampler=cast(optuna.samplers.BaseSampler, self.sampler))
        for layout in self.prior.seeds() if rules_of_thumb else ():
            enqueue(self.study, self.space.params(layout), proposed_by="rule-of-thumb")
        self.pending: dict[str, Any] = {}
        self.proposals = 0

    def propose(self, tried):
        while self.proposals < PROPOSALS_PER_TRIAL * BUDGET:
            self.proposals += 1
            trial = self.study.ask(self.space.distributions())
            queued_by = TrialRecord.of(trial).proposed_by
            if queued_by is None and self.sampler.exhausted:
                return None
            try:
                layout = self.space.layout(trial.params)
            except SpecError:
                self._tell(trial, "infeasible", None, 0.0)
                continue
            if layout.key() in tried:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            prediction = self.prior.predict(layout)
            if self.screen(prediction, queued_by):
                self._tell(trial, "infeasible", None, prediction.peak_memory_gib or 0.0)
                continue
            self.pending[layout.key()] = trial
            return layout
        return None

    def observe(self, layout, status, tokens, memory):
        trial = self.pending.pop(layout.key())
        mem = memory if memory is not None else (self.prior.predict(layout).peak_memory_gib or 0.0)
        self._tell(trial, status, tokens, mem)

    def _tell(self, trial, status, tokens, memory) -> None:
        TrialRecord.write(trial, status=status, result=TrialResult(status=status, tokens_per_sec_per_gpu=tokens,
                                                                   peak_memory_gib=memory))
        trial.set_constraint("memory_over_limit_gib", max((memory or 0.0) - self.prior.memory_limit_gib, 0.0))
        trial.set_constraint("not_measured_ok", 0.0 if status == "ok" else 1.0)
        self.study.tell(trial, [tokens if status == "ok" else 0.0, memory or 0.0])


class PlainTPE:
    """Optuna's TPE over the dimensions' values, no prior: no seeds, no screening, no cost model."""

    def __init__(self, land: Landscape, seed: int):
        self.index = {lay.key(): lay for lay in land.layouts}
        self.base = land.layouts[0]
        self.choices = {}
        for dim in SEARCH_DIMENSIONS:
            values = sorted({lay.params([dim])[dim] for lay in land.layouts}, key=str)
            if len(values) > 1:
                self.choices[dim] = values
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        self.rng = random.Random(seed)
        self.pending: dict[str, Any] = {}
        self.proposals = 0

    def propose(self, tried):
        while self.proposals < 20 * BUDGET:
            self.proposals += 1
            trial = self.study.ask()
            params = {dim: trial.suggest_categorical(dim, values) for dim, values in self.choices.items()}
            try:
                key = Layout.from_params(params, base=self.base).key()
            except SpecError:
                key = None
            if key is None or key not in self.index or key in tried:  # not a legal layout: free failure
                self.study.tell(trial, 0.0)
                continue
            self.pending[key] = trial
            return self.index[key]
        rest = [lay for k, lay in self.index.items() if k not in tried]  # gave up: random untried
        return self.rng.choice(rest) if rest else None

    def observe(self, layout, status, tokens, memory):
        trial = self.pending.pop(layout.key(), None)
        if trial is not None:
            self.study.tell(trial, tokens if status == "ok" else 0.0)


STRATEGIES: dict[str, Callable[[Landscape, int], Any]] = {
    "calibrated": lambda land, seed: SweepSampler(land, seed, "calibrated"),
    # the search alone, without the rules of thumb the sweep runs first: what those first trials cost here
    "calibrated, no rules of thumb": lambda land, seed: SweepSampler(land, seed, "calibrated", rules_of_thumb=False),
    "tpe": lambda land, seed: SweepSampler(land, seed, "tpe"),
    "random": lambda land, seed: SweepSampler(land, seed, "random"),
    "grid (NeMo AC)": lambda land, seed: SweepSampler(land, seed, "grid"),
    "plain TPE": lambda land, seed: PlainTPE(land, seed),
}


def run_one(land: Landscape, truth: Truth, strategy) -> tuple[int | None, float, int]:
    """(trials to reach the target or None, GPU-hours spent until then / in the budget, trials run)."""
    position = {k: i for i, k in enumerate(land.keys)}
    tried: set[str] = set()
    hours = 0.0
    for n in range(1, BUDGET + 1):
        layout = strategy.propose(tried)
        if layout is None:
            break
        key = layout.key()
        tried.add(key)
        i = position[key]
        status, tokens, memory = truth.measure(i)
        hours += trial_gpu_hours(land, truth, i)
        strategy.observe(layout, status, tokens, memory)
        if status == "ok" and truth.tokens[i] >= truth.target:
            return n, hours, n
    return None, hours, len(tried)


def _rank(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (inf = did not reach the target)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _summary(trials: list[int | None], hours: list[float], ran: list[int]) -> dict[str, Any]:
    t = [math.inf if x is None else float(x) for x in trials]
    h = [hh if x is not None else math.inf for x, hh in zip(trials, hours)]
    failed = [r for x, r in zip(trials, ran) if x is None]
    return {"runs": len(t), "reached": sum(x is not None for x in trials),
            # trials a run that missed the target got through before the budget or its proposals ran out
            "missed_ran_median": _rank(failed, 0.5) if failed else None,
            "trials_median": _rank(t, 0.5), "trials_p90": _rank(t, 0.9),
            "gpu_hours_median": _rank(h, 0.5), "gpu_hours_p90": _rank(h, 0.9)}


def run(quick: bool = False, seeds: int | None = None, cap: int | None = None, verbose: bool = False) -> dict:
    seeds = seeds or (5 if quick else 20)
    cap = cap or (1500 if quick else 5000)
    cases = CASES[:2] if quick else CASES
    start = time.monotonic()
    out: dict[str, Any] = {"target": TARGET, "budget": BUDGET, "seeds": seeds, "cap": cap,
                           "errors": {"tokens_sigma": TOKEN_ERROR, "memory_sigma": MEMORY_ERROR, "noise_sigma": NOISE},
                           "startup_s": STARTUP_S, "steps": STEPS, "cases": [], "overall": {}}
    pooled: dict[str, tuple[list[int | None], list[float], list[int]]] = {name: ([], [], []) for name in STRATEGIES}
    for case in cases:
        t0 = time.monotonic()
        land = build_landscape(case, cap)
        row: dict[str, Any] = {"case": case.name, "layouts": len(land.layouts),
                               "predicted_fit": int((land.pred_memory <= land.limit_gib).sum()), "strategies": {}}
        exhaustive = []
        for name, make in STRATEGIES.items():
            trials, hours, ran = [], [], []
            for seed in range(seeds):
                truth = draw_truth(land, 1000 * seed + 17)
                n, h, r = run_one(land, truth, make(land, seed))
                trials.append(n)
                hours.append(h)
                ran.append(r)
                if name == next(iter(STRATEGIES)):
                    exhaustive.append(sum(trial_gpu_hours(land, truth, i) for i in range(len(land.layouts))))
            row["strategies"][name] = _summary(trials, hours, ran)
            pooled[name][0].extend(trials)
            pooled[name][1].extend(hours)
            pooled[name][2].extend(ran)
        row["exhaustive_gpu_hours_median"] = _rank(exhaustive, 0.5)
        row["seconds"] = round(time.monotonic() - t0, 1)
        out["cases"].append(row)
        if verbose:
            print(f"{case.name}: {row['layouts']} layouts, {row['seconds']} s", file=sys.stderr)
    out["overall"] = {name: _summary(*pooled[name]) for name in STRATEGIES}
    out["seconds"] = round(time.monotonic() - start, 1)
    return out


def _fmt(value: float, digits: int = 0) -> str:
    if math.isinf(value):
        return f">{BUDGET}" if digits == 0 else "not reached"
    return f"{value:,.{digits}f}"


def table(result: dict) -> str:
    """Markdown table of run()'s figures."""
    lines = ["| case | strategy | reached | trials median | trials p90 | GPU-h median | GPU-h p90 "
             "| missed: trials run |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["cases"]:
        label = f"{row['case']} ({row['layouts']} layouts, exhaustive {row['exhaustive_gpu_hours_median']:,.0f} GPU-h)"
        for name, s in row["strategies"].items():
            lines.append(f"| {label} | {name} | {s['reached']}/{s['runs']} | {_fmt(s['trials_median'])} | "
                         f"{_fmt(s['trials_p90'])} | {_fmt(s['gpu_hours_median'], 1)} | "
                         f"{_fmt(s['gpu_hours_p90'], 1)} | "
                         f"{_missed(s)} |")
            label = ""
    for name, s in result["overall"].items():
        lines.append(f"| **all cases** | {name} | {s['reached']}/{s['runs']} | {_fmt(s['trials_median'])} | "
                     f"{_fmt(s['trials_p90'])} | {_fmt(s['gpu_hours_median'], 1)} | "
                     f"{_fmt(s['gpu_hours_p90'], 1)} | {_missed(s)} |")
    return "\n".join(lines)


def _missed(s: dict) -> str:
    """Median trials run by the runs that missed (below the budget: the strategy stopped proposing)."""
    return "-" if s["missed_ran_median"] is None else f"{s['missed_ran_median']:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 cases, 5 seeds, at most 1500 layouts each")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--cap", type=int, default=None, help="layouts kept per case")
    args = parser.parse_args()
    result = run(quick=args.quick, seeds=args.seeds, cap=args.cap, verbose=True)
    print(table(result))
    print(f"\n(target {TARGET:.0%} of the exhaustive optimum, budget {BUDGET} trials, {result['seeds']} seeds, "
          f"{result['seconds']} s)")



def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    e = r["errors"]
    return [f"Trials until a measured layout is within {100 - 100 * r['target']:.0f}% of the exhaustive optimum, "
            f"over {r['seeds']} seeds, budget {r['budget']} trials (\">{r['budget']}\" = not reached). Landscapes "
            f"from the cost model with deliberate model error (per dimension value: throughput x exp(N(0, "
            f"{e['tokens_sigma']})), memory x exp(N(0, {e['memory_sigma']}))) and {e['noise_sigma']:.0%} measurement "
            f"noise. GPU-hours = trials x num_gpus x ({r['startup_s']:.0f} s start-up + {r['steps']} steps) of the "
            "modelled step time; the exhaustive column is every layout of the case measured once. The first four "
            "strategies are the sweep's own samplers (`--search`). Made-up landscapes, not measurements: they "
            "compare strategies, they do not predict a cluster.", "", table(r)]


if __name__ == "__main__":
    main()
