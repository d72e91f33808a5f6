"""Held-out quality of a checkpoint, run by the engine's own torch runtime (quantized linears and FP8 KV cache
included): perplexity on held-out text and, against a reference (the unquantized checkpoint), the top-1 next-token
agreement. Default text: part 1 of the held-out stdlib split (calibration uses part 0: no shared file).

Perplexity = exp(mean next-token negative log-likelihood) over non-overlapping windows of seq_len tokens (each
window's first token is context only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from backend.formats.checkpoint import layer_prefix
from backend.model.causal_lm import CausalLM
from backend.model.loader import load_model
from backend.model.quantized_linear import linears_of
from backend.model.scoring import window_logits
from build_engines.quantize.calibration import INPUTS, collect_stats, text_tokens

EVALUATION_PART = 1  # of build_engines.corpus.heldout_part_text's two parts
DEFAULT_EVAL_TOKENS = 16384


@dataclass(frozen=True)
class QualityReport:
    tokens: int  # next-token predictions scored
    perplexity: float
    reference_perplexity: float | None = None
    top1_agreement: float | None = None  # fraction of positions whose argmax equals the reference's

    @property
    def perplexity_increase(self) -> float | None:
        """Relative: ppl / reference ppl - 1."""
        return None if self.reference_perplexity is None else self.perplexity / self.reference_perplexity - 1.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "perplexity": self.perplexity, "reference_perplexity": self.reference_perplexity,
                "perplexity_increase": self.perplexity_increase, "top1_agreement": self.top1_agreement}


def evaluation_tokens(tokenizer_dir: Path, text_file: Path | None = None,
                      max_tokens: int = DEFAULT_EVAL_TOKENS) -> torch.Tensor:
    """(n,) int64: the held-out evaluation text's tokens (or a local text file's)."""
    return text_tokens(tokenizer_dir, text_file, max_tokens, EVALUATION_PART)


def evaluate_quality(ckpt_dir: Path, tokenizer_dir: Path, reference_dir: Path | None = None,
                     text_file: Path | None = None, max_tokens: int = DEFAULT_EVAL_TOKENS, seq_len: int = 256,
                     progress: bool = False) -> QualityReport:
    """Perplexity of ckpt_dir (unsharded) on held-out text; with reference_dir, also its perplexity and the
    top-1 agreement of the two over the same positions."""
    tokens = evaluation_tokens(tokenizer_dir, text_file, max_tokens)
    model = load_model(Path(ckpt_dir), torch.device("cpu"))
    reference = load_model(Path(reference_dir), torch.device("cpu")) if reference_dir is not None else None
    return score_tokens({"model": model}, tokens, seq_len, reference, progress)["model"]


def score_tokens(models: dict[str, CausalLM], tokens: torch.Tensor, seq_len: int,
                 reference: CausalLM | None = None, progress: bool = False,
                 batch_windows: int = 4) -> dict[str, QualityReport]:
    """A QualityReport per model over tokens (n,) cut into windows of seq_len; the reference runs once."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    n_windows = len(tokens) // seq_len
    if n_windows == 0:
        raise ValueError(f"{len(tokens)} tokens are fewer than one window of seq_len {seq_len}")
    windows = tokens[: n_windows * seq_len].view(n_windows, seq_len)
    nll, agree = dict.fromkeys(models, 0.0), dict.fromkeys(models, 0)
    ref_nll, count = 0.0, 0
    for batch in tqdm(windows.split(batch_windows), desc="evaluating", unit="batch", disable=not progress):
        targets = batch[:, 1:]
        count += targets.numel()
        ref_top1 = None
        if reference is not None:
            ref_logits = window_logits(reference, batch)[:, :-1]  # (b, n - 1, vocab)
            ref_nll += _nll_sum(ref_logits, targets)
            ref_top1 = ref_logits.argmax(-1)
        for name, model in models.items():
            logits = window_logits(model, batch)[:, :-1]
            nll[name] += _nll_sum(logits, targets)
            if ref_top1 is not None:
                agree[name] += int((logits.argmax(-1) == ref_top1).sum())
    ref_ppl = math.exp(ref_nll / count) if reference is not None else None
    return {name: QualityReport(count, math.exp(nll[name] / count), ref_ppl,
                                agree[name] / count if reference is not None else None) for name in models}


def _nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum"))


@dataclass(frozen=True)
class LayerErrorReport:
    """How far a quantized model's decoder linears are from the reference's, on the same inputs.

    Inputs are the reference model's own linear inputs on the given text (the float activations, so each linear is
    judged alone, not through the drift of earlier layers). Errors are squared output differences summed over
    every linear and sampled row; relative = that sum / the reference outputs' squared sum."""

    relative_error: float
    per_linear: dict[str, float]  # linear name -> its summed squared output error


def layer_output_errors(reference: CausalLM, models: dict[str, CausalLM], tokens: torch.Tensor,
                        seq_len: int = 256, sample_rows: int = 1024) -> dict[str, LayerErrorReport]:
    """A LayerErrorReport per model: its linears run on the reference's recorded inputs over tokens (n,)."""
    stats = collect_stats(reference, tokens, seq_len, sample_rows, progress=False)
    errors: dict[str, dict[str, float]] = {name: {} for name in models}
    ref_norm = 0.0
    with torch.inference_mode():
        for i, layer in enumerate(reference.transformer.layers):
            for _, linears in INPUTS:
                x = stats.linears[layer_prefix(i) + linears[0]].samples  # (rows, in) float32
                for linear in (n for n in linears if n in linears_of(layer)):
                    want = layer.get_submodule(linear)(x.to(layer.input_layernorm.weight.dtype)).float()
                    ref_norm += float(want.pow(2).sum())
                    for name, model in models.items():
                        module = model.transformer.layers[i].get_submodule(linear)
                        got = module(x.to(model.transformer.layers[i].input_layernorm.weight.dtype)).float()
                        errors[name][layer_prefix(i) + linear] = float((got - want).pow(2).sum())
    return {name: LayerErrorReport(sum(e.values()) / ref_norm, e) for name, e in errors.items()}
