"""Unit tests of the trainer's pure parts: Layout -> Megatron-Core config mapping, refusals, flags, faults,
the CPU patch version pin and the CP chunk layout. No processes."""

import pytest
import torch

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.layouts.layout import Layout

from trainers import config, cpu_compat, faults
from trainers.megatron_moe import build_parser, layout_from_args

TINY = load_model("tiny-moe")
MLA = load_model("tiny-mla-moe")
CPU = load_gpu("cpu")


def L(**fields) -> Layout:
    return Layout.from_dict(fields)


def test_layout_maps_onto_transformer_config_fields():
    layout = L(tp=2, cp=2, ep=2, etp=1, pp=2, vpp=2, mbs=1, gbs=8, recompute="moe_act,layernorm",
                    dispatcher="allgather", precision="bf16")
    kw = config.transformer_config_kwargs(TINY, layout, on_cpu=True)
    assert (kw["tensor_model_parallel_size"], kw["context_parallel_size"], kw["pipeline_model_parallel_size"],
            kw["virtual_pipeline_model_parallel_size"], kw["expert_model_parallel_size"],
            kw["expert_tensor_parallel_size"]) == (2, 2, 2, 2, 2, 1)
    assert kw["sequence_parallel"] is True  # TP > 1 with MoE
    assert kw["moe_token_dispatcher_type"] == "allgather"
    assert kw["recompute_granularity"] == "selective" and kw["recompute_modules"] == ["moe_act", "layernorm"]
    assert kw["bf16"] and kw["params_dtype"] == torch.bfloat16
    assert kw["batch_p2p_comm"] is False  # gloo + VPP is silently wrong otherwise
    assert (kw["num_layers"], kw["hidden_size"], kw["num_moe_experts"], kw["moe_router_topk"]) == (4, 64, 4, 2)
    assert kw["kv_channels"] == 16 and kw["num_query_groups"] == 4


