"""Layout + model -> the keyword arguments of Megatron-Core's configs. Pure mapping: no processes, no state.

`refusal()` says why a layout cannot run here (before anything is built): the sweep's own legality rules
(search_spaces.layouts.rules, for this device) plus the few things this trainer cannot build.
`transformer_config_kwargs()`, `ddp_config_kwargs()` and `optimizer_config_kwargs()` fill TransformerConfig (or
MLATransformerConfig), DistributedDataParallelConfig and OptimizerConfig; `model_kwargs()` fills GPTModel's own
arguments.
"""

from __future__ import annotations

from typing import Any

import torch

from search_spaces.cost.pipeline import SPLIT_DEFAULTS, megatron_split_fields
from search_spaces.layouts import rules
from search_spaces.layouts.layout import BY_NAME, Layout

# Megatron-Core's spellings of the layout's values (the FP8 recipe and format, the flex dispatcher and its
# backend, "all_gather", the router's capacity factor and forced balance) come from each dimension's
# declaration: BY_NAME[...].megatron_fields.
LOCAL_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")

ADAM_LR = 3e-3  # tiny proxy models learn visibly within a handful of steps


def refusal(model, gpu, layout: Layout, world: int, seq_len: int) -> str | None:
    """Why this layout cannot run on `world` ranks of `gpu` (the catalog's `cpu` on CPU), or None."""
    reasons = [f"{v.rule}: {v.reason}" for v in rules.check(model, gpu, world, seq_len, layout)]
    reasons += capability_gaps(model, layout)
    return "; ".join(reasons) or None


def capability_gaps(model, layout: Layout) -> list[str]:
    """What this trainer cannot build although the legality rules allow it (the GPU-only features on CPU
    are rules of their own: search_spaces.layouts.rules `gpu_only_feature`). Full, sliding-window and gated
    delta-net layers are all built (what Megatron-Core refuses for them are rules too)."""
    gaps = []
    if model.mtp_layers:
        gaps.append(f"{model.mtp_layers} MTP layer(s): this trainer does not build multi-token prediction")
    width_gap = model.dense_width_gap()
    if width_gap:
        gaps.append(width_gap)
    if "C" in (getattr(model, "attention_layout", "") or "") or getattr(model, "attention_chunk_size", 0) > 0:
        gaps.append(f"chunked local attention (chunks of {model.attention_chunk_size} tokens, Llama-4): "
                    "Megatron-Core has no chunked attention; this trainer would build full attention instead")
    if "full_iteration" in layout.cuda_graphs:
        gaps.append("full_iteration CUDA graphs are not supported by this trainer")
    elif layout.cuda_graphs and model.num_experts:
        # Seen on the H200 (scripts/gpu_check.sh): Megatron-Core's own ("local") graphs capture a GPT spec's MoE
        # layer whole for any scope, and dropless dispatch syncs with the host inside it, so capture fails.
        # Per-layer scopes are Transformer Engine's (make_graphed_callables, as Megatron-Bridge runs them).
        gaps.append(f"CUDA-graph scopes {','.join(layout.cuda_graphs)} of MoE layers: this trainer does not build "
                    "them (they need Transformer Engine's graph capture; Megatron-Core's local graphs capture the "
                    "whole layer, where dropless dispatch syncs with the host)")
    return gaps


def pipeline_split_kwargs(model, layout: Layout) -> dict[str, Any]:
    """The layer placement the cost model assumes (search_spaces.cost.pipeline, as every export writes it), only
    the fields that differ from Megatron's even split."""
    fields = megatron_split_fields(model, layout.pp, layout.vpp)
    return {k: v for k, v in fields.items() if v != SPLIT_DEFAULTS[k]}


