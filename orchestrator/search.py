"""Calibrated search: rank untried legal layouts by predicted throughput, corrected online by measurements.

TPE over raw integers learns nothing from the cost model and wastes trials on the combinatorics. Here the
cost model ranks the candidates, and each measurement corrects it: log(measured / predicted) is fitted as
a sum of one effect per dimension value (ridge least squares in log space, the intercept penalised like the
rest so that one slow trial lowers the layouts that share its values more than the others). The next
proposal is the untried candidate with the best corrected prediction that is expected to fit: the memory
prediction is scaled by the largest measured/predicted peak ratio, and an out-of-memory trial rules out
every candidate predicted to need at least as much.

    search = CalibratedSearch.from_prior(prior)         # candidates = prior.candidates
    layout = search.propose(tried_keys)                  # None when nothing is left
    search.observe(layout, result.status, result.tokens_per_sec_per_gpu, result.peak_memory_gib)
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from search_spaces.layout import Layout

# the dimensions whose values get their own correction
DIMENSIONS = ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute", "cuda_graphs", "precision", "dispatcher",
              "cp_comm_type", "optimizer_offload")


def _value(layout: Layout, dim: str) -> str:
    if dim == "cuda_graphs":
        return ",".join(layout.cuda_graphs) or "none"
    return str(getattr(layout, dim))


class CalibratedSearch:
    def __init__(self, candidates: Iterable[Layout], predict: Callable[[Layout], tuple[bool, float, float | None]],
                 memory_limit_gib: float, ridge: float = 1.0, first: Iterable[Layout] = ()):
        """`predict(layout) -> (legal, tokens_per_sec_per_gpu, peak_memory_gib)`; illegal ones are dropped.

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
        self.ridge = float(ridge)
        # one-hot design matrix: one column per (dimension, value) seen among the candidates, plus intercept
        columns: dict[tuple[str, str], int] = {}
        rows = []
        for lay in self.layouts:
            row = []
            for dim in DIMENSIONS:
                row.append(columns.setdefault((dim, _value(lay, dim)), len(columns)))
            rows.append(row)
        self.X = np.zeros((len(self.layouts), len(columns) + 1))
        for i, row in enumerate(rows):
            self.X[i, row] = 1.0
        self.X[:, -1] = 1.0
        self.correction = np.zeros(len(self.layouts))
        self.memory_scale = 1.0
        self._obs_rows: list[int] = []
        self._obs_y: list[float] = []
        self._mem_ratios: list[float] = []
        self._oom_floor = 1.0 if len(self.layouts) else 0.0
        self._oom_seen = False
        self.first = [lay for lay in first if lay.key() in self.index]

    @classmethod
    def from_prior(cls, prior, first: Iterable[Layout] = (), **kwargs) -> "CalibratedSearch":
        """From an orchestrator Prior (its candidates and cost-model predictions)."""
        def predict(lay: Layout):
            p = prior.predict(lay)
            return p.legal, p.tokens_per_sec_per_gpu, p.peak_memory_gib
        return cls(prior.candidates, predict, prior.memory_limit_gib, first=first, **kwargs)

    # ---- the two calls -------------------------------------------------------------------------------
    def propose(self, tried: set[str] | Iterable[str] = ()) -> Layout | None:
        """The untried candidate with the best corrected prediction that should fit (None: none left)."""
        tried = set(tried)
        for lay in self.first:
            if lay.key() not in tried:
                return lay
        if not self.layouts:
            return None
        score = self.log_pred + self.correction
        fits = self.pred_mem * self.memory_scale <= self.limit
        untried = np.array([k not in tried for k in self.keys])
        should_fit = np.flatnonzero(fits & untried)
        if should_fit.size:
            return self.layouts[int(should_fit[np.argmax(score[should_fit])])]
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
        if status == "ok" and tokens_per_sec_per_gpu and tokens_per_sec_per_gpu > 0:
            self._obs_rows.append(i)
            self._obs_y.append(float(np.log(tokens_per_sec_per_gpu) - self.log_pred[i]))
            self._refit()
            if peak_memory_gib and pred_mem > 0:
                self._mem_ratios.append(peak_memory_gib / pred_mem)
        elif status == "oom" and pred_mem > 0:
            # it needed more than the GPU has: whatever needs at least as much will not fit either
            self._oom_floor = max(self._oom_floor, self.limit / pred_mem * 1.000001)
            self._oom_seen = True
        scale = max(self._mem_ratios) if self._mem_ratios else 1.0
        self.memory_scale = max(scale, self._oom_floor) if self._oom_seen else scale

    def _refit(self) -> None:
        X = self.X[self._obs_rows]
        y = np.asarray(self._obs_y)
        # ridge: (X'X + λI) w = X'y ; every column (intercept too) shrunk towards "the model is right"
        A = X.T @ X + self.ridge * np.eye(X.shape[1])
        w = np.linalg.solve(A, X.T @ y)
        self.correction = self.X @ w

    def predicted(self, layout: Layout) -> float | None:
        """The corrected tokens/s/GPU prediction of a candidate."""
        i = self.index.get(layout.key())
        return None if i is None else float(np.exp(self.log_pred[i] + self.correction[i]))
