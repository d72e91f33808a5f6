"""HF Llama -> TensorRT-LLM checkpoint conversion, on a tiny random model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from backend.formats.checkpoint import (
    LM_HEAD,
    LN_F,
    VOCAB_EMBEDDING,
    Mapping,
    QuantConfig,
    TrtllmCheckpointConfig,
    rank_file,
)
from backend.formats.checkpoint_tensors import LayerNames, expected_shapes, qkv_split_sizes
from build_engines.cli import main
from build_engines.convert import convert_hf_to_trtllm
from build_engines.tokenizer import endoftext_id

EXPECTED_KEYS = {
    "architecture", "dtype", "logits_dtype", "vocab_size", "max_position_embeddings", "hidden_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_size", "intermediate_size",
    "hidden_act", "norm_epsilon", "position_embedding_type", "rotary_base", "rotary_scaling", "rotary_pct",
    "attn_bias", "mlp_bias", "qk_layernorm", "tie_word_embeddings", "share_embedding_table", "use_parallel_embedding",
    "embedding_sharding_dim", "sliding_window", "layer_types", "mapping", "quantization", "bos_token_id",
    "eos_token_id",
}
SIDE_FILES = ["generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


# tokenizer_dir and tiny_hf_dir (make_tiny_random, seed 0) come from tests/conftest.py.
@pytest.fixture(scope="module")
def trt_dir(tmp_path_factory, tiny_hf_dir) -> Path:
    return convert_hf_to_trtllm(tiny_hf_dir, tmp_path_factory.mktemp("trt") / "ckpt")


def _config_kwargs(**overrides) -> dict:
    base = dict(vocab_size=100, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_size=16, intermediate_size=128,
                norm_epsilon=1e-5, rotary_base=10000.0)
    return {**base, **overrides}


def test_config_json(trt_dir, tokenizer_dir):
    data = json.loads((trt_dir / "config.json").read_text())
    assert set(data) == EXPECTED_KEYS
    eot = endoftext_id(tokenizer_dir)
    assert data == {
        "architecture": "LlamaForCausalLM", "dtype": "float32", "logits_dtype": "float32", "vocab_size": 8192,
        "max_position_embeddings": 2048, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_size": 16, "intermediate_size": 128, "hidden_act": "silu",
        "norm_epsilon": 1e-5, "position_embedding_type": "rope_gpt_neox", "rotary_base": 10000.0,
        "rotary_scaling": None, "rotary_pct": 1.0, "attn_bias": False, "mlp_bias": False, "qk_layernorm": False,
        "tie_word_embeddings": False, "share_embedding_table": False, "use_parallel_embedding": False,
        "embedding_sharding_dim": 0, "sliding_window": None, "layer_types": None,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None, "group_size": 128,
                         "has_zero_point": False, "pre_quant_scale": False, "exclude_modules": None},
        "bos_token_id": eot, "eos_token_id": eot,
    }
    # The tokenizer and generation config travel with the artifact (build_engines/side_files.py).
    assert sorted(p.name for p in trt_dir.iterdir()) == sorted(["config.json", rank_file(0), *SIDE_FILES])


def test_tensors_are_the_hf_tensors_reassembled(trt_dir, tiny_hf_dir):
    config = TrtllmCheckpointConfig.from_json(trt_dir)
    trt = load_file(str(trt_dir / rank_file(0)))
    hf = load_file(str(tiny_hf_dir / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in trt.items()} == expected_shapes(config)
    assert all(t.dtype == torch.float32 for t in trt.values())
    assert torch.equal(trt[VOCAB_EMBEDDING], hf["model.embed_tokens.weight"])
    assert torch.equal(trt[LN_F], hf["model.norm.weight"])
    assert torch.equal(trt[LM_HEAD], hf["lm_head.weight"])
    for i in range(config.num_hidden_layers):
        n, p = LayerNames.of(i), f"model.layers.{i}."
        q, k, v = trt[n.qkv].split(qkv_split_sizes(config), dim=0)
        assert torch.equal(q, hf[p + "self_attn.q_proj.weight"])
        assert torch.equal(k, hf[p + "self_attn.k_proj.weight"])
        assert torch.equal(v, hf[p + "self_attn.v_proj.weight"])
        assert torch.equal(trt[n.dense], hf[p + "self_attn.o_proj.weight"])
        assert torch.equal(trt[n.input_layernorm], hf[p + "input_layernorm.weight"])
        assert torch.equal(trt[n.post_layernorm], hf[p + "post_attention_layernorm.weight"])
        assert torch.equal(trt[n.mlp_fc], hf[p + "mlp.gate_proj.weight"])
        assert torch.equal(trt[n.mlp_gate], hf[p + "mlp.up_proj.weight"])
        assert torch.equal(trt[n.mlp_proj], hf[p + "mlp.down_proj.weight"])


@torch.no_grad()
def test_gated_mlp_semantics_match_hf(trt_dir, tiny_hf_dir):
    """TRT-LLM's GatedMLP computes proj(silu(fc(x)) * gate(x)); it must equal HF's MLP."""
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dir).eval()
    trt = load_file(str(trt_dir / rank_file(0)))
    n = LayerNames.of(1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))  # (tokens, hidden)
    ours = (torch.nn.functional.silu(x @ trt[n.mlp_fc].T) * (x @ trt[n.mlp_gate].T)) @ trt[n.mlp_proj].T
    torch.testing.assert_close(ours, model.model.layers[1].mlp(x))


def test_float16_dtype(tmp_path, tiny_hf_dir):
    out = convert_hf_to_trtllm(tiny_hf_dir, tmp_path / "fp16", dtype="float16")
    assert TrtllmCheckpointConfig.from_json(out).dtype == "float16"
    assert {t.dtype for t in load_file(str(out / rank_file(0))).values()} == {torch.float16}


def test_tied_embeddings_write_lm_head(tmp_path, tiny_hf_dir):
    config = LlamaConfig.from_pretrained(tiny_hf_dir)
    config.tie_word_embeddings = True
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    out = convert_hf_to_trtllm(tmp_path / "tied", tmp_path / "trt")
    trt = load_file(str(out / rank_file(0)))
    assert torch.equal(trt[LM_HEAD], trt[VOCAB_EMBEDDING])


def test_existing_out_dir_is_replaced(tmp_path, tiny_hf_dir):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    convert_hf_to_trtllm(tiny_hf_dir, out)
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp dirs left behind


def test_cli_convert(tmp_path, tiny_hf_dir, capsys):
    assert main(["convert", "--hf", str(tiny_hf_dir), "--out", str(tmp_path / "c"), "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c")
    assert TrtllmCheckpointConfig.from_json(tmp_path / "c" / "config.json").dtype == "bfloat16"


def test_config_json_round_trip_ignores_unknown_keys(tmp_path):
    quant = QuantConfig("FP8", "INT8", exclude_modules=("lm_head",))
    config = TrtllmCheckpointConfig(**_config_kwargs(mapping=Mapping(world_size=2, tp_size=2), quantization=quant))
    config.to_json(tmp_path / "config.json")
    assert TrtllmCheckpointConfig.from_json(tmp_path) == config
    # TensorRT-LLM itself writes more keys than we model; a reader must accept them.
    data = json.loads((tmp_path / "config.json").read_text())
    data.update(use_parallel_embedding=False, moe={"num_experts": 0})
    data["mapping"].update(rank=0, cp_size=1, gpus_per_node=8)
    data["quantization"].update(smoothquant_val=0.5, clamp_val=None)
    assert TrtllmCheckpointConfig.from_dict(data) == config


@pytest.mark.parametrize("overrides, message", [
    (dict(num_key_value_heads=3), r"num_key_value_heads \(3\) must divide num_attention_heads \(4\)"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(architecture="GPT2LMHeadModel"), "not supported"),
    (dict(hidden_size=0), "hidden_size must be >= 1"),
    (dict(mapping=Mapping(world_size=3, tp_size=3)), r"tp_size \(3\) must divide num_attention_heads"),
    (dict(mapping=Mapping(world_size=4, pp_size=4)), r"pp_size \(4\) exceeds num_hidden_layers \(2\)"),
    (dict(position_embedding_type="learned_absolute"), "rope_gpt_neox"),
])
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrtllmCheckpointConfig(**_config_kwargs(**overrides))


@pytest.mark.parametrize("build, message", [
    (lambda: Mapping(world_size=2), r"world_size \(2\) must equal tp_size \* pp_size"),
    (lambda: Mapping(tp_size=0), "must be >= 1"),
    (lambda: QuantConfig(quant_algo="INT4"), "quant_algo must be one of"),
    (lambda: QuantConfig(kv_cache_quant_algo="FP4"), "kv_cache_quant_algo must be one of"),
    (lambda: TrtllmCheckpointConfig.from_dict({"vocab_size": 10}), "lacks required keys: head_size, hidden_size"),
])
def test_mapping_and_quant_validation(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_convert_rejects_bad_inputs(tmp_path, tiny_hf_dir):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        convert_hf_to_trtllm(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ValueError, match="dtype must be one of"):
        convert_hf_to_trtllm(tiny_hf_dir, tmp_path / "out", dtype="fp8")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"model_type 'gpt2' .* is not supported \(learned absolute positions"):
        convert_hf_to_trtllm(gpt2, tmp_path / "out")
    config = LlamaConfig.from_pretrained(tiny_hf_dir)
    config.attention_bias = True
    LlamaForCausalLM(config).save_pretrained(tmp_path / "biased")
    with pytest.raises(ValueError, match="attention_bias=True is not supported"):
        convert_hf_to_trtllm(tmp_path / "biased", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("old", ["4.45.2", "4.57.6", "5.3.0", "5.4.0rc1"])
def test_a_transformers_older_than_the_converter_reads_is_named(old):
    """4.x lays its config out otherwise (rope_theta beside rope_scaling, no layer_types before 4.53), 5.0-5.3 write a
    stray field into Phi-3 configs: refused by version, not by the first missing attribute (or a sliding window lost
    without a word)."""
    from build_engines.convert import MIN_TRANSFORMERS, require_transformers

    with pytest.raises(ValueError, match=rf"transformers>={MIN_TRANSFORMERS}.*has transformers {old}"):
        require_transformers(old)
    require_transformers(MIN_TRANSFORMERS)
    require_transformers()  # this environment's
