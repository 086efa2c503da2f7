"""Calibrated search: rank untried legal layouts by predicted throughput, corrected online by measurements.

TPE over raw integers learns nothing from the cost model and wastes trials on the combinatorics. Here the
cost model ranks the candidates, and each measurement corrects it: log(measured / predicted) is fitted as
a sum of one effect per dimension value (Bayesian ridge least squares in log space, the intercept penalised
like the rest so that one slow trial lowers the layouts that share its values more than the others). The
next proposal is the untried candidate expected to fit with the largest expected improvement over the answer
(the measured layout believed fastest), averaged over draws from the posterior of the effects: values not
yet measured keep their uncertainty, so the search tries them when they could matter, and one that can only
tie the answer is not worth a trial (issue 59, against one Thompson draw: a layout within 2% of the optimum
measured after a median 12/13/3 -> 11/11/3 trials on the bench's three cases, bench/search_efficiency.py; the
sweep's answer within 2% after 16/13/4 -> 13/12/3, bench/gpu_hours.py). Whether a candidate is expected to
fit: the memory prediction is corrected the same way (per-value effects fitted to measured/predicted peak memory; an
out-of-memory trial counts as a peak 2% above the GPU's memory).

    search = CalibratedSearch.from_prior(prior, seed=0)  # the prior's legal layouts, near misses included
    layout = search.propose(tried_keys)                  # None when nothing is left
    search.observe(layout, result.status, result.tokens_per_sec_per_gpu, result.peak_memory_gib)

The sweep uses it through `orchestrator.search.samplers.CalibratedSampler`, an Optuna sampler.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from search_spaces.layouts.layout import SEARCH_DIMENSIONS, Layout


class CalibratedSearch:
    # candidates predicted to need up to this times the GPU's memory stay in the pool: measured peaks may show that
    # the memory model is pessimistic (issue 16 measured 16-19% over-prediction of activations on GPU). Such a near
    # miss is proposed only once the memory corrected by measured peaks says it fits (propose); a rule of thumb is
    # never let through by it (orchestrator/sweep/record.py Screen). At 1.15 the true optimum of 5 of 90 bench
    # sweeps was predicted 18-28% over and never tried (bench/gpu_hours.py: wrong stops 3/4/2 of 30 -> 0/2/1 at 1.35)
    MEMORY_MARGIN = 1.35

    def __init__(self, candidates: Iterable[Layout], predict: Callable[[Layout], tuple[bool, float, float | None]],
                 memory_limit_gib: float, model_error: float = 0.10, noise: float = 0.03,
                 memory_error: float = 0.05,
                 seed: int | None = 0, first: Iterable[Layout] = ()):
        """`predict(layout) -> (legal, tokens_per_sec_per_gpu, peak_memory_gib)`; illegal ones are dropped.

        model_error: prior standard deviation of each per-value effect (log space, ~relative error);
        memory_error: the same for the memory model's per-value effects: 0.05 puts a layout's peak 13-17% off over
        the 7-12 dimensions a search varies (the bench's cases vary 5-7), the size of the GPU's over-prediction of
        activations issue 16 measured (16-19%; the CPU terms are within 6%, bench memory_accuracy). At 0.10 (~35%)
        the chance that a near miss fits kept the sweep from converging (bench gpu_hours: deepseek-v3 spent a
        median 6,767 GPU-h -> 4,808, wrong stops 1/2/1 -> 1/1/1 of 30);
        noise: relative measurement noise; seed: the posterior draws (same seed, same proposals);
        `first`: layouts to measure before trusting the ranking (e.g. rules of thumb); empty by default.
        """
        self.layouts: list[Layout] = []
        tokens, memory = [], []
        for lay in dict.fromkeys(candidates):
            legal, tok, mem = predict(lay)
            if legal and tok and tok > 0:
                self.layouts.append(lay)
                tokens.append(tok)
                memory.append(mem if mem is not None else 0.0)
        self.keys = [lay.key() for lay in self.layouts]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.log_pred = np.log(np.asarray(tokens, dtype=float)) if tokens else np.zeros(0)
        self.pred_mem = np.asarray(memory, dtype=float)
        self.limit = float(memory_limit_gib)
        self.prior_precision = 1.0 / model_error ** 2
        self.memory_prior_precision = 1.0 / memory_error ** 2
        self.noise_precision = 1.0 / noise ** 2
        self.rng = np.random.default_rng(seed)
        self._chol: np.ndarray | None = None  # Cholesky factor of the posterior covariance (None: prior only)
        self._interaction = noise ** 2  # variance of a layout's own residual (_interaction_variance)
        # one-hot design matrix: one column per (dimension, value) seen among the candidates, plus intercept
        columns: dict[tuple[str, str], int] = {}
        rows = []
        for lay in self.layouts:
            row = []
            # every searchable dimension's value gets its own correction
            for dim, value in lay.params(SEARCH_DIMENSIONS).items():
                row.append(columns.setdefault((dim, str(value)), len(columns)))
            rows.append(row)
        self.X = np.zeros((len(self.layouts), len(columns) + 1))
        for i, row in enumerate(rows):
            self.X[i, row] = 1.0
        self.X[:, -1] = 1.0
        self.correction = np.zeros(len(self.layouts))
        self.memory_correction = np.zeros(len(self.layouts))
        self._obs_rows: list[int] = []
        self._obs_y: list[float] = []
        self._mem_rows: list[int] = []
        self._mem_y: list[float] = []
        self._measured: dict[int, list[int]] = {}  # candidate -> its ok measurements (positions in _obs_y)
        # the memory effects' posterior: mean and Cholesky factor of the covariance (the prior's before any peak)
        self._memory_mean = np.zeros(self.X.shape[1])
        self._memory_chol = np.eye(self.X.shape[1]) / np.sqrt(self.memory_prior_precision)
        self.first = [lay for lay in first if lay.key() in self.index]

    @classmethod
    def from_prior(cls, prior, candidates: Iterable[Layout] | None = None, limit: int = 50_000,
                   memory_margin: float = MEMORY_MARGIN, **kwargs) -> "CalibratedSearch":
        """From an orchestrator Prior: its candidates (the whole space when it is small, else the cost
        model's favourites; a replay table's layouts) predicted to need at most `memory_margin` x the GPU's
        memory: near misses stay in, because measured peaks may show that the memory model is pessimistic."""
        def predict(lay: Layout):
            p = prior.predict(lay)
            return p.legal, p.tokens_per_sec_per_gpu, p.peak_memory_gib
        if candidates is None:
            candidates = list(prior.candidates)[:limit]
        ceiling = memory_margin * prior.memory_limit_gib
        pool = [lay for lay in candidates if (prior.predict(lay).peak_memory_gib or 0.0) <= ceiling]
        return cls(pool, predict, prior.memory_limit_gib, **kwargs)

    # ---- the two calls -------------------------------------------------------------------------------
    # posterior draws behind one proposal's expected improvement. Many candidates are near ties, which the draws'
    # noise breaks: 64 and 4,096 draws chose differently in 41-58 of 83-94 proposals on the bench's landscapes, and
    # the exact (Gaussian) expected improvement, which never varies, did worse there (bench/gpu_hours.py, 30 seeds:
    # the default's answer within 2% after a median 13/12/3 trials at 64 draws, 17/13/3 exact)
    PROPOSAL_DRAWS = 64

    def propose(self, tried: set[str] | Iterable[str] = ()) -> Layout | None:
        """The untried candidate that should fit with the largest expected improvement (None: none left)."""
        tried = set(tried)
        for lay in self.first:
            if lay.key() not in tried:
                return lay
        if not self.layouts:
            return None
        fits = self.pred_mem * np.exp(self.memory_correction) <= self.limit
        untried = np.array([k not in tried for k in self.keys])
        should_fit = np.flatnonzero(fits & untried)
        if should_fit.size:
            return self.layouts[int(should_fit[np.argmax(self._expected_gain(should_fit))])]
        rest = np.flatnonzero(untried)  # nothing should fit any more: the least unlikely next
        if rest.size:
            return self.layouts[int(rest[np.argmin(self.pred_mem[rest])])]
        return None

    def observe(self, layout: Layout, status: str, tokens_per_sec_per_gpu: float | None,
                peak_memory_gib: float | None = None) -> None:
        i = self.index.get(layout.key())
        if i is None:
            return
        pred_mem = self.pred_mem[i]
        # a pruned trial's figure is its reported steps' (LayoutSampler._learn): slower than the best, and known
        if status in ("ok", "pruned") and tokens_per_sec_per_gpu and tokens_per_sec_per_gpu > 0:
            self._obs_rows.append(i)
            self._obs_y.append(float(np.log(tokens_per_sec_per_gpu) - self.log_pred[i]))
            if status == "ok":  # a pruned trial's figure is no measurement: never the answer
                self._measured.setdefault(i, []).append(len(self._obs_y) - 1)
            self._refit()
        if pred_mem > 0 and (status == "oom" or (status == "ok" and peak_memory_gib)):
            # an OOM says "more than the GPU has": counted as 2% over
            peak = self.limit * 1.02
            if peak_memory_gib:  # measured: an ok trial's peak, or the one an OOM reported
                peak = peak_memory_gib if status == "ok" else max(peak, peak_memory_gib)
            self._mem_rows.append(i)
            self._mem_y.append(float(np.log(peak / pred_mem)))
            self._memory_mean, self._memory_chol = self._posterior(self._mem_rows, self._mem_y, noise=0.01)
            self.memory_correction = self.X @ self._memory_mean

    def _posterior(self, rows: list[int], y: list[float], noise: float) -> tuple[np.ndarray, np.ndarray]:
        """The posterior mean of per-value effects fitted to `y` at `rows`, and its covariance's Cholesky factor."""
        X = self.X[rows]
        cov = np.linalg.inv(X.T @ X / noise ** 2 + self.memory_prior_precision * np.eye(X.shape[1]))
        return cov @ (X.T @ np.asarray(y) / noise ** 2), np.linalg.cholesky((cov + cov.T) / 2)

    def _refit(self) -> None:
        X = self.X[self._obs_rows]
        y = np.asarray(self._obs_y)
        # posterior of the effects: precision A = X'X/s^2 + I/tau^2, mean A^-1 X'y/s^2
        A = self.noise_precision * X.T @ X + self.prior_precision * np.eye(X.shape[1])
        cov = np.linalg.inv(A)
        self.mean = cov @ (self.noise_precision * X.T @ y)
        self.correction = self.X @ self.mean
        self._chol = np.linalg.cholesky((cov + cov.T) / 2)
        self._interaction = self._interaction_variance()

    def _interaction_variance(self) -> float:
        """How far a measured layout strays from its values' effects beyond the run noise (variance, log space): the
        mean squared residual less the noise's variance once 5 layouts are measured (empirical Bayes); before that, as
        large as the noise. Replay tables interact +-15% per row; the bench's landscapes hardly at all."""
        noise = 1.0 / self.noise_precision
        if len(self._measured) < 5:
            return noise
        residuals = np.asarray(self._obs_y)[[k for seen in self._measured.values() for k in seen]]
        rows = [self._obs_rows[k] for seen in self._measured.values() for k in seen]
        return max(0.0, float(np.mean((residuals - self.correction[rows]) ** 2)) - noise)

    def _expected_gain(self, rows: np.ndarray) -> np.ndarray:
        """Each candidate's expected relative speed-up over the answer's believed figure (0 where it is slower), over
        posterior draws of the effects; before any measurement there is no answer: the corrected prediction ranks."""
        answer = self.answer()
        if answer is None:
            return self.log_pred[rows] + self.correction[rows]
        a = self.index[answer.key()]
        bar = self.log_pred[a] + self.correction[a] + self._residual(a)
        score = self.log_pred[rows, None] + self.X[rows] @ self._draws(self.rng, self.PROPOSAL_DRAWS)
        return np.maximum(np.expm1(score - bar), 0.0).mean(axis=1)

    def believed(self, layout: Layout) -> float | None:
        """What the search believes a measured layout runs at (tokens/s/GPU): the posterior of its per-value effects
        plus its own residual (measured over that), shrunk toward the model. One run's figure carries its run noise;
        the answer is chosen on this, not on the luckiest figure (issue 59: at 2% noise the best of many measured
        figures is often a slower layout's lucky run). None when it has no ok measurement."""
        i = self.index.get(layout.key())
        if i is None or i not in self._measured:
            return None
        return float(np.exp(self.log_pred[i] + self.correction[i] + self._residual(i)))

    def _residual(self, i: int) -> float:
        """A measured candidate's own residual, shrunk: what its layout does that its values' effects do not explain
        (interactions, variance `_interaction_variance`) against the run noise, so n measurements keep
        n*t2/(n*t2 + s2) of it (issue 59: with a fixed n/(n+1), one lucky run of a slower row of a replay table
        became the answer in 6 of 12 sweeps once the search chose by expected improvement)."""
        seen = self._measured.get(i)
        if not seen:
            return 0.0
        mean = float(np.mean([self._obs_y[k] for k in seen])) - float(self.correction[i])
        spread = len(seen) * self._interaction
        return mean * spread / (spread + 1.0 / self.noise_precision) if spread > 0 else 0.0

    def answer(self) -> Layout | None:
        """The measured layout the search believes fastest (`believed`), None before any ok measurement."""
        if not self._measured:
            return None
        return self.layouts[max(self._measured, key=lambda i: self.log_pred[i] + self.correction[i]
                                + self._residual(i))]

    def chance_of_better(self, tried: Iterable[str], best: float, margin: float, draws: int = 256) -> float:
        """The posterior probability that a candidate runs more than `margin` faster than the answer and fits: the
        share of `draws` joint draws of the throughput and memory effects in which one does (its own generator, so
        asking does not change the proposals). The answer is compared in the same draw, not by its measured figure:
        a lucky run would set the bar too high and stop the search early; measured candidates count too (their
        figures are noisy), and so do near misses of the memory model in the draws where they fit. `best`: the best
        measured tokens/s/GPU (nothing measured, nothing to compare with: 0.0), the bar only without an answer."""
        tried = set(tried)
        answer = self.answer()
        others = np.array([k not in tried or self.index[k] in self._measured for k in self.keys], dtype=bool)
        if answer is not None:
            others[self.index[answer.key()]] = False
        rest = np.flatnonzero(others)
        if not rest.size or best <= 0:
            return 0.0
        rng = np.random.default_rng(len(self._obs_rows))
        w = self._draws(rng, draws)
        memory = self._memory_mean[:, None] + self._memory_chol @ rng.standard_normal((self.X.shape[1], draws))
        fits = np.log(np.maximum(self.pred_mem[rest], 1e-9))[:, None] + self.X[rest] @ memory <= np.log(self.limit)
        own = np.array([self._residual(int(i)) for i in rest])
        # what an unmeasured layout does beyond its values' effects (_interaction_variance): before 5 layouts are
        # measured, as much as one value's effect (a replay table's rows stray +-15%: 2 trials were "converged")
        unmeasured = np.array([int(i) not in self._measured for i in rest])
        stray = np.sqrt(self._interaction if len(self._measured) >= 5 else 1.0 / self.prior_precision)
        own = own[:, None] + stray * unmeasured[:, None] * rng.standard_normal((rest.size, draws))
        score = np.where(fits, self.log_pred[rest, None] + self.X[rest] @ w + own, -np.inf)
        if answer is None:
            bar = np.full(draws, np.log(best))
        else:
            a = self.index[answer.key()]
            bar = self.log_pred[a] + self.X[a] @ w + self._residual(a)
        return float(np.mean(score.max(axis=0) > bar + np.log(1.0 + margin)))

    def _draws(self, rng: np.random.Generator, draws: int) -> np.ndarray:
        """`draws` draws of the throughput effects from their posterior (columns)."""
        z = rng.standard_normal((self.X.shape[1], draws))
        return z / np.sqrt(self.prior_precision) if self._chol is None else self.mean[:, None] + self._chol @ z

    def predicted(self, layout: Layout) -> float | None:
        """The corrected tokens/s/GPU prediction of a candidate."""
        i = self.index.get(layout.key())
        return None if i is None else float(np.exp(self.log_pred[i] + self.correction[i]))
