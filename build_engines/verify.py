"""Verification of a build: held-out perplexity and top-1 agreement against the unquantized model, and a
polygraphy comparison of one decoder layer exported to ONNX with the torch runtime's layer.

Perplexity and agreement come from build_engines/quantize/evaluate.py (the torch runtime, quantized linears and
FP8 KV cache included) on the single-rank checkpoint that is then sharded; a sharded artifact is also served by
the engine (one process per rank) and its greedy tokens compared with the single-rank checkpoint's.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.decoder import DecoderLayer
from backend.model.rotary import RotaryEmbedding
from backend.model.step_inputs import StepInputs, step_tensors


@dataclass(frozen=True)
class LayerCheck:
    """Polygraphy's comparison of layer 0 (ONNX, onnxruntime) with the torch runtime's layer 0."""

    passed: bool
    max_abs_diff: float
    atol: float
    rtol: float
    onnx_path: str
    command: str  # the same check from the command line; --trt instead of --onnxrt runs it on TensorRT


@dataclass(frozen=True)
class ShardCheck:
    """Greedy tokens of the sharded artifact's engine (one process per rank) vs the single-rank checkpoint's."""

    prompts: int
    tokens: int  # greedy tokens compared
    equal: int  # of them, equal at the same position (a sequence's tokens after its first difference count too)

    @property
    def agreement(self) -> float:
        return self.equal / self.tokens


def check_sharded(artifact: Path, single_rank: Path, prompts: list[list[int]], new_tokens: int) -> ShardCheck:
    """Serve both checkpoints with the torch engine and compare their greedy continuations of `prompts`."""
    longest, block = max(map(len, prompts)) + new_tokens, 16
    config = EngineConfig(max_batch_size=len(prompts), max_input_len=longest - new_tokens, max_seq_len=longest,
                          tokens_per_block=block, max_tokens_in_paged_kv_cache=len(prompts) * -(-longest // block) * block,
                          device="cpu")
    outputs = []
    for ckpt in (single_rank, artifact):
        engine = LLMEngine(ckpt, config)
        try:
            outputs.append(engine.generate([Request(f"shard-check-{i}", tuple(p), SamplingParams(max_tokens=new_tokens))
                                            for i, p in enumerate(prompts)]))
        finally:
            engine.close()
    ref, got = outputs
    equal = sum(a == b for key in ref for a, b in zip(ref[key], got[key]))
    return ShardCheck(len(prompts), sum(len(v) for v in ref.values()), equal)


# --- one decoder layer through ONNX and polygraphy ---------------------------------------------------------------

class _PrefillLayer(torch.nn.Module):
    """Decoder layer 0 on one sequence's prefill of T tokens with an empty cache: x (T, hidden) -> (T, hidden).

    The attention metadata of that case (slots 0..T-1, a causal (windowed) mask, rotary cos/sin of positions
    0..T-1 for a T-token prompt) is fixed for a given T, so it is baked into the graph as constants; the cache is a
    fresh zero tensor inside it."""

    def __init__(self, layer: DecoderLayer, rotary: RotaryEmbedding, tokens: int) -> None:
        super().__init__()
        self.layer = layer
        att = layer.attention
        self.kv_shape = (tokens, att.n_kv, att.head_dim)
        # the engine's own builder, for one sequence of `tokens` new tokens in slots 0..T-1 (its ids are unused)
        idx = torch.arange(tokens)
        one = torch.ones(1, dtype=torch.long)
        inputs = StepInputs.of(idx, 0 * one, tokens * one, one, idx[None])
        _, self.meta, _ = step_tensors(inputs, rotary, {att.window}, torch.float32, torch.device("cpu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k_cache = torch.zeros(self.kv_shape, dtype=x.dtype)
        v_cache = torch.zeros(self.kv_shape, dtype=x.dtype)
        return self.layer(x, k_cache, v_cache, self.meta)


def float_layer(layer: DecoderLayer) -> DecoderLayer:
    """A float32 copy of a loaded decoder layer, each quantized linear replaced by a plain nn.Linear holding the
    weight it computes with (dequantized; AWQ's prequant scale folded in). ONNX has no CPU INT4 group-wise or
    FP8 GEMM here; the graph is the layer's float computation, where TensorRT inserts its own quantization."""
    from backend.model.quantized_linear import Fp8Linear, QuantizedLinear, linears_of

    layer = copy.deepcopy(layer)
    for name in linears_of(layer):
        parent_name, _, child = name.rpartition(".")
        parent = layer.get_submodule(parent_name)
        module = getattr(parent, child)
        if isinstance(module, QuantizedLinear):
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            with torch.inference_mode():
                if isinstance(module, Fp8Linear):  # its forward also rounds the input to FP8 (not a weight)
                    weight = module.weight.float() * module.weights_scaling_factor.float()
                else:  # the runtime's own kernel applied to the identity: column j is W[:, j] (prequant folded)
                    weight = module.matmul(torch.eye(module.in_features, dtype=module.dtype)).float().t()
                if module.bias is not None:
                    linear.bias = torch.nn.Parameter(module.bias.float().clone())
            linear.weight = torch.nn.Parameter(weight.clone())
            setattr(parent, child, linear)
    layer.mlp.fc_gate = None  # the fused copy (made at load) is in the load dtype; use the linears themselves
    return layer.float().eval()


def check_layer_onnx(ckpt_dir: Path, out_dir: Path, tokens: int = 16, atol: float = 1e-3,
                     rtol: float = 1e-3) -> LayerCheck:
    """Export layer 0 of the single-rank checkpoint in ckpt_dir, as the torch runtime loads it (float32, see
    float_layer), to out_dir/layer0.onnx; save the torch outputs as polygraphy JSON and compare onnxruntime."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, IterationResult, RunResults, SimpleCompareFunc
    from polygraphy.json import save_json
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.WARNING  # its per-run INFO lines would go to stdout, which carries results

    from backend.model.loader import load_model

    out_dir.mkdir(parents=True, exist_ok=True)
    model = load_model(ckpt_dir, torch.device("cpu"))
    graph = _PrefillLayer(float_layer(model.transformer.layers[0]), model.rotary, tokens).eval()
    x = torch.randn(tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = graph(x)
    onnx_path = out_dir / "layer0.onnx"
    torch.onnx.export(graph, (x,), str(onnx_path), input_names=["hidden_states"], output_names=["output"],
                      dynamo=True, opset_version=18, verbose=False)
    feed = {"hidden_states": x.numpy()}
    torch_results = RunResults([("torch", [IterationResult({"output": expected.numpy()}, runner_name="torch")])])
    save_json([feed], str(out_dir / "layer0_inputs.json"))
    torch_results.save(str(out_dir / "layer0_torch_outputs.json"))
    ort = Comparator.run([OnnxrtRunner(SessionFromOnnx(str(onnx_path)))], data_loader=[feed])
    ort.extend(torch_results)
    accuracy = Comparator.compare_accuracy(ort, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol))
    got = next(iter(ort.values()))[0]["output"]
    command = (f"polygraphy run {onnx_path} --onnxrt --load-inputs {out_dir / 'layer0_inputs.json'} "
               f"--load-outputs {out_dir / 'layer0_torch_outputs.json'} --atol {atol} --rtol {rtol}")
    return LayerCheck(passed=bool(accuracy), max_abs_diff=float(np.abs(got - expected.numpy()).max()), atol=atol,
                      rtol=rtol, onnx_path=str(onnx_path), command=command)
