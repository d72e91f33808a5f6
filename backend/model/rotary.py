"""cos / sin of every token of a step, for its position and its sequence's rope state (backend/model/rope.py).

HF computes freqs = position * inv_freq in float32, emb = cat(freqs, freqs), cos = cos(emb) * attention_scaling
(same for sin), then casts to the activations' dtype; so does this, per token. Static kinds use one inv_freq;
dynamic NTK one per distinct s > max_positions in the step (computed once and kept); longrope picks the short or
long set per token by its sequence's total length.
"""
from __future__ import annotations

import torch

from backend.model.rope import (
    RopeSpec,
    dynamic_inv_freq,
    longrope_inv_freq,
    longrope_scaling,
    static_inv_freq,
)

_DYNAMIC_CACHE = 4096  # distinct sequence lengths whose NTK inv_freq is kept


class RotaryEmbedding:
    def __init__(self, spec: RopeSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self._dynamic: dict[int, torch.Tensor] = {}
        if spec.kind == "longrope":
            self.short = longrope_inv_freq(spec, spec.params["short_factor"]).to(device)
            self.long = longrope_inv_freq(spec, spec.params["long_factor"]).to(device)
            self.scaling = longrope_scaling(spec)
            self.inv_freq = self.short
        else:
            inv_freq, self.scaling = static_inv_freq(spec)
            self.inv_freq = inv_freq.to(device)

    def to(self, device: torch.device) -> RotaryEmbedding:
        return RotaryEmbedding(self.spec, device)

    def cos_sin(self, positions: torch.Tensor, prompt_len: torch.Tensor,
                total_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions, prompt_len, total_len: (T,) int64 per token (the last two its sequence's). Returns cos, sin
        (T, dim) float32."""
        inv = self._inv_freq(positions, prompt_len, total_len)  # (T, dim / 2) or (dim / 2,)
        freqs = positions.to(self.device).float()[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.scaling, emb.sin() * self.scaling

    def _inv_freq(self, positions: torch.Tensor, prompt_len: torch.Tensor, total_len: torch.Tensor) -> torch.Tensor:
        if self.spec.kind == "longrope":
            long = (total_len > self.spec.params["original_max_position_embeddings"]).to(self.device)
            return torch.where(long[:, None], self.long[None], self.short[None])
        if self.spec.kind != "dynamic":
            return self.inv_freq[None]
        seq_len = torch.maximum(positions + 1, prompt_len)  # (T,): HF's s for the forward that computed the token
        out = self.inv_freq[None].expand(len(positions), -1).clone()
        for s in seq_len.unique().tolist():
            if s > self.spec.max_positions:
                out[(seq_len == s).to(self.device)] = self._dynamic_for(s)
        return out

    def _dynamic_for(self, s: int) -> torch.Tensor:
        if s not in self._dynamic:
            if len(self._dynamic) >= _DYNAMIC_CACHE:
                self._dynamic.clear()
            self._dynamic[s] = dynamic_inv_freq(self.spec, s).to(self.device)
        return self._dynamic[s]