def _model_architecture_kwargs(model) -> dict[str, Any]:
    hf = getattr(model, "hf_config", None) or {}
    experts = model.num_experts or 0
    moe_ffn = model.moe_ffn_hidden_size or model.ffn_hidden_size
    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_kv_heads,
        kv_channels=model.head_dim,
        ffn_hidden_size=model.ffn_hidden_size or moe_ffn,
        normalization="RMSNorm",
        layernorm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        gated_linear_unit=bool(getattr(model, "gated_mlp", True)),
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=bool(hf.get("attention_bias", False)),
        qk_layernorm=_uses_qk_norm(model),
        attention_dropout=0.0,
        hidden_dropout=0.0,
        init_method_std=float(hf.get("initializer_range", 0.02)),
    )
    if experts:
        kwargs.update(
            num_moe_experts=experts,
            moe_ffn_hidden_size=moe_ffn,
            moe_router_topk=model.topk,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_grouped_gemm=True,  # the selective recompute of moe_act needs the grouped expert MLP
            moe_router_dtype="fp32",
        )
        if model.num_shared_experts and model.shared_expert_ffn_hidden_size:
            # ModelSpec gives the total width of the shared experts, as Megatron wants it.
            kwargs["moe_shared_expert_intermediate_size"] = model.shared_expert_ffn_hidden_size
            kwargs["moe_shared_expert_gate"] = bool(model.shared_expert_gate)
        layers = model.moe_layer_list()  # interleaved dense and MoE layers (Llama-4, Qwen's decoder_sparse_step)
        first_dense = int(getattr(model, "first_k_dense", 0) or 0)
        if layers is not None:
            kwargs["moe_layer_freq"] = layers
        elif first_dense:
            kwargs["moe_layer_freq"] = [0] * first_dense + [1] * (model.num_layers - first_dense)
    kwargs.update(_attention_variant_kwargs(model))
    if model.is_mla:
        kwargs.update(
            multi_latent_attention=True,
            q_lora_rank=model.q_lora_rank,
            kv_lora_rank=model.kv_lora_rank,
            qk_head_dim=model.qk_nope_head_dim,
            qk_pos_emb_head_dim=model.qk_rope_head_dim,
            v_head_dim=model.v_head_dim,
            rope_type="rope",
        )
    return kwargs


def _attention_variant_kwargs(model) -> dict[str, Any]:
    """Megatron-Core's names for the layer kinds besides full attention, per layer as lists (layer patterns
    survive a --num-layers proxy): gated delta-net layers (Qwen3-Next) through the experimental attention
    variant, sliding windows and attention sinks (gpt-oss), gated attention output, linear biases and
    gpt-oss's clamped, offset quick-GELU GLU. Megatron-Bridge's Qwen3-Next and gpt-oss bridges set the same.
    Not set: Qwen3-Next's zero-centered norm weights (a re-parametrisation: the same function and, without
    weight decay, the same Adam updates; the CPU torch norm refuses it) and gpt-oss's YaRN RoPE scaling."""
    hf = getattr(model, "hf_config", None) or {}
    kinds = model.attention_kinds()
    kwargs: dict[str, Any] = {}
    if "linear" in kinds:
        kwargs.update(experimental_attention_variant="gated_delta_net",
                      linear_attention_freq=[int(k == "linear") for k in kinds],
                      linear_conv_kernel_dim=model.linear_conv_kernel_dim or 4,
                      linear_key_head_dim=model.linear_key_head_dim, linear_value_head_dim=model.linear_value_head_dim,
                      linear_num_key_heads=model.linear_num_key_heads,
                      linear_num_value_heads=model.linear_num_value_heads)
    if "sliding" in kinds:
        # HF's window counts the query itself; Megatron's/TE's (left, right) does not (Bridge: window - 1)
        kwargs.update(window_size=(model.sliding_window - 1, 0),
                      window_attn_skip_freq=[int(k == "sliding") for k in kinds])
    if model.attention_sinks:
        kwargs["softmax_type"] = "learnable"
    if model.attention_output_gate:
        kwargs["attention_output_gate"] = True
    if model.linear_bias:
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kwargs.update(add_bias_linear=True, activation_func=quick_gelu, glu_linear_offset=1.0,
                      activation_func_clamp_value=float(hf.get("swiglu_limit", 7.0)))
    return kwargs


def _uses_qk_norm(model) -> bool:
    explicit = getattr(model, "qk_layernorm", None)
    if explicit is not None:
        return bool(explicit)
    model_type = str((getattr(model, "hf_config", None) or {}).get("model_type", ""))
    return model_type.startswith("qwen3") and not model.is_mla


