"""The build pipeline end to end on the tiny random model: a tp2 build is verified, reported, and installed as
version 2 next to version 1, and the engine serves it; the tensorrt_llm target stops where it cannot run."""
from __future__ import annotations

import importlib.util
import json

import pytest

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.formats.versions import ARTIFACT_FILE, artifact_for, list_versions
from build_engines.build import BuildStopped, build
from build_engines.spec import BuildSpec, Limits, SpecError, VerifySpec
from ensembles.render import RepoSpec, render
from tests.conftest import TEST_ENGINE_LIMITS, random_prompts

LIMITS = Limits(max_batch_size=4, max_input_len=96, max_seq_len=160, max_num_tokens=256, tokens_per_block=8)


def _spec(tiny_hf_dir, tmp_path, **fields) -> BuildSpec:
    verify = fields.pop("verify", VerifySpec(eval_tokens=48, seq_len=12, shard_check_prompts=2, shard_check_tokens=6,
                                             throughput_batches=(1,), prompt_len=8, new_tokens=4))
    fields.setdefault("name", "tiny")
    return BuildSpec(source=str(tiny_hf_dir), dtype="float32", limits=LIMITS, output_dir=tmp_path / "build",
                     verify=verify, **fields)


def test_tp2_build_is_verified_reported_and_installed_as_version_2(tiny_hf_dir, tiny_ckpt_dir, tmp_path, hf_greedy,
                                                                   monkeypatch):
    repo = render(RepoSpec(engine_dir=tiny_ckpt_dir, tokenizer_dir=tiny_hf_dir), tmp_path / "repo")
    assert list_versions(repo) == [1]
    report = build(_spec(tiny_hf_dir, tmp_path, tp_size=2), model_repository=repo, say=lambda _: None)

    out = tmp_path / "build" / "tiny"
    saved = json.loads((out / "report.json").read_text())
    assert saved["status"] == "ok" and saved["installed_version"] == 2
    v = saved["verification"]
    # An unquantized float32 build scores as the float32 reference does; its tp2 shards serve the same tokens.
    assert v["quality"]["tokens"] == 4 * 11 and v["quality"]["top1_agreement"] == 1.0
    assert v["quality"]["perplexity"] == pytest.approx(v["quality"]["reference_perplexity"], rel=1e-5)
    assert v["shard_check"] == {"prompts": 2, "tokens": 12, "equal": 12}
    assert v["layer_check"]["passed"] and v["layer_check"]["max_abs_diff"] < 1e-3
    assert "--onnxrt" in v["layer_check"]["command"] and (out / "verify" / "layer0.onnx").is_file()
    assert v["throughput"][0]["batch"] == 1 and v["throughput"][0]["tokens_per_s"] > 0
    assert saved["sizes"]["artifact_bytes"] == sum(r["weight_bytes"] for r in saved["memory_plan"]["ranks"]) + sum(
        (out / "checkpoint" / f"rank{r}.safetensors").stat().st_size - _tensor_bytes(out / "checkpoint", r)
        for r in range(2))  # the plan's weights + each file's header
    md = (out / "report.md").read_text()
    assert "top-1 agreement with the reference: 1.0000" in md and "tokens/s at batch 1" in md

    assert list_versions(repo) == [1, 2]
    assert not (repo / "tensorrt_llm" / "1" / ARTIFACT_FILE).exists()  # version 1 untouched
    artifact = artifact_for(repo / "tensorrt_llm", 2)
    assert artifact.engine_dir == (out / "checkpoint").resolve()
    assert artifact.meta == report.summary() and artifact.meta["tp_size"] == 2
    assert (repo / "tensorrt_llm" / "2" / "model.py").read_text() == (repo / "tensorrt_llm" / "1" / "model.py").read_text()

    # The version's artifact loads and serves; named relative to the working directory on purpose (the parallel
    # engine's workers run elsewhere and must get the path resolved).
    monkeypatch.chdir(tmp_path)
    engine = LLMEngine(artifact.engine_dir.relative_to(tmp_path.resolve()), EngineConfig(**TEST_ENGINE_LIMITS))
    try:
        prompt = random_prompts([10], engine.vocab_size, seed=5)[0]
        out_ids = engine.generate([Request("r", prompt, SamplingParams(max_tokens=6))])["r"]
    finally:
        engine.close()
    assert out_ids == hf_greedy(prompt, 6)

    with pytest.raises(SpecError, match="version 2 of tensorrt_llm already exists in .*: choose another version"):
        build(_spec(tiny_hf_dir, tmp_path, name="again", version=2), model_repository=repo)  # refused up front
    assert not (tmp_path / "build" / "again").exists()


def _tensor_bytes(ckpt, rank: int) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() * t.element_size() for t in load_file(str(ckpt / f"rank{rank}.safetensors")).values())


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is importable here")
def test_tensorrt_llm_target_stops_before_trtllm_build_and_says_why(tiny_hf_dir, tmp_path):
    said = []
    spec = _spec(tiny_hf_dir, tmp_path, target="tensorrt_llm",
                 verify=VerifySpec(eval_tokens=8, seq_len=4, throughput_batches=(), onnx_layer=False))
    with pytest.raises(BuildStopped, match="stopped before trtllm-build: the tensorrt_llm target needs the "
                                           "tensorrt_llm package .* not importable here"):
        build(spec, say=said.append)
    assert any(line.startswith("note: the build will stop before trtllm-build") for line in said)  # said up front
    saved = json.loads((tmp_path / "build" / "tiny" / "report.json").read_text())
    assert saved["status"].startswith("stopped before trtllm-build") and saved["verification"] is not None
    assert "trtllm-build" not in saved["stages"]
    assert saved["trtllm_build_argv"][:3] == ["trtllm-build", "--checkpoint_dir", str(tmp_path / "build" / "tiny" /
                                                                                     "checkpoint")]
