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
score function (Hugging Face config `scoring_func`, softmax when absent), is the skew of the fitted pair's model
(softmax: 128 experts, top-8; sigmoid: 256 experts, top-8); a model with fewer experts per routing choice gets less
(router_skew, below):
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
Skew by expert count and top-k (router_skew): a micro-batch's copies come from a few contexts (documents), and a
trained router sends one context's copies to about CONTEXT_SPAN x top-k of the E experts (a domain picks its own
experts; the rest of its choices follow the token). An expert is among a context's experts with probability
CONTEXT_SPAN k / E, and then gets E / (CONTEXT_SPAN k) times its mean share, so its share varies from batch to batch
with a coefficient of variation proportional to sqrt(E / (CONTEXT_SPAN k) - 1): the fitted skew is scaled by that
factor over the fitted pair's, and vanishes where a context spans every expert (E <= CONTEXT_SPAN k: the sampling
term alone). CONTEXT_SPAN = 4 is the smallest span at which Mixtral (8 experts, top-2) is balanced up to sampling,
as published:
- Megatron-MoE-ModelZoo (best_practice/Mixtral/run_mixtral_8x22B.sh @0993e667, model_configs/benchmarking/
  Mixtral-8x22B.yaml, runtime_configs/benchmarking/runtime.conf: 128 H100, TP2 PP8 EP8, MBS1, GBS256, 4K, alltoall,
  the released checkpoint fine-tuned on SlimPajama with aux loss 1e-2, i.e. a trained router on real data): dropless
  about 455 TF/s, token drop padded to capacity 1.0 about 470 (0.968; the model: 1 expert per rank, the sampling
  term only, 0.98);
- Mixtral paper (Jiang et al. 2024, arXiv 2401.04088, section 5 "Routing analysis", figure 7): the share of
  tokens each expert gets is very similar across Pile domains (ArXiv, PubMed abstracts, PhilPapers, ...) at layers
  0, 15 and 31, with no obvious topic pattern -- a context does not pick its own few of Mixtral's 8 experts; OLMoE
  (arXiv 2409.02060, section 5, domain specialization) finds its fine-grained experts (64, top-8: E / k = 8)
  domain-specialised where Mixtral-8x7B's are not -- the specialisation this factor charges grows with E / k.
Above the fitted pair's E / k (gpt-oss 32, Llama-4-Maverick 128, Qwen3-Next 51, Kimi-K2 48 for sigmoid) nothing
published measures more skew: the fitted value is kept (the factor is capped at 1), as before. Only routers coarser
than the fitted pairs move (softmax E / k < 16, sigmoid E / k < 32: Mixtral-class models); the pairs themselves, and
every catalogue model, keep their skew.
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

# the per-expert coefficient of variation of dropless routing by the router's score function, for the model of the
# pair it was fitted on (fitted: see the module docstring)
EXPERT_SKEW = {"softmax": 1.3, "sigmoid": 0.16}
# (experts, top-k) of the model each kind's skew was fitted on: Qwen3-235B-A22B, DeepSeek-V3
SKEW_FITTED_MODEL = {"softmax": (128, 8), "sigmoid": (256, 8)}
# a trained router's context spreads its copies over about this many times top-k experts (the module docstring:
# the smallest span that leaves Mixtral's 8 experts, top-2, balanced up to sampling, as published)
CONTEXT_SPAN = 4.0


def router_kind(model: ModelSpec) -> str:
    """The router's score function (Hugging Face `scoring_func`; softmax when absent or not one with a fit)."""
    kind = str((getattr(model, "hf_config", None) or {}).get("scoring_func", "softmax"))
    return kind if kind in EXPERT_SKEW else "softmax"


def granularity(experts: int, topk: int) -> float:
    """How much a context's expert choice varies an expert's share: sqrt(E / (CONTEXT_SPAN k) - 1), 0 where a
    context spans every expert."""
    return math.sqrt(max(experts / (CONTEXT_SPAN * max(topk, 1)) - 1.0, 0.0))


def skew_for(kind: str, experts: int, topk: int) -> float:
    """The per-expert load spread of a trained `kind` router with `experts` experts and top-`topk`: the fitted skew
    scaled by the granularity over the fitted pair's model's, at most the fitted skew."""
    fitted_experts, fitted_topk = SKEW_FITTED_MODEL[kind]
    return EXPERT_SKEW[kind] * min(granularity(experts, topk) / granularity(fitted_experts, fitted_topk), 1.0)


def router_skew(model: ModelSpec, cpu: bool) -> float:
    """The per-expert load spread of the model's dropless router (0 on cpu: the tiny proxies' routers)."""
    if cpu:
        return 0.0
    return skew_for(router_kind(model), model.num_experts, model.topk)


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


# the published pair that checks the skew of routers coarser than the fitted pairs (the module docstring): Mixtral-8x22B
# on 128 H100 (TP2 PP8 EP8), dropless over token drop padded to capacity 1.0, TF/s
COARSE_CHECK = ("Mixtral-8x22B", 8, 455 / 470)


def extrapolation_note(model: ModelSpec, layout: Layout, cpu: bool) -> str | None:
    """Why the layout's dropless expert load rests on an extrapolation of the fitted skew (a wider EP group, or
    fewer experts per rank, than the published pair it was fitted on, or a router with fewer experts per routing
    choice, whose skew is scaled by the context span), or None."""
    if cpu or not model.is_moe or layout.ep <= 1 or BY_NAME["routing"].mode(layout.routing) != "dropless":
        return None
    kind = router_kind(model)
    fitted_ep, fitted_per_rank = SKEW_FITTED_AT[kind]
    per_rank = model.num_experts / layout.ep
    fitted_experts, fitted_topk = SKEW_FITTED_MODEL[kind]
    if model.num_experts * fitted_topk < fitted_experts * max(model.topk, 1):  # coarser than the fitted pair's
        skew = skew_for(kind, model.num_experts, model.topk)
        scaled = ("a context spans every expert: balanced up to sampling" if skew == 0.0
                  else f"the {kind} skew {EXPERT_SKEW[kind]:g} scaled to {skew:.2f}")
        name, ep, ratio = COARSE_CHECK
        return (f"dropless expert load at EP{layout.ep} ({per_rank:g} experts per rank): top-{model.topk} of "
                f"{model.num_experts} experts is coarser than the pair the {kind} skew was fitted on (top-"
                f"{fitted_topk} of {fitted_experts}), {scaled} (context span {CONTEXT_SPAN:g} x top-k); checked on "
                f"{name} at EP{ep}: dropless {ratio:.3f}x of token drop published (search_spaces/cost/routing.py)")
    if layout.ep <= fitted_ep and per_rank >= fitted_per_rank:
        return None
    checked = ""
    if kind in SKEW_CHECKS:
        ep, per, copies, published = SKEW_CHECKS[kind]
        modelled = dropless_load(ep, per, copies, EXPERT_SKEW[kind])
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