def _parallel_kwargs(layout: Layout, model, on_cpu: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        tensor_model_parallel_size=layout.tp,
        context_parallel_size=layout.cp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        sequence_parallel=layout.sp,
    )
    if model.num_experts:
        kwargs.update(expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp)
        kwargs.update(BY_NAME["dispatcher"].megatron_fields(layout.dispatcher))
        # the router's mode (dropless, capacity with padding, forced balance), on CPU too
        kwargs.update(BY_NAME["routing"].megatron_fields(layout.routing))
        # the EP all-to-all overlap (1F1B split schedule); the rules keep it to GPUs
        kwargs.update(BY_NAME["ep_overlap"].megatron_fields(layout.ep_overlap))
        if layout.expert_stash != "none":  # the paged stash (the rules keep it to GPUs with HybridEP)
            kwargs.update(BY_NAME["expert_stash"].megatron_fields(layout.expert_stash))
    if layout.activation_offload:  # fine-grained activation offload (the rules keep it to GPUs)
        kwargs.update(fine_grained_activation_offloading=True, offload_modules=list(layout.activation_offload),
                      activation_offload_fraction=layout.activation_offload_fraction)
        if "full_iteration" in layout.cuda_graphs:
            kwargs["fine_grained_offloading_max_inflight_offloads"] = 1
        if "fused_group_mlp" in layout.activation_offload:
            kwargs["use_transformer_engine_op_fuser"] = True
    if layout.cp > 1 and not on_cpu:
        kwargs.update(BY_NAME["cp_comm_type"].megatron_fields(layout.cp_comm_type))
        if layout.hierarchical_cp:
            kwargs["hierarchical_context_parallel_sizes"] = list(layout.hierarchical_cp)
    if on_cpu:
        # gloo: batched isend/irecv silently corrupts interleaved (VPP) pipelines.
        kwargs["batch_p2p_comm"] = False
    kwargs.update(pipeline_split_kwargs(model, layout))
    return kwargs


def parallel_state_kwargs(layout: Layout, on_cpu: bool) -> dict[str, Any]:
    """megatron.core.parallel_state.initialize_model_parallel's arguments: the sizes, and on GPUs the a2a+p2p
    CP hierarchy (its groups are built there; the CPU trainer all-gathers K/V whatever the type)."""
    kwargs: dict[str, Any] = dict(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp)
    if layout.cp > 1 and layout.hierarchical_cp and not on_cpu:
        kwargs["hierarchical_context_parallel_sizes"] = list(layout.hierarchical_cp)
    return kwargs


def _recompute_kwargs(layout: Layout) -> dict[str, Any]:
    if layout.recompute_granularity == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": list(layout.recompute_modules)}
    if layout.recompute_granularity == "full":
        return {"recompute_granularity": "full", "recompute_method": layout.recompute_method,
                "recompute_num_layers": layout.recompute_num_layers}
    return {}


def params_dtype(layout: Layout) -> torch.dtype:
    return torch.float32 if layout.precision == "fp32" else torch.bfloat16


def _precision_kwargs(layout: Layout) -> dict[str, Any]:
    dtype = params_dtype(layout)
    # bf16 (and for FP8 precisions the recipe and format) as the precision's declaration spells them
    fp8_params = {"fp8_param": True} if layout.fp8_param_gather else {}  # fp8 weights (the rules keep it to fp8)
    return dict(params_dtype=dtype, pipeline_dtype=dtype, **BY_NAME["precision"].megatron_fields(layout.precision),
                **fp8_params)


def _cuda_graph_kwargs(layout: Layout) -> dict[str, Any]:
    if not layout.cuda_graphs:
        return {}
    # Megatron-Core's own ("local") graphs: captured at the end of the first schedule run, no TE helper needed.
    return {"cuda_graph_impl": "local",
            "cuda_graph_modules": [m for m in layout.cuda_graphs if m in LOCAL_GRAPH_MODULES]}


