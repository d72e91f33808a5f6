"""The parallel torch runtime without Triton: LLMEngine on sharded checkpoints of a tiny random model (3 layers,
4 heads, 2 KV heads), with real worker processes over gloo, gives the unsharded engine's greedy tokens under
in-flight batching and chunked prefill; a dead worker fails steps with a clear error; no worker outlives its
engine or its parent process."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason, Request
from build_engines.shard import shard_checkpoint

# Chunked prefill (8 tokens a step) and a late arrival: steps mix prefill chunks and decodes of several sequences.
LIMITS = dict(max_batch_size=4, max_num_tokens=8, max_input_len=96, max_seq_len=160, tokens_per_block=4)


@pytest.fixture(scope="module")
def ckpt3(tmp_path_factory, tokenizer_dir) -> Path:
    from build_engines.convert import convert_hf_to_trtllm
    from build_engines.random_model import make_tiny_random

    root = tmp_path_factory.mktemp("par")
    return convert_hf_to_trtllm(make_tiny_random(root / "hf", tokenizer_dir, seed=5, num_layers=3), root / "ckpt")


def _requests(prompts) -> list[Request]:
    return [Request(f"r{i}", p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, [9, 4, 12]))]


def _run(engine: LLMEngine, prompts) -> dict[str, list[int]]:
    requests = _requests(prompts)
    got: dict[str, list[int]] = {r.request_id: [] for r in requests}
    engine.add_request(requests[0])
    engine.add_request(requests[1])
    for step in range(200):
        if step == 2:
            engine.add_request(requests[2])  # joins while the others are mid-generation
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
        if step >= 2 and not engine.has_work():
            return got
    raise AssertionError("the engine did not finish")


@pytest.fixture(scope="module")
def reference(ckpt3, tokenizer_dir):
    from tests.conftest import random_prompts

    prompts = random_prompts([3, 21, 13], 8192, seed=4)
    return prompts, _run(LLMEngine(ckpt3, EngineConfig(**LIMITS)), prompts)


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2), (4, 1), (2, 2)],
                         ids=["tp2", "pp2-uneven", "tp4-kv-replicated", "tp2xpp2"])
def test_sharded_engine_matches_unsharded(ckpt3, reference, tmp_path, tp, pp):
    prompts, want = reference
    engine = LLMEngine(shard_checkpoint(ckpt3, tmp_path / "s", tp, pp), EngineConfig(**LIMITS))
    workers = engine.runner.workers
    try:
        assert len(workers) == tp * pp - 1
        assert _run(engine, prompts) == want
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    finally:
        engine.close()
    assert all(w.poll() == 0 for w in workers)  # they left their loop and exited cleanly


def test_dead_worker_fails_steps_clearly(ckpt3, reference, tmp_path):
    prompts, _ = reference
    engine = LLMEngine(shard_checkpoint(ckpt3, tmp_path / "s", 2, 1), EngineConfig(**LIMITS))
    try:
        engine.add_request(_requests(prompts)[0])
        engine.step()
        engine.runner.workers[0].kill()
        engine.runner.workers[0].wait()
        start = time.monotonic()
        # The step's requests fail with the reason (engine-level isolation: the engine itself goes on)...
        (out,) = engine.step()
        assert out.finish_reason is FinishReason.ERROR
        assert re.search(r"parallel engine is down .*rank 1 \(pid \d+\) exited -9", out.error), out.error
        engine.add_request(_requests(prompts)[1])
        (out,) = engine.step()  # ...and the next ones too, at once: the parallel engine stays down
        assert "parallel engine is down" in out.error
        assert time.monotonic() - start < 30
    finally:
        engine.close()
    engine.close()  # twice (a model unloaded after a failure): harmless
    assert all(w.poll() is not None for w in engine.runner.workers)


_CHILD = """
import sys, time
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
engine = LLMEngine(sys.argv[1], EngineConfig(max_batch_size=2, max_num_tokens=8, max_input_len=32, max_seq_len=64))
print(" ".join(str(w.pid) for w in engine.runner.workers), flush=True)
time.sleep(600)
"""


def test_workers_exit_when_the_parent_dies(ckpt3, tmp_path):
    sharded = shard_checkpoint(ckpt3, tmp_path / "s", 1, 3)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(sharded)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[3])
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_worker_failing_at_load_fails_start_at_once(ckpt3, tmp_path):
    sharded = shard_checkpoint(ckpt3, tmp_path / "s", 2, 1)
    (sharded / "rank1.safetensors").write_bytes(b"not a safetensors file")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"starting the 2-rank parallel engine failed: a worker exited before it "
                                           r"was loaded.*rank 1 \(pid \d+\) exited 1"):
        LLMEngine(sharded, EngineConfig(**LIMITS))
    assert time.monotonic() - start < 60  # not the 300 s collective timeout
    (sharded / "rank1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing \['rank1.safetensors'\]"):
        LLMEngine(sharded, EngineConfig(**LIMITS))


@pytest.mark.parametrize("quantization", ["int8_wo", "int4_rtn"])
def test_quantized_sharded_engine_matches_quantized_unsharded(ckpt3, reference, tmp_path, quantization):
    """Quantized linears of each rank's share (the issue-4 build pipeline's runtime, backend/model/quantized_linear.py)
    under TP and PP: the greedy tokens of the unsharded quantized engine. Skipped where that runtime is absent."""
    pytest.importorskip("backend.model.quantized_linear")
    apply = pytest.importorskip("build_engines.quantize.apply")
    import dataclasses
    import json

    import torch
    from safetensors.torch import load_file, save_file

    quant = apply.quant_config(quantization, "none", 32)  # 32: the smallest group torch's CPU INT4 kernel takes
    src = tmp_path / quantization
    src.mkdir()
    raw = json.loads((ckpt3 / "config.json").read_text())
    raw["quantization"] = {**dataclasses.asdict(quant), "exclude_modules": list(quant.exclude_modules or [])}
    (src / "config.json").write_text(json.dumps(raw))
    weights = apply.quantize_weights(load_file(str(ckpt3 / "rank0.safetensors")), 3, quant, None, torch.float32)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(src / "rank0.safetensors"))
    prompts, _ = reference
    want = _run(LLMEngine(src, EngineConfig(**LIMITS)), prompts)
    engine = LLMEngine(shard_checkpoint(src, tmp_path / "s", 2, 2), EngineConfig(**LIMITS))
    try:
        assert _run(engine, prompts) == want
    finally:
        engine.close()


def test_worker_dying_mid_step_fails_the_step_not_hangs(ckpt3, reference, tmp_path, monkeypatch):
    """The worker dies after the driver checked it and woke it: the driver is then inside collectives with a dead
    peer, and gloo's closed connection (not the 300 s timeout) must end the step."""
    import backend.model.parallel.driver as driver

    prompts, _ = reference
    engine = LLMEngine(shard_checkpoint(ckpt3, tmp_path / "s", 2, 1), EngineConfig(**LIMITS))
    real_broadcast = driver.broadcast_step

    def kill_then_broadcast(inputs, device):
        engine.runner.workers[0].kill()
        engine.runner.workers[0].wait()
        real_broadcast(inputs, device)

    try:
        engine.add_request(_requests(prompts)[0])
        monkeypatch.setattr(driver, "broadcast_step", kill_then_broadcast)
        start = time.monotonic()
        (out,) = engine.step()  # the step's request fails with the reason; the engine itself goes on
        assert out.finish_reason is FinishReason.ERROR
        assert re.search(r"parallel engine is down \(step failed: .*rank 1 \(pid \d+\) exited", out.error), out.error
        assert time.monotonic() - start < 60
    finally:
        engine.close()
    engine.close()