def test_gpu_features_map_to_megatron_names():
    layout = Layout(precision="fp8-delayed", dispatcher="deepep", cuda_graphs="attn,moe_router",
                    recompute="full", recompute_method="block", recompute_num_layers=2, cp=4,
                    cp_comm_type="a2a+p2p", hierarchical_cp="2,2", optimizer_offload=0.5)
    kw = config.transformer_config_kwargs(TINY, layout, on_cpu=False)
    assert (kw["fp8"], kw["fp8_recipe"]) == ("hybrid", "delayed")
    assert (kw["moe_token_dispatcher_type"], kw["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    assert kw["cuda_graph_impl"] == "local" and kw["cuda_graph_modules"] == ["attn", "moe_router"]
    assert (kw["recompute_granularity"], kw["recompute_method"], kw["recompute_num_layers"]) == ("full", "block", 2)
    assert kw["cp_comm_type"] == "a2a+p2p" and "batch_p2p_comm" not in kw
    assert kw["hierarchical_context_parallel_sizes"] == [2, 2]
    ps = config.parallel_state_kwargs(layout, on_cpu=False)
    assert ps["context_parallel_size"] == 4 and ps["hierarchical_context_parallel_sizes"] == [2, 2]
    # the CPU trainer all-gathers K/V whatever the type: no hierarchy there
    assert "hierarchical_context_parallel_sizes" not in config.parallel_state_kwargs(layout, on_cpu=True)
    opt = config.optimizer_config_kwargs(layout)
    assert opt["optimizer_cpu_offload"] and opt["optimizer_offload_fraction"] == 0.5
    assert config.transformer_config_kwargs(TINY, L(cp=2, cp_comm_type="allgather"), on_cpu=False)[
        "cp_comm_type"] == "all_gather"


def test_megatron_accepts_the_mapped_configs():
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    layout = L(tp=2, ep=2, pp=2, mbs=1, gbs=4, recompute="full", precision="fp32")
    cfg = TransformerConfig(**config.transformer_config_kwargs(TINY, layout, on_cpu=True))
    assert cfg.sequence_parallel and cfg.recompute_granularity == "full"
    mla = MLATransformerConfig(**config.transformer_config_kwargs(MLA, L(precision="fp32"), on_cpu=True))
    assert mla.multi_latent_attention and mla.moe_layer_freq == [0, 1, 1, 1]
    assert mla.moe_shared_expert_intermediate_size == MLA.shared_expert_ffn_hidden_size
    DistributedDataParallelConfig(**config.ddp_config_kwargs(layout, on_cpu=True))
    OptimizerConfig(**config.optimizer_config_kwargs(layout))


def test_routing_sets_megatrons_router_options_and_reads_back():
    from megatron.core.transformer.transformer_config import TransformerConfig

    from trainers.routing_load import routing_in_effect

    expected = {"dropless": (None, False, False), "capacity:1.25": (1.25, True, False),
                "forced_balance": (None, False, True)}
    for routing, (factor, pad, forced) in expected.items():
        kw = config.transformer_config_kwargs(TINY, L(ep=2, routing=routing, precision="fp32"), on_cpu=True)
        assert (kw.get("moe_expert_capacity_factor"), kw["moe_pad_expert_input_to_capacity"],
                kw["moe_router_force_load_balancing"]) == (factor, pad, forced)
        assert routing_in_effect(TransformerConfig(**kw)) == routing  # after Megatron-Core's own validation
    # a dense model has no router: no routing field is set
    dense = config.transformer_config_kwargs(load_model("llama3-8b").with_overrides(num_layers=2, hidden_size=64),
                                             L(precision="fp32"), on_cpu=True)
    assert not {k for k in dense if k.startswith("moe_") and k != "moe_permute_fusion"}


def test_routing_rules_refuse_exactly_what_megatron_core_refuses():
    """Every routing x dispatcher x graph scope: the sweep's routing rules and TransformerConfig.__post_init__
    (flex + DeepEP refuses padding to capacity; the moe graph scope needs drop-and-pad) agree."""
    import itertools
    import warnings

    from megatron.core.transformer.transformer_config import TransformerConfig

    from search_spaces.layouts.rules import check

    for routing, dispatcher, graphs in itertools.product(("dropless", "capacity:1.25", "forced_balance"),
                                                         ("alltoall", "allgather", "deepep", "hybridep"),
                                                         ("none", "moe", "moe_router,moe_preprocess")):
        layout = L(ep=2, routing=routing, dispatcher=dispatcher, cuda_graphs=graphs)
        ours = [v.rule for v in check(TINY, load_gpu("h100"), 2, 512, layout) if v.rule.startswith("routing")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                TransformerConfig(**config.transformer_config_kwargs(TINY, layout, on_cpu=False))
                refused = False
            except (ValueError, AssertionError):
                refused = True
        assert bool(ours) == refused, (layout.key(), ours)


def test_ep_overlap_rules_refuse_exactly_what_megatron_core_refuses():
    """The EP overlap over dispatcher x recompute x pipeline x graph scope x precision: the sweep's
    ep_overlap_needs and ep_overlap_schedule rules and TransformerConfig.__post_init__ agree (the GPU config: on cpu the
    overlap is a gpu_only_feature)."""
    import itertools
    import warnings

    from megatron.core.transformer.transformer_config import TransformerConfig

    from search_spaces.layouts.rules import check

    checked = 0
    for dispatcher, recompute, (pp, vpp), graphs, precision in itertools.product(
            ("alltoall", "allgather", "hybridep"), ("none", "moe_act", "moe", "full"), ((1, 1), (2, 1), (2, 2)),
            ("none", "attn,moe_router,moe_preprocess", "moe_router,moe_preprocess"), ("bf16", "fp32")):
        layout = L(ep=2, pp=pp, vpp=vpp, gbs=4, dispatcher=dispatcher, recompute=recompute, cuda_graphs=graphs,
                   precision=precision, ep_overlap=True)
        kwargs = config.transformer_config_kwargs(TINY, layout, on_cpu=False)
        assert kwargs["overlap_moe_expert_parallel_comm"] is True

        def refused(kw) -> bool:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    TransformerConfig(**kw)
                    return False
                except (ValueError, AssertionError):
                    return True

        if refused({**kwargs, "overlap_moe_expert_parallel_comm": False}):
            continue  # Megatron refuses the layout for another reason (e.g. full recompute beside graph scopes)
        checked += 1
        ours = [v.rule for v in check(TINY, load_gpu("h100"), 4, 512, layout) if v.rule.startswith("ep_overlap")]
        assert bool(ours) == refused(kwargs), (layout.key(), ours)
    assert checked >= 150, checked  # 180 of the 216 build without the overlap


def test_the_trainer_places_layers_where_the_cost_model_does():
    both = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    five = TINY.with_overrides(num_layers=5)
    assert config.pipeline_split_kwargs(TINY, L(pp=2)) == {}
    assert config.pipeline_split_kwargs(TINY, L(pp=3)) == both
    # 5 layers on 2 stages: the balanced explicit layout of search_spaces.cost.pipeline, in Megatron's syntax
    assert config.pipeline_split_kwargs(five, L(pp=2)) == {"pipeline_model_parallel_layout": "Ettt|ttL"}
    assert config.refusal(TINY, CPU, L(pp=8, gbs=8), world=8, seq_len=64).startswith("pipeline_split:")


@pytest.mark.parametrize("fields, words", [
    (dict(precision="fp8"), "fp8-blockwise"),
    (dict(dispatcher="hybridep"), "dispatcher hybridep"),
    (dict(optimizer_offload=0.5), "optimizer offload"),
    (dict(cp=2, cp_comm_type="a2a"), "cp_comm_type a2a"),
])
def test_gpu_only_features_are_refused_on_cpu(fields, words):
    layout = L(**fields)
    reason = config.refusal(TINY, CPU, layout, world=layout.cp, seq_len=64)
    assert reason and "gpu_only_feature: not available on cpu" in reason and words in reason
    assert config.refusal(TINY, load_gpu("h100"), layout, world=layout.cp, seq_len=64) is None


@pytest.mark.parametrize("scopes", ["attn", "moe_router,moe_preprocess", "attn,moe_router,moe_preprocess", "moe"])
def test_cuda_graph_scopes_of_moe_layers_are_refused_on_gpu_too(scopes):
    """Megatron-Core's local graphs capture a MoE layer whole, which dropless dispatch cannot (the H200 check's
    capture failure): refused with the reason before anything is built, on a GPU as on CPU."""
    layout = L(cuda_graphs=scopes)
    on_gpu = config.refusal(TINY, load_gpu("h100"), layout, world=1, seq_len=64)
    assert on_gpu and scopes in on_gpu and "Transformer Engine's graph capture" in on_gpu
    assert "gpu_only_feature: not available on cpu" in config.refusal(TINY, CPU, layout, world=1, seq_len=64)
    assert config.refusal(TINY, load_gpu("h100"), L(), world=1, seq_len=64) is None


def test_illegal_shapes_are_refused_by_the_sweeps_rules():
    assert "world_dense" in config.refusal(TINY, CPU, L(tp=2), world=3, seq_len=64)
    assert "experts_ep" in config.refusal(TINY, CPU, L(ep=8, gbs=8), world=8, seq_len=64)
    assert "global_batch" in config.refusal(TINY, CPU, L(mbs=1, gbs=1), world=2, seq_len=64)
    assert "sequence_cp" in config.refusal(TINY, CPU, L(cp=2, tp=2), world=4, seq_len=66)
    assert config.refusal(TINY, CPU, L(ep=2, pp=2, mbs=1, gbs=2), world=4, seq_len=64) is None


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.parametrize("model", [TINY, MLA], ids=lambda m: m.name)
def test_the_sweep_and_the_trainer_agree_on_every_layout_of_a_small_space(model):
    """One rule set: for every combination of a small raw space (legal or not), the cost model's legality
    (what the sweep screens with) and the trainer's refusal give the same verdict."""
    import itertools

    from search_spaces.cost.costmodel import estimate
    from search_spaces.layouts.space import dimensions

    values = dimensions(model, CPU, 4, 128, gbs=4).values
    values.update(tp=[1, 2, 4], cp=[1, 2, 4], ep=[1, 2, 4, 8], etp=[1, 2], pp=[1, 2, 3, 4, 8], vpp=[1, 2],
                  mbs=[1, 2], precision=["fp32", "fp8"], dispatcher=["alltoall", "deepep"], cp_comm_type=["p2p", "a2a"])
    names = list(values)
    checked = disagreements = 0
    for combo in itertools.product(*(values[n] for n in names)):
        try:
            layout = Layout(**dict(zip(names, combo)))
        except Exception:  # noqa: BLE001 -- not even a Layout (gbs % mbs): neither side sees it
            continue
        for seq_len in (128, 130):
            legal = estimate(model, CPU, 4, seq_len, layout, with_time=False).legal
            refused = config.refusal(model, CPU, layout, world=4, seq_len=seq_len)
            checked += 1
            disagreements += legal == bool(refused)
    assert checked > 1000 and disagreements == 0


def test_the_trainer_names_what_it_cannot_build():
    assert "MTP" in " ".join(config.capability_gaps(load_model("deepseek-v3"), L()))
    assert "full_iteration" in " ".join(config.capability_gaps(TINY, L(cuda_graphs="full_iteration")))
    for name in ("tiny-moe", "qwen3-next-80b-a3b", "gpt-oss-120b", "tiny-qwen3-next", "tiny-gpt-oss"):
        assert config.capability_gaps(load_model(name), L()) == [], name  # every attention kind is built
    assert config.refusal(load_model("qwen3-next-80b-a3b"), load_gpu("h100"), L(), world=1, seq_len=4096) is None


def test_qwen3_next_maps_onto_megatrons_gated_delta_net_variant():
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = load_model("tiny-qwen3-next").with_overrides(num_layers=6)  # the pattern survives a proxy
    kw = config.transformer_config_kwargs(model, L(tp=2, gbs=2), on_cpu=True)
    assert kw["experimental_attention_variant"] == "gated_delta_net"
    assert kw["linear_attention_freq"] == [1, 1, 1, 0, 1, 1]
    assert (kw["linear_key_head_dim"], kw["linear_value_head_dim"], kw["linear_num_key_heads"],
            kw["linear_num_value_heads"], kw["linear_conv_kernel_dim"]) == (16, 16, 2, 4, 4)
    assert kw["attention_output_gate"] and kw["qk_layernorm"] and kw["moe_shared_expert_gate"]
    assert "window_size" not in kw and kw["add_bias_linear"] is False
    cfg = TransformerConfig(**kw)
    assert cfg.linear_attention_freq == [1, 1, 1, 0, 1, 1] and cfg.sequence_parallel
    assert config.model_kwargs(model, 128)["rotary_percent"] == 0.25


def test_gpt_oss_maps_onto_windows_sinks_and_biases():
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    model = load_model("tiny-gpt-oss")
    kw = config.transformer_config_kwargs(model, L(gbs=1), on_cpu=False, have_te=True)
    assert kw["window_size"] == (31, 0)  # HF's 32-token window includes the query itself
    assert kw["window_attn_skip_freq"] == [1, 0, 1, 0]
    assert kw["softmax_type"] == "learnable"
    assert kw["add_bias_linear"] and kw["activation_func"] is quick_gelu and kw["gated_linear_unit"]
    assert (kw["glu_linear_offset"], kw["activation_func_clamp_value"]) == (1.0, 7.0)
    assert kw["bias_dropout_fusion"] is False  # TEGroupedMLP refuses it with biases
    assert "experimental_attention_variant" not in kw
    cfg = TransformerConfig(**{**kw, "bias_activation_fusion": False, "apply_rope_fusion": False,
                               "masked_softmax_fusion": False, "gradient_accumulation_fusion": False,
                               "moe_permute_fusion": False, "cross_entropy_loss_fusion": False})
    # layers 1 and 3 (1-based) slide, 2 and 4 are full, as the HF layer_types say
    assert [is_layer_window_attention(cfg.window_size, cfg.window_attn_skip_freq, n) for n in (1, 2, 3, 4)] == [
        True, False, True, False]


def test_flags_round_trip_through_the_trainer_parser(tmp_path):
    layout = Layout(tp=2, cp=1, ep=2, pp=2, vpp=2, mbs=2, gbs=16, recompute="full",
                    recompute_method="block", recompute_num_layers=2, precision="fp32", dispatcher="allgather",
                    distributed_optimizer=False)
    args = build_parser().parse_args(["--model", "tiny-moe", *layout.to_flags()])
    assert layout_from_args(args, on_cpu=True) == layout
    path = tmp_path / "layout.yaml"
    path.write_text("tp: 2\nep: 2\nmbs: 1\ngbs: 4\nrecompute: full\nrecompute_method: block\nprecision: fp32\n")
    argv = ["--model", "tiny-moe", "--layout", str(path), "--gbs", "8"]
    from_file = layout_from_args(build_parser().parse_args(argv), on_cpu=True)
    assert from_file == Layout(tp=2, ep=2, mbs=1, gbs=8, recompute="full", recompute_method="block",
                               precision="fp32")


def test_fault_spec_parsing():
    assert faults.parse("oom@3") == faults.Fault("oom", 3)
    assert faults.parse("slow@1:0.5", "2") == faults.Fault("slow", 1, 0.5, 2)
    assert faults.parse(None) is None
    for bad in ("oom", "boom@1", "slow@1", "hang@x"):
        with pytest.raises(ValueError):
            faults.parse(bad)
    with pytest.raises(torch.OutOfMemoryError):
        faults.parse("oom@2").fire(step=2, rank=0)
    faults.parse("oom@2", "1").fire(step=2, rank=0)  # another rank's fault


def test_cpu_patches_fail_loudly_on_another_megatron_version():
    cpu_compat.check_version()  # the pinned version is the installed one
    cpu_compat.check_version("0.19.2+local")
    with pytest.raises(cpu_compat.CPUCompatError, match="pinned to megatron-core 0.19.2"):
        cpu_compat.check_version("0.20.0")
    cpu_compat.check_symbols()  # every private symbol the patches replace still exists


def test_cp_chunks_cover_the_sequence_once_in_megatron_order(monkeypatch):
    from megatron.core.utils import get_batch_on_this_cp_rank

    from trainers.cp_attention import cp_chunk_positions

    seq, cp = 16, 2
    positions = torch.cat([cp_chunk_positions(r, cp, seq // cp) for r in range(cp)])
    assert sorted(positions.tolist()) == list(range(seq))

    class FakeGroup:  # get_batch_on_this_cp_rank only asks the group its size and our rank
        def __init__(self, rank):
            self._rank = rank

        def size(self):
            return cp

        def rank(self):
            return self._rank

    for rank in range(cp):
        monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None, rank=rank: rank)
        batch = get_batch_on_this_cp_rank({"position_ids": torch.arange(seq).unsqueeze(0)}, is_hybrid_cp=False,
                                          cp_group=FakeGroup(rank))
        assert batch["position_ids"][0].tolist() == cp_chunk_positions(rank, cp, seq // cp).tolist()


# ---- the CPU references of flash-linear-attention's kernels (cpu_compat) against a step-by-step recurrence ----

def _naive_gated_delta_rule(q, k, v, g, beta):
    """FLA's naive recurrence, one token at a time: S = exp(g) S; u = beta (v - S^T k); S += k u^T; o = S^T q s."""
    batch, seq, heads, key_dim = q.shape
    state = torch.zeros(batch, heads, key_dim, v.shape[-1], dtype=q.dtype)
    out = torch.zeros(batch, seq, heads, v.shape[-1], dtype=q.dtype)
    for t in range(seq):
        state = state * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], state))
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], u)
        out[:, t] = key_dim ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state)
    return out, state


