"""CUDA graphs of decode steps (backend/model/cuda_graphs.py), checked on CPU: everything but the capture itself.

DecodeGraphs(capture=False) pads each decode step to its bucket and runs the same forward over the same static
buffers a captured graph would read, so the padding, the scratch slot, the buffers' refresh from step to step and
the logits' selection are all exercised here; the capture on a GPU is measured in perf/CUDA.md.
"""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model import cuda_graphs
from backend.model.cuda_graphs import DecodeGraphs, batch_bucket, context_bucket, pad_decode_step
from backend.model.runner import KVCache
from backend.model.step_inputs import StepInputs, step_tensors
from tests.conftest import TEST_ENGINE_LIMITS, hf_generate, random_prompts
from tests.unit.engine.test_families import CASES, _limits

# The CUDA path's kernels: torch linears, gather + SDPA attention, the Python layers.
EAGER_CUDA_LIKE = dict(linear_kernel="torch", attention_kernel="torch", decode_layers="python")


def emulate_graphs(engine: LLMEngine) -> DecodeGraphs:
    """Give a CPU engine's runner what a CUDA one gets with graphs on: pools with a scratch row, DecodeGraphs."""
    runner = engine.runner
    pool = runner.kv.layers[0][0]
    runner.kv = KVCache(runner.model, engine.blocks.num_blocks, engine.blocks.block_size, runner.device,
                        pool.dtype, scratch_rows=1)
    runner.graphs = DecodeGraphs(runner._step_tensors, runner._forward, runner.kv.scratch_slot, capture=False)
    return runner.graphs


def test_buckets():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 64]
    assert [context_bucket(w) for w in (1, 64, 65, 81, 128, 129, 257, 1025, 2048)] == [
        64, 64, 80, 96, 128, 160, 320, 1280, 2048]


def _step() -> StepInputs:
    """Three decoding sequences, contexts 5, 9 (from position 2: a window dropped two keys) and 1."""
    slots = torch.tensor([[10, 11, 12, 13, 14, 0, 0], [20, 21, 22, 23, 24, 25, 26], [30, 0, 0, 0, 0, 0, 0]])
    return StepInputs(tokens=torch.tensor([5, 6, 7]), start=torch.tensor([4, 8, 0]), end=torch.tensor([5, 9, 1]),
                      sampled=torch.tensor([1, 0, 1]), context_slots=slots, ctx_start=torch.tensor([0, 2, 0]),
                      prompt_len=torch.tensor([3, 6, 1]), total_len=torch.tensor([5, 9, 1]))


class _Rotary:
    def cos_signed_sin(self, positions, prompt_len, total_len):
        angle = positions.float()[:, None] * torch.ones(1, 8)
        return angle.cos(), angle.sin()


def test_padding_keeps_each_real_rows_metadata_and_sends_the_padding_to_the_scratch_slot():
    step, windows = _step(), {None, 4}
    padded = pad_decode_step(step, 4, 64, scratch_slot=99)
    _, meta, _ = step_tensors(step, _Rotary(), windows, torch.float32, torch.device("cpu"))
    _, pmeta, _ = step_tensors(padded, _Rotary(), windows, torch.float32, torch.device("cpu"))
    assert pmeta.decode_only and pmeta.parts is None and pmeta.context_slots.shape == (4, 64)
    assert torch.equal(pmeta.slot_mapping, torch.tensor([14, 26, 30, 99]))
    assert torch.equal(pmeta.slot_mapping[:3], meta.slot_mapping)
    assert torch.equal(pmeta.cos[:3], meta.cos) and torch.equal(pmeta.sin_signed[:3], meta.sin_signed)
    for w in windows:
        assert torch.equal(pmeta.masks[w][:3, ..., :7], meta.masks[w])
        assert not pmeta.masks[w][:3, ..., 7:].any()  # padded columns: hidden
        assert pmeta.masks[w][3, 0, 0].tolist() == [True] + [False] * 63  # the padding sees its scratch slot only
    with pytest.raises(ValueError, match="does not fit the bucket 2 x 64"):
        pad_decode_step(step, 2, 64, scratch_slot=99)


