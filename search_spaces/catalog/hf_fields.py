"""What each field of a Hugging Face config.json means to the cost model, besides the fields it reads
(search_spaces/catalog/models.py, HFConfig): known not to change what training the model costs (IGNORED: listed
in the model's reading, `moe-autotune model`), or known to change it and not modelled (UNSUPPORTED: the config is
refused, naming them). A field in none of the three is unknown and refused too: the reader cannot tell whether it
changes the cost, and a field it silently skipped could make the tool tune another model than the user's.

The meanings follow the `transformers` configuration classes of each family (and, for DeepSeek's
`moe_layer_freq`, the authors' own configuration code the published checkpoints ship).
"""

from __future__ import annotations

IGNORED: dict[str, str] = {}
UNSUPPORTED: dict[str, str] = {}


def _ignored(reason: str, *names: str) -> None:
    IGNORED.update(dict.fromkeys(names, reason))


def _unsupported(reason: str, *names: str) -> None:
    UNSUPPORTED.update(dict.fromkeys(names, reason))


_ignored("names the checkpoint, its classes or the library that wrote it",
         "architectures", "auto_map", "_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype",
         "_attn_implementation_autoset", "_attn_implementation", "attn_implementation", "for_llm_compressor",
         "cache_implementation", "use_cache", "return_dict", "output_attentions", "output_hidden_states",
         "tokenizer_class", "keys_to_ignore_at_inference", "is_encoder_decoder", "torchscript", "use_return_dict")
_ignored("the checkpoint's storage format (training runs at the layout's precision)",
         "quantization_config", "is_quantized", "quantize")
_ignored("an inference or pretraining parallelism hint (the layout decides parallelism here)",
         "pretraining_tp", "ep_size")
_ignored("a token id of the tokenizer",
         "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
         "image_token_index", "image_token_id", "boi_token_index", "eoi_token_index", "video_token_id",
         "vision_start_token_id", "vision_end_token_id", "vision_token_id", "audio_token_id")
_ignored("dropout or noise: training numerics, no parameters or FLOPs",
         "attention_dropout", "hidden_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout",
         "embd_pdrop", "resid_pdrop", "attn_pdrop", "router_jitter_noise", "projector_dropout")
_ignored("initialisation of the weights", "initializer_range", "init_std", "initializer_factor")
_ignored("a normalisation's epsilon or flavour (an RMSNorm's weights are counted either way)",
         "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "use_rmsnorm")
_ignored("position encoding (RoPE frequencies, scaling, temperature): element-wise, no parameters",
         "rope_theta", "rope_scaling", "rope_parameters", "rope_interleave", "partial_rotary_factor", "rotary_pct",
         "rope_type", "original_max_position_embeddings", "initial_context_length", "max_sequence_length",
         "attn_temperature_tuning", "attn_scale", "floor_scale")
_ignored("router numerics (score function, scaling, expert groups, auxiliary losses): the same experts and top-k",
         "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
         "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "output_router_logits", "moe_gate", "moe_use_aux_free",
         "moe_norm_min", "moe_aux_loss_lambda", "router_z_loss_coef", "multi_token_pred_lambda", "swiglu_limit")
_ignored("an expert capacity for token dropping: the cost model assumes dropless routing (every routed token is "
         "computed)", "moe_capacity")

# families the cost model does not build: refused, naming the field and what it is
_unsupported("a hybrid (state-space / Mamba) layer pattern",
             "hybrid_override_pattern", "layers_block_type", "layer_block_types", "block_types", "attn_layer_indices",
             "attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset", "mamba_d_state",
             "mamba_d_conv", "mamba_expand", "mamba_n_heads", "mamba_head_dim", "mamba_num_heads", "ssm_state_size",
             "time_step_rank", "use_mamba_kernels")
_unsupported("an attention variant the cost model does not build",
             "index_topk", "index_n_heads", "index_head_dim", "sliding_window_pattern", "global_attn_every_n_layers",
             "attention_window", "cross_attention_layers", "num_kv_shared_layers", "attention_type", "attention_layers",
             "compress_ratios")
_unsupported("a MoE layout of another family the cost model does not read",
             "mlp_layer_types", "moe_topk", "num_shared_expert", "moe_intermediate_sizes", "dense_intermediate_size",
             "moe_shared_expert_intermediate_size", "expert_interval", "zero_expert_num", "zero_expert_type",
             "n_dense_layers", "num_dense_layers", "mtp_num_layers", "moe_layer_num_skipped")
_unsupported("the model's size in another vocabulary (not a Hugging Face config.json of a family read here)",
             "n_embd", "n_layer", "n_head", "n_inner", "d_model", "d_ff", "ffn_hidden_size", "ffn_dim", "num_layers",
             "num_heads", "kv_channels", "num_query_groups", "multi_query_group_num", "num_kv_heads", "n_head_kv",
             "ffn_dim_multiplier", "multiple_of", "block_ff_dim", "block_multiple_of", "block_ffn_dim_multiplier")

# fields of a multimodal config beside its text_config: the towers are not trained here
TOWERS: dict[str, str] = dict.fromkeys(
    ("vision_config", "audio_config", "speech_config", "vision_tower_config", "visual"),
    "another modality's tower: not counted (the text model is what is read and tuned)")
_ignored("a multimodal setting of the vision side", "vision_feature_layer", "vision_feature_select_strategy",
         "multimodal_projector_bias", "multi_modal_projector_bias", "projector_hidden_act", "image_seq_length",
         "mm_tokens_per_image")