def _delta_rule_inputs(seq=150):
    gen = torch.Generator().manual_seed(3)
    shape = (2, seq, 3)
    q = torch.randn(*shape, 8, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(*shape, 8, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(*shape, 6, generator=gen, dtype=torch.float64)
    g = -0.5 * torch.rand(*shape, generator=gen, dtype=torch.float64)  # log decay
    beta = torch.rand(*shape, generator=gen, dtype=torch.float64)
    return [q, k, v, g, beta]


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_reference_gated_delta_rule_equals_the_recurrence_forward_and_backward(chunk_size):
    inputs = _delta_rule_inputs()  # 150 tokens: whole chunks plus a padded tail
    expected, state = _naive_gated_delta_rule(*inputs)
    out, final = cpu_compat.reference_chunk_gated_delta_rule(*inputs, output_final_state=True,
                                                             chunk_size=chunk_size)
    assert torch.allclose(out, expected, rtol=0, atol=1e-10) and torch.allclose(final, state, rtol=0, atol=1e-10)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        o = fn(*leaves)
        (o * torch.cos(o)).sum().backward()
        return [t.grad for t in leaves]

    naive = grads(lambda *t: _naive_gated_delta_rule(*t)[0])
    # the path Megatron takes (no state in or out): the recomputing autograd function
    chunked = grads(lambda *t: cpu_compat.reference_chunk_gated_delta_rule(*t, chunk_size=chunk_size)[0])
    for name, a, b in zip("q k v g beta".split(), naive, chunked):
        assert torch.allclose(a, b, rtol=0, atol=1e-10), name


def test_reference_gated_delta_rule_keeps_only_its_inputs_for_backward():
    inputs = [t.float().requires_grad_() for t in _delta_rule_inputs(seq=128)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        cpu_compat.reference_chunk_gated_delta_rule(*inputs)
    assert sum(t.numel() for t in saved) == sum(t.numel() for t in inputs)  # q, k, v, g, beta as FLA keeps them
    with pytest.raises(NotImplementedError, match="packed"):
        cpu_compat.reference_chunk_gated_delta_rule(*inputs, cu_seqlens=torch.tensor([0, 64, 128]))


def test_reference_causal_conv1d_and_l2norm_equal_their_definitions():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 20, 6, generator=gen, dtype=torch.float64)
    weight, bias = torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    y, final = cpu_compat.reference_causal_conv1d(x, weight, bias, activation="silu")
    expected = torch.zeros_like(y)
    for t in range(20):  # output t sees inputs t-3..t (weight[:, -1] on the newest)
        acc = bias + sum(x[:, t - 3 + j] * weight[:, j] for j in range(4) if t - 3 + j >= 0)
        expected[:, t] = torch.nn.functional.silu(acc)
    assert final is None and torch.allclose(y, expected, rtol=0, atol=1e-12)
    norm = cpu_compat.reference_l2norm(x)
    assert torch.allclose(norm, x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6), rtol=0, atol=1e-12)


def test_cpu_attention_windows_and_sinks_equal_megatrons_local_softmax(monkeypatch):
    """The CPU stand-in for TE's sliding-window + sink attention against Megatron-Core's own local pieces:
    its window mask (get_sliding_window_causal_mask) and its sink softmax (SoftmaxOne), and a per-query loop."""
    from megatron.core import parallel_state
    from megatron.core.fusions.fused_softmax import SoftmaxOne
    from megatron.core.transformer import utils as mcore_utils
    from megatron.core.transformer.transformer_config import TransformerConfig

    from trainers.cp_attention import ContextParallelDotProductAttention

    for name, value in (("get_tensor_model_parallel_world_size", 1), ("get_tensor_model_parallel_rank", 0),
                        ("get_context_parallel_world_size", 1), ("get_context_parallel_rank", 0),
                        ("get_context_parallel_group", None)):
        monkeypatch.setattr(parallel_state, name, lambda value=value: value)
    kw = config.transformer_config_kwargs(load_model("tiny-gpt-oss"), L(gbs=1, precision="fp32"), on_cpu=True)
    cfg = TransformerConfig(**kw)
    window, full = (ContextParallelDotProductAttention(cfg, layer_number=n, attn_mask_type=None,
                                                       attention_type="self") for n in (1, 2))
    assert window.window_size == (31, 0) and full.window_size is None
    gen = torch.Generator().manual_seed(11)
    seq, heads, groups, dim = 80, 4, 2, 16
    q = torch.randn(seq, 1, heads, dim, generator=gen)
    k, v = (torch.randn(seq, 1, groups, dim, generator=gen) for _ in range(2))
    with torch.no_grad():
        window.softmax_offset.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
        out = window(q, k, v)
    # Megatron's local attention: scores, its sliding-window causal mask, SoftmaxOne with the sinks
    kr, vr = (t.repeat_interleave(heads // groups, dim=2) for t in (k, v))
    scores = torch.einsum("qbhd,kbhd->bhqk", q, kr) / dim ** 0.5
    cpu_ones = torch.ones  # Megatron builds the mask on device="cuda"
    monkeypatch.setattr(torch, "ones", lambda *size, device=None, **kwargs: cpu_ones(*size, **kwargs))
    hidden = mcore_utils.get_sliding_window_causal_mask(seq, seq, cfg.window_size)
    probs = SoftmaxOne(-1, window.softmax_offset.detach())(scores.masked_fill(hidden, -10000.0))
    expected = torch.einsum("bhqk,kbhd->qbhd", probs, vr).reshape(seq, 1, -1)
    assert torch.allclose(out, expected, atol=1e-6)
    # and a per-query loop: keys i-31..i, one extra exp(sink) in the denominator
    i, h = 70, 2
    logits = scores[0, h, i, i - 31:i + 1]
    weights = logits.exp() / (logits.exp().sum() + torch.exp(torch.tensor(2.0)))
    assert torch.allclose(out[i, 0, h * dim:(h + 1) * dim], weights @ vr[i - 31:i + 1, 0, h], atol=1e-6)
    assert not torch.allclose(full(q, k, v)[i], out[i])  # the full layer sees the whole prefix


INTERLEAVED = "tests/data/models/tiny-interleaved-moe.json"  # decoder_sparse_step 2: dense, MoE, dense, MoE


def test_the_trainer_builds_an_interleaved_models_moe_layers_or_names_what_it_cannot():
    model = load_model(INTERLEAVED)
    assert model.mlp_widths() == (256, 0, 256, 0)
    kw = config.transformer_config_kwargs(model, L(), on_cpu=True)
    assert (kw["moe_layer_freq"], kw["ffn_hidden_size"], kw["moe_ffn_hidden_size"]) == ([0, 1, 0, 1], 256, 96)
    assert config.capability_gaps(model, L()) == []
    maverick = load_model("tests/data/hf_configs/llama-4-maverick-17b-128e-instruct.json")
    assert config.transformer_config_kwargs(maverick, L(), on_cpu=False)["moe_layer_freq"] == [0, 1] * 24
    gaps = " ".join(config.capability_gaps(maverick, L()))
    assert "chunked local attention" in gaps and "8192" in gaps  # refused, not built as full attention
    import dataclasses
    two_widths = dataclasses.replace(model, mlp_pattern=(256, 0, 128, 0))
    assert "widths [128, 256]" in " ".join(config.capability_gaps(two_widths, L()))


_COUNT = """
import json, sys, types
from search_spaces.catalog.models import load_model
from search_spaces.layouts.layout import Layout
from trainers import run
model = load_model(sys.argv[1])
built = run._build(types.SimpleNamespace(comm_timeout=60, seed=0, seq_len=64, packing_histogram=None), Layout(),
                   model, on_cpu=True)
print(json.dumps([sum(p.numel() for c in built.chunks for p in c.parameters()), model.total_params()]))
"""


@pytest.mark.slow  # builds the model with Megatron-Core in a process of its own (a world of one), ~5 s
@pytest.mark.parametrize("name", ["tiny-moe", INTERLEAVED])
def test_the_built_model_has_the_models_parameter_count(name):
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _COUNT, name], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    built, counted = json.loads(proc.stdout.strip().splitlines()[-1])
    assert built == counted
