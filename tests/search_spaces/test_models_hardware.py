"""Model and hardware catalogs: exact tiny models, known parameter counts, local config.json, errors."""

import json

import pytest

from search_spaces.catalog.hardware import GPU_NAMES, load_gpu
from search_spaces.catalog.models import MODEL_NAMES, load_model
from search_spaces.errors import SpecError


def test_tiny_moe_is_exactly_the_contract():
    m = load_model("tiny-moe")
    assert (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (64, 4, 4, 4, 16)
    assert (m.ffn_hidden_size, m.moe_ffn_hidden_size, m.num_experts, m.topk, m.vocab_size) == (128, 128, 4, 2, 256)
    assert m.is_moe and not m.is_mla and not m.tie_embeddings and m.first_k_dense == 0
    assert m.hf_config["max_position_embeddings"] == 4096 and m.hf_config["rms_norm_eps"] == 1e-6


def test_tiny_mla_moe_is_deepseek_style():
    m = load_model("tiny-mla-moe")
    assert m.is_mla and m.is_moe
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (32, 32, 16, 8, 16)
    assert (m.num_experts, m.first_k_dense, m.num_shared_experts, m.shared_expert_ffn_hidden_size) == (4, 1, 1, 128)
    assert not m.layer_is_moe(0) and m.layer_is_moe(1)


@pytest.mark.parametrize("name,low,high", [
    ("deepseek-v3", 680e9, 690e9),       # 671B + 14B MTP
    ("kimi-k2", 1.02e12, 1.04e12),
    ("qwen3-235b-a22b", 234e9, 236e9),
    ("qwen3-30b-a3b", 30e9, 31e9),
    ("qwen3-next-80b-a3b", 79e9, 81.5e9),
    ("gpt-oss-120b", 116e9, 121e9),
    ("llama3-70b", 70e9, 71e9),
    ("llama3.1-405b", 405e9, 406.5e9),
])
def test_catalog_parameter_counts_match_the_published_sizes(name, low, high):
    assert low <= load_model(name).total_params() <= high


def test_catalog_contains_the_issue_models_and_layer_patterns():
    for name in ("deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "gpt-oss-120b",
                 "kimi-k2", "llama3-70b", "llama3.1-405b", "tiny-moe", "tiny-mla-moe"):
        assert name in MODEL_NAMES
    nxt = load_model("qwen3-next-80b-a3b").attention_kinds()
    assert nxt[:4] == ("linear", "linear", "linear", "full") and nxt.count("full") == 12
    oss = load_model("gpt-oss-120b").attention_kinds()
    assert oss[:2] == ("sliding", "full")
    dsv3 = load_model("deepseek-v3")
    assert dsv3.mtp_layers == 1 and dsv3.first_k_dense == 3 and dsv3.num_moe_layers == 58
    assert not load_model("llama3-70b").is_moe


def test_local_config_json_path(tmp_path):
    cfg = json.loads((load_model("tiny-moe").hf_config and json.dumps(load_model("tiny-moe").hf_config)))
    cfg["num_hidden_layers"] = 6
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(folder / "config.json"))
    assert m.num_layers == 6 and m.name == "my-model"
    assert load_model(str(folder)).num_layers == 6


def test_bad_models_raise_spec_error(tmp_path):
    with pytest.raises(SpecError, match="unknown model"):
        load_model("no-such-model")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError):
        load_model(str(bad))
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(SpecError, match="lacks"):
        load_model(str(bad))


def test_with_overrides():
    m = load_model("deepseek-v3").with_overrides(num_layers=2, hidden_size=128)
    assert (m.num_layers, m.hidden_size, m.first_k_dense) == (2, 128, 1)
    assert load_model("tiny-moe").with_overrides() is load_model("tiny-moe")
    with pytest.raises(SpecError):
        load_model("tiny-moe").with_overrides(num_layers=0)


def test_gpus():
    assert {"h100", "h200", "b200", "gb200", "gb300", "cpu"} <= set(GPU_NAMES)
    h100 = load_gpu("H100")
    assert h100.peak("bf16") == pytest.approx(989.4) and h100.peak("fp8") == pytest.approx(1978.9)
    assert not h100.supports("mxfp8") and load_gpu("gb200").supports("mxfp8")
    assert load_gpu("gb200").nvlink_domain == 72 and h100.nvlink_domain == 8
    assert load_gpu("h200").memory_gib > h100.memory_gib
    cpu = load_gpu("cpu")
    assert cpu.supports("fp32") and cpu.supports("bf16") and not cpu.supports("fp8")
    with pytest.raises(SpecError, match="does not support"):
        cpu.peak("fp8")
    with pytest.raises(SpecError, match="unknown GPU"):
        load_gpu("tpu")


