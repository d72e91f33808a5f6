"""Calibration: run local text through the float model (the engine's own, backend/model/scoring.py) and record what the
quantizers need: per linear input, the mean |x| of each channel (AWQ's salience), the largest |x| (FP8's
activation scale) and a subsample of input rows (AWQ's output-error search); per layer, the largest |K| and |V|
the KV cache stores (K after RoPE), for the FP8 KV cache scale.

Default text: held-out Python standard library files (part 0 of the held-out split; evaluate.py measures on
part 1, so calibration and evaluation never see the same file). Any local text file may be given instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm
from transformers import AutoTokenizer

from backend.formats.checkpoint import layer_prefix
from backend.model.causal_lm import CausalLM
from backend.model.config import load_model_config
from backend.model.loader import load_model
from backend.model.scoring import window_logits
from build_engines.corpus import heldout_part_text

CALIBRATION_PART = 0  # of build_engines.corpus.heldout_part_text's two parts; evaluation uses the other
CHARS_PER_TOKEN = 6  # generous: read enough text for max_tokens (held-out stdlib: ~5 chars a demo-tokenizer token)
# Linear inputs recorded, as (module whose input it is, the linears that read it).
INPUTS = (("attention", ("attention.qkv",)), ("attention.dense", ("attention.dense",)),
          ("mlp", ("mlp.fc", "mlp.gate")), ("mlp.proj", ("mlp.proj",)))


@dataclass
class LinearInputStats:
    channel_mean_abs: torch.Tensor  # (in,) float32
    amax: float  # largest |x| over every calibration token
    samples: torch.Tensor  # (rows, in) float32: every k-th calibration token's input row


@dataclass
class ActivationStats:
    """By linear name ("transformer.layers.0.mlp.fc"; fc and gate share one object), and per layer."""

    linears: dict[str, LinearInputStats]
    kv_amax: list[tuple[float, float]]  # per layer: (max |K|, max |V|) as stored in the cache
    num_tokens: int


@dataclass
class _Accumulator:
    stride: int  # keep every stride-th row as a sample
    sum_abs: torch.Tensor | None = None
    amax: float = 0.0
    count: int = 0
    rows: list[torch.Tensor] = field(default_factory=list)

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1, x.shape[-1])  # (tokens, in)
        abs_x = x.abs()
        self.sum_abs = abs_x.sum(0) if self.sum_abs is None else self.sum_abs + abs_x.sum(0)
        self.amax = max(self.amax, float(abs_x.max()))
        first = (-self.count) % self.stride  # global row index continues across batches
        self.rows.append(x[first::self.stride].clone())
        self.count += x.shape[0]

    def result(self) -> LinearInputStats:
        return LinearInputStats(self.sum_abs / self.count, self.amax, torch.cat(self.rows))


def calibration_tokens(tokenizer_dir: Path, calib_text: Path | None, max_tokens: int) -> torch.Tensor:
    """(n,) int64, 2 <= n <= max_tokens: `calib_text`'s tokens, or the default held-out stdlib text's."""
    return text_tokens(tokenizer_dir, calib_text, max_tokens, CALIBRATION_PART)


def text_tokens(tokenizer_dir: Path, text_file: Path | None, max_tokens: int, heldout_part: int) -> torch.Tensor:
    """The first max_tokens tokens of a local text file, or (None) of that part of the held-out stdlib text."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    if text_file is None:
        text = heldout_part_text(max_tokens * CHARS_PER_TOKEN, heldout_part)
    else:
        path = Path(text_file)
        if not path.is_file():
            raise FileNotFoundError(f"text file {path} not found")
        text = path.read_text(encoding="utf-8", errors="replace")[: max_tokens * CHARS_PER_TOKEN * 2]
    ids = AutoTokenizer.from_pretrained(str(tokenizer_dir))(text, add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        raise ValueError(f"text {text_file or '(held-out stdlib)'} has {len(ids)} tokens; need at least 2")
    return torch.tensor(ids[:max_tokens], dtype=torch.long)


def calibrate(ckpt_dir: Path, tokenizer_dir: Path, calib_text: Path | None = None, max_tokens: int = 8192,
              seq_len: int = 512, sample_rows: int = 512, progress: bool = True) -> ActivationStats:
    """Statistics of the float checkpoint `ckpt_dir` over up to max_tokens calibration tokens."""
    cfg = load_model_config(ckpt_dir)
    if cfg.quantization.quantized:
        raise ValueError(f"{ckpt_dir} is already quantized ({cfg.quantization}); calibrate the float checkpoint")
    tokens = calibration_tokens(tokenizer_dir, calib_text, max_tokens)
    model = load_model(ckpt_dir, torch.device("cpu"))
    return collect_stats(model, tokens, min(seq_len, cfg.max_position_embeddings), sample_rows, progress)


def collect_stats(model: CausalLM, tokens: torch.Tensor, seq_len: int, sample_rows: int = 512,
                  progress: bool = True, batch_windows: int = 4) -> ActivationStats:
    """Run `tokens` (n,) through `model` in windows of seq_len (the last one shorter) with input hooks."""
    if sample_rows < 1:
        raise ValueError(f"sample_rows must be >= 1, got {sample_rows}")
    stride = max(1, -(-len(tokens) // sample_rows))
    accs: dict[str, _Accumulator] = {}
    hooks = []
    for i, layer in enumerate(model.transformer.layers):
        for module_name, linears in INPUTS:
            acc = accs[layer_prefix(i) + linears[0]] = _Accumulator(stride)
            hooks.append(layer.get_submodule(module_name).register_forward_pre_hook(_record(acc)))
    kv_amax = [[0.0, 0.0] for _ in model.transformer.layers]
    windows = list(tokens.split(seq_len))
    batches = [windows[j:j + batch_windows] for j in range(0, len(windows), batch_windows)]
    try:
        for batch in tqdm(batches, desc="calibrating", unit="batch", disable=not progress):
            for same_len in _by_length(batch):
                _run_window_batch(model, same_len, kv_amax)
    finally:
        for h in hooks:
            h.remove()
    linears: dict[str, LinearInputStats] = {}
    for i in range(len(model.transformer.layers)):
        for _, names in INPUTS:
            result = accs[layer_prefix(i) + names[0]].result()
            linears.update({layer_prefix(i) + n: result for n in names})
    return ActivationStats(linears, [(k, v) for k, v in kv_amax], len(tokens))


def _record(acc: _Accumulator):
    def hook(_module: nn.Module, args: tuple) -> None:
        acc.add(args[0])
    return hook


def _by_length(windows: list[torch.Tensor]) -> list[torch.Tensor]:
    """Stack windows of equal length (all but possibly the last are seq_len long)."""
    full = [w for w in windows if len(w) == len(windows[0])]
    rest = [w for w in windows if len(w) != len(windows[0])]
    return [torch.stack(full)] + [w[None] for w in rest]


def _run_window_batch(model: CausalLM, windows: torch.Tensor, kv_amax: list[list[float]]) -> None:
    """Forward (B, n) windows. After each attention ran, its KV pools (fresh for this forward) hold exactly the
    K (after RoPE) and V of these windows: their maxima are what an FP8 cache must represent."""
    captured: list[tuple[float, float]] = []

    def capture(module: nn.Module, args: tuple, _out: torch.Tensor) -> None:
        k_cache, v_cache = args[1], args[2]
        captured.append((float(k_cache.abs().max()), float(v_cache.abs().max())))

    hooks = [layer.attention.register_forward_hook(capture) for layer in model.transformer.layers]
    try:
        window_logits(model, windows)
    finally:
        for h in hooks:
            h.remove()
    for i, (k, v) in enumerate(captured):
        kv_amax[i][0], kv_amax[i][1] = max(kv_amax[i][0], k), max(kv_amax[i][1], v)
