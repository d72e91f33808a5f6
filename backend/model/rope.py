"""Rotary position embedding, every variant HF transformers 5 defines for the served families, computed exactly as HF
does (float32 torch ops in HF's order: modeling_rope_utils.py), so float32 greedy output matches token for token.

Variants (the checkpoint's rotary_scaling "type", or position_embedding_type long_rope):
- default / linear (inv_freq / factor) / llama3 (per-band divisors) / yarn (ramped inter/extrapolation, cos and
  sin scaled by an attention factor): static, one inv_freq for every position;
- dynamic (NTK): above max_position_embeddings the base grows with the sequence length s,
  base' = base * (factor * s / max_pos - (factor - 1)) ** (dim / (dim - 2));
- longrope (Phi-3): short factors while the sequence is at most original_max_position_embeddings long, long
  factors beyond, cos and sin scaled by sqrt(1 + ln(max_pos / omax) / ln(omax)).

What "s" is for a token follows HF's generate() at batch size 1 with a fresh model (the engine rule):
- dynamic: a prompt is one forward, so every prompt token uses s = prompt length; a generated token at position p
  uses s = p + 1 (its own forward). Keys are stored rotated, never re-rotated. So s(p) = max(p + 1, prompt_len),
  a pure function of the token, whatever the chunking or a recompute after preemption.
- longrope: every key and query of a sequence uses the set of its current total length L (HF's Phi-3 drops its
  cache and recomputes the whole sequence when L first exceeds omax). The engine does that recompute
  (backend/engine/rope_regime.py); here the set is chosen by the sequence's total length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from backend.formats.checkpoint import TrtllmCheckpointConfig

# Keys a rotary_scaling dict may carry per type (besides "type" / "rope_type"), as TRT-LLM 1.2 reads them.
_KEYS = {
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
    "yarn": ({"factor", "original_max_position_embeddings"},
             {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}


@dataclass(frozen=True)
class RopeSpec:
    """The rotary embedding of a checkpoint: kind, base, rotated dimension and the kind's parameters."""

    kind: str  # default | linear | dynamic | llama3 | yarn | longrope
    base: float
    dim: int  # rotated channels per head (head_size x rotary_pct), even
    max_positions: int  # max_position_embeddings (dynamic's threshold, longrope's mscale)
    params: dict = field(default_factory=dict)  # the kind's keys (factor, ...; longrope: omax and the factor lists)

    @classmethod
    def of(cls, cfg: TrtllmCheckpointConfig) -> RopeSpec:
        """From the checkpoint config; raises ValueError naming a missing or unsupported rotary_scaling key."""
        base, dim, max_pos = float(cfg.rotary_base), cfg.rotary_dim, cfg.max_position_embeddings
        if cfg.longrope is not None:
            lr = cfg.longrope
            return cls("longrope", base, dim, max_pos, {"original_max_position_embeddings":
                                                         lr.original_max_position_embeddings,
                                                         "short_factor": list(lr.longrope_scaling_short_factors),
                                                         "long_factor": list(lr.longrope_scaling_long_factors)})
        if cfg.rotary_scaling is None:
            return cls("default", base, dim, max_pos)
        scaling = dict(cfg.rotary_scaling)
        kind = scaling.pop("type", None) or scaling.pop("rope_type", None)
        scaling.pop("rope_type", None)
        required, optional = _KEYS[kind]
        missing, unknown = required - scaling.keys(), scaling.keys() - required - optional
        if missing or unknown:
            raise ValueError(f"rotary_scaling type {kind!r}: missing keys {sorted(missing)}, unsupported keys "
                             f"{sorted(unknown)} (supported: {sorted(required | optional)})")
        _check_yarn_mscale(kind, scaling)
        return cls(kind, base, dim, max_pos, scaling)

    @property
    def static(self) -> bool:
        """One inv_freq for every token (no dependence on the sequence's length)."""
        return self.kind not in ("dynamic", "longrope")


def _check_yarn_mscale(kind: str, p: dict) -> None:
    if kind == "yarn" and p.get("truncate", True) is not True:
        raise ValueError("rotary_scaling yarn: truncate false is not supported (TensorRT-LLM always truncates the "
                         "correction range)")
    # HF uses mscale only together with mscale_all_dim; TRT-LLM divides by get_mscale(factor, mscale_all_dim=0) = 1,
    # so a lone mscale != 1 means different numbers in the two: refused rather than matched to one of them.
    if kind == "yarn" and not (p.get("mscale") and p.get("mscale_all_dim")) and p.get("mscale") not in (None, 1, 1.0):
        raise ValueError(f"rotary_scaling yarn: mscale {p['mscale']} without mscale_all_dim is not supported "
                         f"(HF ignores it, TensorRT-LLM applies it)")


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, scaled)


def _yarn(base: float, dim: int, p: dict) -> tuple[torch.Tensor, float]:
    factor, omax = p["factor"], p["original_max_position_embeddings"]
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    scaling = (float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)) if mscale and mscale_all_dim
               else get_mscale(factor))

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(omax / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(p.get("beta_fast") or 32)), 0)
    high = min(math.ceil(correction_dim(p.get("beta_slow") or 1)), dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    return interpolation * (1 - extra_factor) + extrapolation * extra_factor, scaling


def static_inv_freq(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    """(inv_freq (dim / 2,) float32, attention_scaling) of a static kind, or dynamic's below max_positions."""
    p = spec.params
    if spec.kind in ("default", "dynamic"):  # dynamic at s <= max_pos: base' == base (HF's init computation)
        base = spec.base
        if spec.kind == "dynamic":
            base = spec.base * ((p["factor"] * spec.max_positions / spec.max_positions) - (p["factor"] - 1)) ** (
                spec.dim / (spec.dim - 2))
        return _default_inv_freq(base, spec.dim), 1.0
    if spec.kind == "linear":
        return _default_inv_freq(spec.base, spec.dim) / p["factor"], 1.0
    if spec.kind == "llama3":
        return _llama3(_default_inv_freq(spec.base, spec.dim), p), 1.0
    if spec.kind == "yarn":
        return _yarn(spec.base, spec.dim, p)
    raise ValueError(f"{spec.kind} rope has no static inv_freq")


def dynamic_inv_freq(spec: RopeSpec, seq_len: int) -> torch.Tensor:
    """NTK inv_freq for a forward whose longest sequence is seq_len > max_positions: HF's float32 tensor math."""
    s = torch.maximum(torch.tensor(seq_len), torch.tensor(spec.max_positions))
    factor = spec.params["factor"]
    base = spec.base * ((factor * s / spec.max_positions) - (factor - 1)) ** (spec.dim / (spec.dim - 2))
    return 1.0 / (base ** (torch.arange(0, spec.dim, 2, dtype=torch.int64).to(dtype=torch.float) / spec.dim))


def longrope_inv_freq(spec: RopeSpec, factors: list[float]) -> torch.Tensor:
    shape = torch.arange(0, spec.dim, 2, dtype=torch.int64).float() / spec.dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * spec.base ** shape)


def longrope_scaling(spec: RopeSpec) -> float:
    omax = spec.params["original_max_position_embeddings"]
    factor = spec.max_positions / omax
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(omax))
