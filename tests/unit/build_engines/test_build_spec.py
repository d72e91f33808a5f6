"""Build specs (build_engines/spec.py) and the memory plan (build_engines/plan.py): bad specs are refused with a
message that says what to change; the plan's per-rank numbers match what the sharder writes."""
from __future__ import annotations

import pytest
from safetensors.torch import load_file

from backend.formats.checkpoint import TrtllmCheckpointConfig
from build_engines.cli import main as cli_main
from build_engines.plan import plan_memory
from build_engines.shard import shard_checkpoint
from build_engines.spec import BuildSpec, Limits, MemoryBudget, SpecError

YAML_SPEC = """
name: tiny-fp8
source: hf
dtype: bfloat16
quantization: fp8
kv_cache: fp8
tp_size: 2
limits: {max_batch_size: 4, max_input_len: 96, max_seq_len: 160, max_num_tokens: 256, tokens_per_block: 8}
version: 3
"""

TOML_SPEC = """
name = "tiny"
source = "/abs/hf"
quantization = "int4_awq"
group_size = 64
pp_size = 2
target = "tensorrt_llm"
[memory]
device_memory_gib = 80
"""


def test_yaml_and_toml_specs_load_with_paths_relative_to_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text(YAML_SPEC)
    spec = BuildSpec.load(tmp_path / "a.yaml")
    assert (spec.quant_algo, spec.kv_cache_quant_algo, spec.world_size, spec.version) == ("FP8", "FP8", 2, 3)
    assert spec.source == str(tmp_path / "hf")
    assert spec.limits == Limits(max_batch_size=4, max_input_len=96, max_seq_len=160, max_num_tokens=256,
                                 tokens_per_block=8)
    (tmp_path / "b.toml").write_text(TOML_SPEC)
    spec = BuildSpec.load(tmp_path / "b.toml")
    assert (spec.quant_algo, spec.group_size, spec.pp_size, spec.target) == ("W4A16_AWQ", 64, 2, "tensorrt_llm")
    assert spec.memory == MemoryBudget(device_memory_gib=80)
    assert spec.build_dir == tmp_path / "build" / "tiny"


@pytest.mark.parametrize("change, message", [
    ({"quantization": "int3"}, "quantization 'int3' is not one of ['none', 'fp8', 'int4_awq', 'int8_wo']"),
    ({"kv_cache": "int8"}, "kv_cache 'int8' is not one of ['none', 'fp8']"),
    ({"dtype": "fp16"}, "dtype 'fp16' is not one of"),
    ({"tp_size": 0}, "tp_size must be an integer >= 1"),
    ({"target": "onnx"}, "target 'onnx' is not one of ['torch', 'tensorrt_llm']"),
    ({"version": 0}, "version must be a positive integer"),
    ({"group_size": 7}, "group_size must be a positive even number"),
    ({"limits": {"max_input_len": 2048, "max_seq_len": 2048}}, "limits: max_input_len (2048) must be < max_seq_len"),
    ({"limits": {"max_batch_size": 64, "max_num_tokens": 32}}, "limits: max_num_tokens (32) must be >= max_batch_size"),
    ({"limits": {"max_batch": 4}}, "limits: unknown fields ['max_batch']"),
    ({"memory": {"kv_cache_free_mem_fraction": 1.5}}, "memory.kv_cache_free_mem_fraction must be in (0, 1]"),
    ({"tp": 2}, "unknown fields ['tp']; the fields are"),
    ({"quantization": "fp8", "dtype": "float32", "target": "tensorrt_llm"}, "set dtype: bfloat16"),
])
def test_bad_specs_say_what_to_change(change, message):
    with pytest.raises(SpecError) as err:
        BuildSpec.from_dict({"name": "x", "source": "/abs/hf", **change})
    assert message in str(err.value)


def test_a_bad_spec_file_fails_the_cli_with_its_path_and_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsource: demo\nquantization: int3\n")
    with pytest.raises(SystemExit) as exit_:
        cli_main(["build", str(bad)])
    assert str(exit_.value) == (f"error: {bad}: quantization 'int3' is not one of "
                                "['none', 'fp8', 'int4_awq', 'int8_wo']")
    (tmp_path / "broken.toml").write_text("name = \n")
    with pytest.raises(SystemExit, match="not valid TOML"):
        cli_main(["build", str(tmp_path / "broken.toml")])


