"""Verification of a build: held-out perplexity and top-1 agreement against the unquantized model, and a
polygraphy comparison of one decoder layer exported to ONNX with the torch runtime's layer.

Perplexity and agreement are measured on the artifact as served: every window of held-out text is fed to the
engine (LLMEngine: in-process, or one process per rank when sharded) one token a step, teacher-forced, and the
next-token logits of each position are read from the engine's model runner. So a sharded or quantized build is
measured through the same runtime that will serve it.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from backend.config import EngineConfig
from backend.engine import LLMEngine
from backend.model import AttentionMetadata, DecoderLayer
from backend.model_runner import ScheduledSeq
from backend.sampling_params import SamplingParams
from backend.sequence import Request, Sequence


@dataclass(frozen=True)
class TokenScores:
    """Per position of each window: the negative log-likelihood of the true next token, and the argmax."""

    nll: torch.Tensor  # (windows, window_len - 1) float32
    top1: torch.Tensor  # (windows, window_len - 1) int64

    @property
    def perplexity(self) -> float:
        return math.exp(float(self.nll.mean()))

    def agreement(self, reference: TokenScores) -> float:
        """Share of positions where this model's top-1 next token is the reference's."""
        return float((self.top1 == reference.top1).float().mean())


@dataclass(frozen=True)
class LayerCheck:
    """Polygraphy's comparison of layer 0 (ONNX, onnxruntime) with the torch runtime's layer 0."""

    passed: bool
    max_abs_diff: float
    atol: float
    rtol: float
    onnx_path: str
    command: str  # the same check from the command line; --trt instead of --onnxrt runs it on TensorRT
    note: str = ""


def heldout_windows(tokenizer_dir: Path, n: int, length: int) -> list[list[int]]:
    """n windows of `length` token ids, cut evenly from held-out standard-library source the model never saw.

    The held-out files are split in two: calibration takes part 0 (quantize/calibration.py), scoring part 1."""
    from transformers import AutoTokenizer

    from build_engines import corpus

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = (corpus.heldout_part_text(n * length * 8, part=1) if hasattr(corpus, "heldout_part_text")
            else corpus.heldout_text(n * length * 8))  # TEMP until issue4-quant's corpus split is merged
    ids = tok.encode(text, add_special_tokens=False)
    if len(ids) < n * length:
        raise ValueError(f"held-out text gives {len(ids)} tokens, fewer than {n} windows x {length}: lower them")
    stride = len(ids) // n
    return [ids[i * stride : i * stride + length] for i in range(n)]


def score_engine(engine_dir: Path, windows: list[list[int]], progress: str = "score") -> TokenScores:
    """Teacher-forced next-token scores of every window position, through the engine that serves engine_dir."""
    n, length = len(windows), len(windows[0])
    if any(len(w) != length for w in windows):
        raise ValueError("all windows must have the same length")
    block = 16
    engine = LLMEngine(engine_dir, EngineConfig(
        max_batch_size=n, max_num_tokens=max(n, 64), max_input_len=length, max_seq_len=length + 1,
        tokens_per_block=block, max_tokens_in_paged_kv_cache=n * -(-(length + 1) // block) * block, device="cpu"))
    seqs = [Sequence.from_request(Request(f"verify-{i}", (w[0],), SamplingParams(max_tokens=length)))
            for i, w in enumerate(windows)]
    nll = torch.zeros(n, length - 1)
    top1 = torch.zeros(n, length - 1, dtype=torch.long)
    try:
        for seq in seqs:
            engine.blocks.ensure_slots(seq, length)
        for pos in tqdm(range(length - 1), desc=progress, unit="pos", leave=False):
            logits = engine.runner.run([ScheduledSeq(seq, 1) for seq in seqs]).float()  # (n, vocab)
            target = torch.tensor([w[pos + 1] for w in windows])
            nll[:, pos] = -F.log_softmax(logits, dim=-1).gather(1, target[:, None])[:, 0]
            top1[:, pos] = logits.argmax(dim=-1)
            for seq, w in zip(seqs, windows):  # the true next token becomes the next step's input
                seq.num_computed_tokens += 1
                seq.token_ids.append(w[pos + 1])
    finally:
        for seq in seqs:
            engine.blocks.free(seq)
        engine.close()
    return TokenScores(nll, top1)


# --- one decoder layer through ONNX and polygraphy ---------------------------------------------------------------

class _PrefillLayer(torch.nn.Module):
    """Decoder layer 0 on one sequence's prefill of T tokens with an empty cache: x (T, hidden) -> (T, hidden).

    The attention metadata of that case (slots 0..T-1, a causal mask, rotary tables of positions 0..T-1) is fixed
    for a given T, so it is baked into the graph as constants; the cache is a fresh zero tensor inside it."""

    def __init__(self, layer: DecoderLayer, cos: torch.Tensor, sin: torch.Tensor, tokens: int) -> None:
        super().__init__()
        self.layer = layer
        att = layer.attention
        self.kv_shape = (tokens, att.n_kv, att.head_dim)
        idx = torch.arange(tokens)
        self.meta = AttentionMetadata(
            slot_mapping=idx, query_index=idx[None], query_flat=idx, context_slots=idx[None],
            mask=torch.ones(tokens, tokens, dtype=torch.bool).tril()[None, None], cos=cos[:tokens], sin=sin[:tokens])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k_cache = torch.zeros(self.kv_shape, dtype=x.dtype)
        v_cache = torch.zeros(self.kv_shape, dtype=x.dtype)
        return self.layer(x, k_cache, v_cache, self.meta)


def check_layer_onnx(ckpt_dir: Path, out_dir: Path, tokens: int = 16, atol: float = 1e-3,
                     rtol: float = 1e-3) -> LayerCheck:
    """Export layer 0 of the single-rank checkpoint in ckpt_dir (as the torch runtime loads it, in float32) to
    out_dir/layer0.onnx, save the torch outputs as polygraphy JSON, and compare onnxruntime against them."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, IterationResult, RunResults, SimpleCompareFunc
    from polygraphy.json import save_json
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.WARNING  # its per-run INFO lines would go to stdout, which carries results

    from backend.checkpoint import load_model

    out_dir.mkdir(parents=True, exist_ok=True)
    model = load_model(ckpt_dir, torch.device("cpu")).float()
    graph = _PrefillLayer(model.transformer.layers[0], model.rope_cos, model.rope_sin, tokens).eval()
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


def layer_check_json(check: LayerCheck) -> str:
    return json.dumps(asdict(check), indent=2)