# ---- a config.json is validated like the spec (issue 15, item 9) ------------------------------------------
def _tiny_cfg() -> dict:
    from search_spaces.catalog.models import CATALOG_DIR

    return json.loads((CATALOG_DIR / "tiny-moe.json").read_text())


BAD_MODEL_FIELDS = [
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"hidden_size": -64}, "hidden_size"),
    ({"hidden_size": float("inf")}, "hidden_size"),
    ({"hidden_size": 64.5}, "hidden_size"),
    ({"hidden_size": 64.0}, "hidden_size"),
    ({"hidden_size": True}, "hidden_size"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"vocab_size": -1}, "vocab_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 4 heads are not 3 groups
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"head_dim": None, "hidden_size": 66}, "num_attention_heads"),  # 66 / 4 heads is no head dim
    ({"intermediate_size": -128}, "intermediate_size"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
    ({"num_experts": -4}, "num_experts"),
    ({"num_experts_per_tok": "two"}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),  # more than the 4 experts
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),  # a MoE model must say its top-k
    ({"first_k_dense_replace": 4}, "first_k_dense_replace"),  # no MoE layer left of 4
    ({"n_shared_experts": -1}, "n_shared_experts"),
    ({"q_lora_rank": -1}, "q_lora_rank"),
    ({"kv_lora_rank": 32, "v_head_dim": 0, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8}, "v_head_dim"),
    ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers"),
    ({"layer_types": 5}, "layer_types"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types"),  # 4 layers
    ({"layer_types": ["full_attention", "chunky", "full_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention", "full_attention"] * 2}, "sliding_window"),  # no window given
    ({"full_attention_interval": 0}, "full_attention_interval"),
    ({"full_attention_interval": 2}, "linear_num_key_heads"),  # linear layers without their sizes
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"max_position_embeddings": -1}, "max_position_embeddings"),
]


@pytest.mark.parametrize("change,field", BAD_MODEL_FIELDS, ids=[repr(c) for c, _ in BAD_MODEL_FIELDS])
def test_bad_config_fields_are_one_line_naming_field_and_file(tmp_path, change, field):
    path = tmp_path / "bad-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**_tiny_cfg(), **change}))
    with pytest.raises(SpecError) as info:
        load_model(str(path))
    message = str(info.value)
    assert field in message and str(path) in message and "\n" not in message, message


@pytest.mark.parametrize("content,needle", [
    (bytes(range(256)) * 8, "UTF-8"),
    ("[" * 100_000 + "]" * 100_000, "deep"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "deep"),
    ('{"hidden_size": 64, "x": ' + "[" * 200 + "]" * 200 + "}", "deep"),
    ('{"pad": "' + "x" * (2 << 20) + '"}', "MiB"),
    ("{not json", "JSON"),
    ("[1, 2]", "object"),
])
def test_config_files_that_are_not_small_json_objects(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SpecError, match=needle) as info:
        load_model(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_valid_variants_still_load(tmp_path):
    for i, change in enumerate([{"head_dim": None}, {"num_experts": 0, "num_experts_per_tok": None},
                                {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 32},
                                {"hidden_size": 66, "head_dim": 16}, {"rope_theta": float("inf")}]):
        path = tmp_path / f"ok-{i}" / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**_tiny_cfg(), **change}))
        load_model(str(path))


def test_each_accelerator_declares_its_family_and_host():
    import dataclasses

    from search_spaces.catalog.hardware import FAMILIES, GPUS, HOSTS
    from search_spaces.cost.gpu_terms import GPU_TERMS
    from search_spaces.cost.host_terms import HOST_TERMS
    from search_spaces.cost.throughput import terms_for

    expected = {"h100": ("hopper", "x86"), "h200": ("hopper", "x86"), "b200": ("blackwell", "x86"),
                "b300": ("blackwell", "x86"), "gb200": ("blackwell", "grace"), "gb300": ("blackwell", "grace"),
                "cpu": ("cpu", "cpu")}
    assert {name: (g.family, g.host) for name, g in GPUS.items()} == expected
    # the family is read from the declaration, never guessed from the name (an "h"-named Blackwell stays one)
    renamed = dataclasses.replace(GPUS["gb200"], name="hypothetical-gb")
    assert renamed.family == "blackwell" and not renamed.is_cpu and terms_for(renamed) is GPU_TERMS
    assert terms_for(GPUS["cpu"]) is HOST_TERMS
    assert all(terms_for(g) is GPU_TERMS for n, g in GPUS.items() if n != "cpu")
    with pytest.raises(SpecError):
        dataclasses.replace(GPUS["h100"], family="ampere")
    assert set(FAMILIES) >= {g.family for g in GPUS.values()} and set(HOSTS) >= {g.host for g in GPUS.values()}