def _spec(hf_dir, **fields) -> BuildSpec:
    limits = fields.pop("limits", dict(max_batch_size=4, max_input_len=96, max_seq_len=160, max_num_tokens=256,
                                       tokens_per_block=8))
    return BuildSpec(name="t", source=str(hf_dir), dtype="float32", limits=Limits(**limits), **fields)


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2), (2, 2), (4, 1)])
def test_plan_weights_and_kv_per_rank_match_the_sharded_checkpoint(tiny_hf_dir, tiny_ckpt_dir, tmp_path, tp, pp):
    cfg = TrtllmCheckpointConfig.from_json(tiny_ckpt_dir)
    plan = plan_memory(cfg, _spec(tiny_hf_dir, tp_size=tp, pp_size=pp))
    sharded = shard_checkpoint(tiny_ckpt_dir, tmp_path / "s", tp, pp)
    for r in plan.ranks:
        tensors = load_file(str(sharded / f"rank{r.rank}.safetensors"))
        assert r.weight_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
        # K and V x the stage's layers x this rank's KV heads (one replicated head when tp > 2) x 16 dims x 4 bytes
        assert r.kv_bytes_per_token == 2 * (cfg.num_hidden_layers // pp) * max(2 // tp, 1) * 16 * 4
        assert r.kv.tokens == 4 * 160  # limited by max_batch_size x max_seq_len with 16 GiB


def test_plan_kv_tokens_limited_by_device_memory(tiny_hf_dir, tiny_ckpt_dir):
    cfg = TrtllmCheckpointConfig.from_json(tiny_ckpt_dir)
    limits = dict(max_batch_size=64, max_input_len=1024, max_seq_len=2048, max_num_tokens=2048, tokens_per_block=32)
    device = 64 * 2**20  # 64 MiB a device
    plan = plan_memory(cfg, _spec(tiny_hf_dir, tp_size=2, limits=limits,
                                  memory=MemoryBudget(device_memory_gib=device / 2**30, kv_cache_free_mem_fraction=0.5)))
    for r in plan.ranks:
        assert r.kv.tokens == int((device - r.weight_bytes) * 0.5) // 256 // 32 * 32
        assert "kv_cache_free_mem_fraction 0.5" in r.kv.reason
    assert plan.kv_tokens == min(r.kv.tokens for r in plan.ranks)
    assert "| 0 | 2 |" in plan.describe()


def test_impossible_plans_are_refused_with_what_to_change(tiny_hf_dir, tiny_ckpt_dir):
    cfg = TrtllmCheckpointConfig.from_json(tiny_ckpt_dir)  # 4 heads, 2 KV heads, 2 layers, hidden 64
    with pytest.raises(SpecError, match=r"tp_size: tp_size 3 cannot split 4 attention heads / 2 KV heads evenly; "
                                        r"tp sizes that work: \[1, 2, 4\]"):
        plan_memory(cfg, _spec(tiny_hf_dir, tp_size=3))
    with pytest.raises(SpecError, match="pp_size 3 exceeds the model's 2 layers"):
        plan_memory(cfg, _spec(tiny_hf_dir, pp_size=3))
    with pytest.raises(SpecError, match="int4_awq: hidden_size 64 does not split into groups of 128 .* lower group_size"):
        plan_memory(cfg, _spec(tiny_hf_dir, quantization="int4_awq"))
    with pytest.raises(SpecError, match="more than the device's .* raise tp_size or pp_size, or quantize"):
        plan_memory(cfg, _spec(tiny_hf_dir, memory=MemoryBudget(device_memory_gib=1 / 1024)))
    weights = plan_memory(cfg, _spec(tiny_hf_dir)).ranks[0].weight_bytes
    room_for_100_tokens = (weights + 100 * 512 / 0.9) / 2**30  # 512 B/token: 2 x 2 layers x 2 KV heads x 16 x 4
    with pytest.raises(SpecError, match=r"less than one max_seq_len \(160\) sequence: lower max_seq_len"):
        plan_memory(cfg, _spec(tiny_hf_dir, memory=MemoryBudget(device_memory_gib=room_for_100_tokens)))


def test_quantized_plans_count_quantized_storage(tiny_hf_dir, tiny_ckpt_dir):
    cfg = TrtllmCheckpointConfig.from_json(tiny_ckpt_dir)
    full = plan_memory(cfg, _spec(tiny_hf_dir)).ranks[0]
    fp8 = plan_memory(cfg, _spec(tiny_hf_dir, quantization="fp8", kv_cache="fp8")).ranks[0]
    assert fp8.kv_bytes_per_token == full.kv_bytes_per_token // 4  # float32 -> one byte
    linear_params = 2 * (64 * (4 + 2 * 2) * 16 + 64 * 64 + 3 * 64 * 128)  # qkv, dense, fc, gate, proj x 2 layers
    assert full.weight_bytes - fp8.weight_bytes == linear_params * 3 - 2 * 5 * 4  # 4 -> 1 byte, + (1,) fp32 scales


def test_the_example_specs_are_valid():
    from pathlib import Path

    specs = sorted((Path(__file__).resolve().parents[3] / "build_engines" / "specs").glob("demo_*"))
    loaded = {BuildSpec.load(p).name: BuildSpec.load(p) for p in specs}
    assert {"demo-bf16", "demo-fp8", "demo-int4_awq", "demo-tp2", "demo-pp2", "demo-fp8-trtllm"} <= set(loaded)
    assert loaded["demo-tp2"].tp_size == 2 and loaded["demo-pp2"].pp_size == 2
    assert loaded["demo-fp8-trtllm"].target == "tensorrt_llm"