@pytest.mark.parametrize("max_batch_size", [3, 4])
def test_greedy_through_the_graphs_equals_hf(make_engine, hf_greedy, max_batch_size):
    """Three and four sequences (a padded bucket and a full one), contexts crossing the 64- and 80-column buckets,
    prompts arriving while others decode (prefill steps stay eager), a second pass from the prefix cache: HF's tokens."""
    engine = make_engine(**EAGER_CUDA_LIKE, max_batch_size=max_batch_size, max_num_tokens=64)
    graphs = emulate_graphs(engine)
    prompts = random_prompts([9, 30, 50, 17], 512, seed=3)
    for tag in ("a", "b"):
        got = engine.generate([Request(f"{tag}{i}", p, SamplingParams(max_tokens=40)) for i, p in enumerate(prompts)])
        assert [got[f"{tag}{i}"] for i in range(len(prompts))] == [hf_greedy(p, 40) for p in prompts]
    assert {64, 80, 96} <= {width for _, width in graphs.graphs}  # contexts of up to 90 columns
    assert engine.blocks.prefix_hits > 0
    if max_batch_size == 3:  # three decoding sequences ran padded to four
        assert (4, 64) in graphs.graphs and (3, 64) not in graphs.graphs


@pytest.mark.parametrize("name", ["gemma2", "qwen2_swa", "llama_dynamic", "phi3_128k"])
def test_families_through_the_graphs_equal_hf(family_checkpoint, name):
    """Sliding windows and soft caps (gemma2), a window on some layers (qwen2_swa), stateful ropes (dynamic NTK,
    longrope across its threshold): the padded steps give HF's tokens."""
    lengths, n = CASES[name]
    prompts = random_prompts(lengths, 8192, seed=len(name))
    hf_dir, ckpt = family_checkpoint(name)
    engine = LLMEngine(ckpt, _limits(name, **EAGER_CUDA_LIKE))
    emulate_graphs(engine)
    got = engine.generate([Request(f"r{i}", p, SamplingParams(max_tokens=n)) for i, p in enumerate(prompts)])
    assert [got[f"r{i}"] for i in range(len(prompts))] == [hf_generate(hf_dir, p, n) for p in prompts]


def test_cuda_graph_mode_is_checked():
    with pytest.raises(ValueError, match="cuda_graph_mode 'on' runs on CUDA only, not on device 'cpu'"):
        EngineConfig(**TEST_ENGINE_LIMITS, device="cpu", cuda_graph_mode="on")
    with pytest.raises(ValueError, match="cuda_graph_mode must be one of"):
        EngineConfig(**TEST_ENGINE_LIMITS, device="cpu", cuda_graph_mode="always")
    assert EngineConfig(**TEST_ENGINE_LIMITS, device="cpu").cuda_graph_mode == "auto"


def test_auto_runs_eagerly_on_cpu(make_engine):
    engine = make_engine()
    assert engine.runner.graphs is None
    assert engine.runner.kv.layers[0][0].shape[0] == engine.blocks.num_blocks * engine.blocks.block_size


def _refuse_capture(*args, **kwargs):
    raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_under_auto_runs_eagerly_and_under_on_fails_the_step(make_engine, hf_greedy, run_engine,
                                                                             monkeypatch, caplog):
    monkeypatch.setattr(cuda_graphs, "_Graph", _refuse_capture)
    prompt = random_prompts([12], 512, seed=5)[0]
    engine = make_engine(**EAGER_CUDA_LIKE)
    emulate_graphs(engine)
    engine.runner.cuda_graph_mode = "auto"
    assert engine.generate([Request("a", prompt, SamplingParams(max_tokens=8))])["a"] == hf_greedy(prompt, 8)
    assert engine.runner.graphs is None
    assert "CUDA graphs off for this engine" in caplog.text and "1 sequences x 64 context columns" in caplog.text
    engine = make_engine(**EAGER_CUDA_LIKE)
    emulate_graphs(engine)
    engine.runner.cuda_graph_mode = "on"
    last = run_engine(engine, [Request("b", prompt, SamplingParams(max_tokens=8))])["b"][-1]
    assert last.finished and "capturing the decode step of 1 sequences x 64 context columns failed" in last.error
