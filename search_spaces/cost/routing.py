"""Expert load under the router's mode: how many token copies the busiest expert-parallel rank processes, as a
multiple of the balanced share (the cost model's `expert_load`, applied to the expert GEMMs, the passes over the
routed copies, the dispatcher's all-to-all and the expert activations).

- forced_balance: 1. Random logits spread the copies evenly (the published MoE rows ran it: the cost model's
  constants are fitted on them with this load).
- capacity:F: F. Every expert is padded to F x its balanced share (moe_pad_expert_input_to_capacity), on every
  rank: the expert path computes, sends and keeps F x the balanced copies whatever the router chose.
- dropless: the expected busiest of the EP ranks. A rank's copies are the sum over its m = experts/EP local
  experts; an expert's share of the copies varies by EXPERT_SKEW (coefficient of variation, experts taken as
  independent) and a count of n copies by 1/sqrt(n) (multinomial sampling), so a rank's load has relative spread
  sigma = sqrt(skew^2 / m + 1 / n), and the busiest of EP such ranks sits z(EP) sigma above the mean, z the
  expected maximum of EP standard normals (Blom's approximation). The busiest rank changes from layer to layer;
  each MoE layer waits for its own (the all-to-all synchronises the EP group), so the step pays the expectation.
  EP = 1: every expert on one rank, load 1. More experts per rank average the skew out; a wider EP group has a
  busier maximum.

EXPERT_SKEW (documented fits, one published pair per kind of router; not measurements of ours), by the router's
score function (Hugging Face config `scoring_func`, softmax when absent):
- softmax (Qwen3, gpt-oss, Qwen3-Next): Megatron-MoE-ModelZoo (best_practice/qwen3/readme.md @ 020b8136) ran one
  Qwen3-235B layout on 256 H100 (TP4, EP8, PP8, VPP4, DeepEP, BF16, recompute layernorm and moe) from 16K to 128K
  tokens with forced-balance and with dropless routing: 295/237, 335/277, 368/320 and 389/357 TF/s (dropless 20%,
  17%, 13% and 8% slower; the gap shrinks as attention takes over the step). Fitted on the 16K and 64K pairs
  (every other length), 32K and 128K held out (tests/search_spaces/test_costmodel.py checks all four).
- sigmoid (DeepSeek-V3, Kimi-K2: group-limited routing with expert bias): Megatron-Bridge's performance summary
  has DeepSeek-V3 dropless on 1024 H100 (release 25.09; TP2, PP8, VPP4, EP64, MBS1, GBS 8192) at 338 TF/s, its
  skill card the same layout with forced balance at 370 (a later release: the routing's share is at most this).
  The softmax skew would put that pair at 0.57; the sigmoid routers are far better balanced.
On cpu the trainer's tiny untrained routers over its synthetic tokens are balanced up to sampling: no skew, the
sampling term alone (EP2 of tiny-moe at 64 tokens, the trainer's applied.expert_load measured the busiest rank at
1.07x dropless and 1.04x under forced balance; the sampling term gives 1.05).
Limits: both fits are benchmark runs (untrained routers, mock data); a trained router's balance may differ. The
softmax skew is fitted at EP8 with 16 experts per rank: wider EP groups with fewer experts per rank extrapolate
(EP32 with 4 experts per rank is charged 2.3x the balanced load). Checked there against published runs the fits never
saw (SKEW_CHECKS; tests/search_spaces/test_costmodel.py holds the load to them):
- EP64, trained routers on real data: UltraEP (arXiv 2606.04101; Dots-Infra/UltraEP @94cab099 docs/blog_v1.md, its
  end-to-end training figure) continued mid-to-late pretraining checkpoints on Megatron-LM with plain dropless routing
  and reports the busiest EP rank's average load over the mean (sequence 8192 in its released recipe): Qwen3-235B
  (2 experts per rank) 2.86, the softmax skew gives 3.15 (+10%; their Qwen3 recipe sets a sigmoid score function,
  so which router ran is not certain); DeepSeek-V3 (4 per rank, sigmoid with expert bias) 1.30, the sigmoid skew
  gives 1.19 (-8%).
- EP16, 8 experts per rank, an untrained router on real data: Qwen3-30B-A3B on 16 H100 (Megatron-Bridge: dropless
  199.1 TF/s on real data against forced balance 244.0 on mock data, the held-out `routing` pair of
  reference/knob_effects.csv): predicted 0.70 of forced balance against the published 0.82 -- the mock-data fit
  over-charges real data there (mock tokens overstate routing imbalance: DODOCO, arXiv 2605.20982).
Pure Python (statistics.NormalDist).
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

from search_spaces.catalog.models import ModelSpec
from search_spaces.layouts.layout import BY_NAME, Layout

# the per-expert coefficient of variation of dropless routing by the router's score function (fitted: see the
# module docstring)
EXPERT_SKEW = {"softmax": 1.3, "sigmoid": 0.16}


def router_skew(model: ModelSpec, cpu: bool) -> float:
    """The per-expert load spread of the model's dropless router (0 on cpu: the tiny proxies' routers)."""
    if cpu:
        return 0.0
    kind = str((getattr(model, "hf_config", None) or {}).get("scoring_func", "softmax"))
    return EXPERT_SKEW.get(kind, EXPERT_SKEW["softmax"])


@lru_cache(maxsize=256)
def busiest_of(ranks: int) -> float:
    """Expected maximum of `ranks` independent standard normals (Blom 1958: the (n - 0.375) / (n + 0.25) quantile);
    0 for one rank."""
    if ranks <= 1:
        return 0.0
    return NormalDist().inv_cdf((ranks - 0.375) / (ranks + 0.25))


def dropless_load(ep: int, experts_per_rank: float, copies: float, skew: float) -> float:
    """The busiest of `ep` ranks' copies over the mean, each rank holding `experts_per_rank` experts and receiving
    `copies` token copies on average per MoE layer and microbatch (at most all of them: `ep`)."""
    if ep <= 1:
        return 1.0
    sigma = math.sqrt(skew ** 2 / max(experts_per_rank, 1.0) + 1.0 / max(copies, 1.0))
    return min(1.0 + busiest_of(ep) * sigma, float(ep))


def expert_load(model: ModelSpec, layout: Layout, tokens: float, cpu: bool) -> float:
    """Token copies the busiest EP rank's experts process (and keep, and receive), over the balanced share, for
    the layout's routing, at most the paged stash's per-rank budget; `tokens` enter one MoE layer per microbatch on a
    rank (after the sequence-parallel split). 1 for a dense model."""
    if not model.is_moe:
        return 1.0
    load = _routed_load(model, layout, tokens, cpu)
    # the paged stash's per-rank budget (moe_expert_rank_capacity_factor): HybridEP drops the copies above it
    budget = BY_NAME["expert_stash"].parameter(layout.expert_stash)
    return load if budget is None else min(load, budget)


def _capacity_factor(layout: Layout) -> float:
    """The F of a `capacity:F` routing."""
    factor = BY_NAME["routing"].parameter(layout.routing)
    if factor is None:  # the routing dimension parses capacity only with its factor
        raise ValueError(f"routing {layout.routing!r} carries no capacity factor")
    return factor


def _routed_load(model: ModelSpec, layout: Layout, tokens: float, cpu: bool) -> float:
    dim = BY_NAME["routing"]
    mode = dim.mode(layout.routing)
    if mode == "forced_balance":
        return 1.0
    if mode == "capacity":
        return _capacity_factor(layout)
    skew = router_skew(model, cpu)
    copies = tokens * model.topk * layout.etp  # the balanced share of one rank (search_spaces.cost.memory's `routed`)
    return dropless_load(layout.ep, model.num_experts / layout.ep, copies, skew)


# where each router kind's skew was fitted (the module docstring): (EP, experts per rank) of the published pair
SKEW_FITTED_AT = {"softmax": (8, 16), "sigmoid": (64, 4)}
# published busiest-rank loads the fits never saw (the module docstring): router kind -> (EP, experts per rank, token
# copies per rank and MoE layer, published load)
SKEW_CHECKS = {"softmax": (64, 2, 8192 * 8, 2.86), "sigmoid": (64, 4, 8192 * 8, 1.30)}


def extrapolation_note(model: ModelSpec, layout: Layout, cpu: bool) -> str | None:
    """Why the layout's dropless expert load rests on an extrapolation of the fitted skew (a wider EP group, or
    fewer experts per rank, than the published pair it was fitted on), or None."""
    if cpu or not model.is_moe or layout.ep <= 1 or BY_NAME["routing"].mode(layout.routing) != "dropless":
        return None
    kind = str((getattr(model, "hf_config", None) or {}).get("scoring_func", "softmax"))
    fitted_ep, fitted_per_rank = SKEW_FITTED_AT.get(kind, SKEW_FITTED_AT["softmax"])
    per_rank = model.num_experts / layout.ep
    if layout.ep <= fitted_ep and per_rank >= fitted_per_rank:
        return None
    checked = ""
    if kind in SKEW_CHECKS:
        ep, per, copies, published = SKEW_CHECKS[kind]
        modelled = dropless_load(ep, per, copies, EXPERT_SKEW.get(kind, EXPERT_SKEW["softmax"]))
        checked = (f"; checked at EP{ep} with {per:g} experts per rank: load {modelled:.2f} against a trained router's "
                   f"published {published:.2f}")
    return (f"dropless expert load at EP{layout.ep} ({per_rank:g} experts per rank) extrapolates the {kind} router's "
            f"skew fitted at EP{fitted_ep} with {fitted_per_rank} experts per rank{checked} "
            "(search_spaces/cost/routing.py)")


def capacity_router_bytes(model: ModelSpec, layout: Layout, tokens: float) -> float:
    """What capacity routing's token dropping saves for backward in the router per MoE layer and microbatch
    (Megatron-Core's apply_router_token_dropping): the top-capacity indices of each expert's column (int64) and
    the capacity mask the probabilities are multiplied by (bool; no indices when the capacity exceeds the tokens:
    nothing is dropped); 0 for the other modes."""
    dim = BY_NAME["routing"]
    if not model.is_moe or dim.mode(layout.routing) != "capacity":
        return 0.0
    experts = model.num_experts
    capacity = math.ceil(tokens * model.topk / experts * _capacity_factor(layout))
    indices = capacity * experts * 8 if capacity <= tokens else 0.0
    return indices + tokens * experts
