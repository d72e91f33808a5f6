"""The tensorrt_llm target without TensorRT-LLM: trtllm-build's command line from a spec, the message where it
cannot run, what it refuses per family, and the mapping of our config, requests and sliding windows onto
tensorrt_llm.bindings.executor's arguments."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from backend.engine.config import EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.engine.trtllm_executor import (
    TrtllmExecutorEngine,
    attention_windows,
    executor_settings,
    is_engine_dir,
    request_settings,
)
from backend.formats.checkpoint import TrtllmCheckpointConfig
from build_engines.spec import BuildSpec, Limits, SpecError
from build_engines.trtllm_target import TrtllmUnavailable, check_available, check_buildable, trtllm_build_argv

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


def _flags(argv: list[str]) -> dict[str, str]:
    assert argv[0] == "trtllm-build"
    pairs = argv[1:]
    assert all(a.startswith("--") for a in pairs[::2]) and len(pairs) % 2 == 0
    return dict(zip(pairs[::2], pairs[1::2]))


def test_trtllm_build_flags_come_from_the_spec_limits():
    spec = BuildSpec(name="x", source="/abs", quantization="fp8", kv_cache="fp8", tp_size=2, pp_size=2,
                     target="tensorrt_llm", limits=Limits(max_batch_size=8, max_input_len=512, max_seq_len=1024,
                                                          max_num_tokens=4096, tokens_per_block=64))
    flags = _flags(trtllm_build_argv(spec, Path("/b/checkpoint"), Path("/b/engine")))
    assert flags == {
        "--checkpoint_dir": "/b/checkpoint", "--output_dir": "/b/engine", "--max_batch_size": "8",
        "--max_input_len": "512", "--max_seq_len": "1024", "--max_num_tokens": "4096", "--max_beam_width": "1",
        "--kv_cache_type": "paged", "--tokens_per_block": "64", "--gpt_attention_plugin": "auto",
        "--gemm_plugin": "auto", "--context_fmha": "enable", "--use_paged_context_fmha": "enable",
        "--remove_input_padding": "enable", "--workers": "4", "--use_fp8_context_fmha": "enable"}
    plain = _flags(trtllm_build_argv(BuildSpec(name="x", source="/abs"), Path("/c"), Path("/e")))
    assert "--use_fp8_context_fmha" not in plain and plain["--workers"] == "1"


@pytest.mark.skipif(HAS_TRTLLM, reason="tensorrt_llm is importable here")
def test_without_tensorrt_llm_the_target_says_where_it_runs():
    with pytest.raises(TrtllmUnavailable) as err:
        check_available()
    message = str(err.value)
    assert "tensorrt_llm package (1.2.x), which is not importable here" in message
    assert "Dockerfile's gpu image" in message and "target: torch" in message
    with pytest.raises(RuntimeError, match="needs tensorrt_llm 1.2.x and a GPU"):
        TrtllmExecutorEngine(Path("/nonexistent"), EngineConfig(device="cpu"))


def test_engine_dirs_are_told_from_checkpoints(tmp_path, tiny_ckpt_dir):
    assert not is_engine_dir(tiny_ckpt_dir)
    (tmp_path / "rank0.engine").write_bytes(b"")
    assert is_engine_dir(tmp_path)


def test_executor_settings_map_the_engine_config():
    cfg = EngineConfig(max_batch_size=8, max_num_tokens=512, max_input_len=256, max_seq_len=512,
                       max_tokens_in_paged_kv_cache=4096, kv_cache_free_mem_fraction=0.8, policy="max_utilization",
                       enable_kv_cache_reuse=True, device="cpu")
    assert executor_settings(cfg) == {
        "max_beam_width": 1, "max_batch_size": 8, "max_num_tokens": 512, "enable_chunked_context": True,
        "scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"},
        "kv_cache_config": {"enable_block_reuse": True, "max_tokens": 4096, "free_gpu_memory_fraction": 0.8}}


def test_request_settings_map_sampling_and_words():
    greedy = request_settings(Request("a", (5, 6, 7), SamplingParams(max_tokens=4, end_id=0, stop_words=((3, 4),))))
    assert greedy == {"input_token_ids": [5, 6, 7], "max_tokens": 4, "streaming": True, "end_id": 0,
                      "stop_words": [[3, 4]], "bad_words": None, "sampling_config": {"beam_width": 1, "top_k": 1},
                      "output_config": {"return_log_probs": False, "exclude_input_from_output": True}}
    sampled = request_settings(Request("b", (1,), SamplingParams(max_tokens=2, temperature=0.7, top_p=0.9, seed=3,
                                                                  repetition_penalty=1.2, min_tokens=1,
                                                                  return_log_probs=True, bad_words=((9,),))))
    assert sampled["sampling_config"] == {"beam_width": 1, "seed": 3, "min_tokens": 1, "repetition_penalty": 1.2,
                                          "top_p": 0.9, "temperature": 0.7}
    assert sampled["bad_words"] == [[9]] and sampled["output_config"]["return_log_probs"] is True


def test_sliding_layers_become_the_executors_attention_windows():
    gemma = {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert attention_windows(gemma, 512) == [16, 512, 16, 512]
    assert attention_windows({"sliding_window": 4096, "layer_types": ["sliding_attention"] * 2}, 1024) == [1024, 1024]
    assert attention_windows({"sliding_window": None, "layer_types": None}, 512) is None
    cfg = EngineConfig(max_batch_size=8, max_num_tokens=512, max_input_len=256, max_seq_len=512, device="cpu")
    assert executor_settings(cfg, [16, 512])["kv_cache_config"]["max_attention_window"] == [16, 512]
    assert "max_attention_window" not in executor_settings(cfg)["kv_cache_config"]


@pytest.mark.parametrize("name, spec_fields, message", [
    ("llama_dynamic", {}, "rotary_scaling type 'dynamic' .* is not buildable by TensorRT-LLM 1.2"),
    ("phi3_128k", {"tp_size": 2}, "no tensor parallelism for Phi-3"),
    ("gemma2", {"limits": Limits(max_input_len=4096, max_seq_len=8192, max_num_tokens=8192)},
     "Gemma 2 sequences up to 4096"),
])
def test_what_tensorrt_llm_cannot_build_is_refused(family_checkpoint, name, spec_fields, message):
    hf_dir, ckpt = family_checkpoint(name)
    spec = BuildSpec(name="t", source=str(hf_dir), dtype="bfloat16", target="tensorrt_llm", **spec_fields)
    with pytest.raises(SpecError, match=message):
        check_buildable(TrtllmCheckpointConfig.from_json(ckpt), spec)
    check_buildable(TrtllmCheckpointConfig.from_json(family_checkpoint("qwen3")[1]),
                    BuildSpec(name="t", source=str(hf_dir), dtype="bfloat16", target="tensorrt_llm", tp_size=2))