def _kernel_kwargs(on_cpu: bool, have_te: bool) -> dict[str, Any]:
    """Fused kernels exist only on CUDA (most only with Transformer Engine / Apex)."""
    fused = not on_cpu and have_te
    return dict(
        use_cpu_initialization=on_cpu,
        bias_activation_fusion=fused,
        bias_dropout_fusion=fused,
        masked_softmax_fusion=fused,
        gradient_accumulation_fusion=fused,
        persist_layer_norm=False,
        apply_rope_fusion=fused,
        moe_permute_fusion=fused,
        cross_entropy_loss_fusion=fused,
    )


def transformer_config_kwargs(model, layout: Layout, on_cpu: bool, have_te: bool = False) -> dict[str, Any]:
    kwargs = _model_architecture_kwargs(model)
    kwargs.update(_parallel_kwargs(layout, model, on_cpu))
    kwargs.update(_recompute_kwargs(layout))
    kwargs.update(_precision_kwargs(layout))
    kwargs.update(_cuda_graph_kwargs(layout))
    if layout.cuda_graphs and have_te:
        kwargs["use_te_rng_tracker"] = True  # TE's RNG tracker is capturable
    kwargs.update(_kernel_kwargs(on_cpu, have_te))
    if kwargs.get("add_bias_linear"):
        kwargs["bias_dropout_fusion"] = False  # TEGroupedMLP refuses it with biases (so does Bridge's gpt-oss)
    return kwargs


def padded_vocab_size(vocab: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128·TP (make-vocab-size-divisible-by)."""
    multiple = 128 * tp
    return -(-vocab // multiple) * multiple


def model_kwargs(model, seq_len: int, tp: int = 1) -> dict[str, Any]:
    """GPTModel's own arguments (besides config, spec and pipeline placement)."""
    hf = getattr(model, "hf_config", None) or {}
    return dict(
        vocab_size=padded_vocab_size(model.vocab_size, tp),
        max_sequence_length=seq_len,
        position_embedding_type="rope",
        rotary_percent=float(hf.get("partial_rotary_factor", 1.0)),  # Qwen3-Next rotates a quarter of each head
        rotary_base=int(hf.get("rope_theta", 10000)),
        share_embeddings_and_output_weights=bool(getattr(model, "tie_embeddings", False)),
    )


def ddp_config_kwargs(layout: Layout, on_cpu: bool) -> dict[str, Any]:
    overlap = not on_cpu
    return dict(
        # fp32 main_grad buffers only for fp32 runs: Megatron-Bridge's MoE recipes reduce in bf16
        # (and the cost model counts 2 B gradients for them).
        grad_reduce_in_fp32=layout.precision == "fp32",
        overlap_grad_reduce=overlap,
        overlap_param_gather=overlap and layout.distributed_optimizer,
        use_distributed_optimizer=layout.distributed_optimizer,
        # fp8 weights gathered in fp8; MXFP8's borrow the gradient buffer for it
        # (orchestrator/outputs/export/layout_fields.py)
        **({"fp8_param_gather": True, "reuse_grad_buf_for_mxfp8_param_ag": layout.precision == "mxfp8"}
           if layout.fp8_param_gather else {}),
    )


_MOMENT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # optimizer_states -> OptimizerConfig's dtype


def optimizer_config_kwargs(layout: Layout) -> dict[str, Any]:
    dtype = params_dtype(layout)
    kwargs: dict[str, Any] = dict(
        optimizer="adam", lr=ADAM_LR, weight_decay=0.0, clip_grad=1.0,
        bf16=dtype == torch.bfloat16, params_dtype=dtype,
        use_distributed_optimizer=layout.distributed_optimizer,
    )
    if layout.optimizer_states != "fp32":  # Adam's moments in lower precision (the precision-aware optimizer)
        moments = _MOMENT_DTYPES[layout.optimizer_states]
        kwargs.update(use_precision_aware_optimizer=True, exp_avg_dtype=moments, exp_avg_sq_dtype=moments)
    if layout.optimizer_offload > 0:
        kwargs.update(optimizer_cpu_offload=True, optimizer_offload_fraction=layout.optimizer_offload,
                      use_precision_aware_optimizer=True)
    return kwargs
