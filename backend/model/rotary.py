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
# A static rotary keeps the cos / signed-sin rows of positions below _TABLE_MAX, made _TABLE_CHUNK at a time as steps
# reach them (512 B a position at width 64): a decode step's angles, cos and sin were ~130 us of ATen operations on
# the caches a step's weights had just evicted (the first cos 74 us, a second one 3 us; perf/ISSUE16.md); a lookup
# is two index_selects.
_TABLE_CHUNK, _TABLE_MAX = 1024, 16384


class RotaryEmbedding:
    def __init__(self, spec: RopeSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self._dynamic: dict[int, torch.Tensor] = {}
        self._signs: torch.Tensor | None = None  # _signed_scaling's
        self._cos_rows = self._sin_rows = None  # _table's: (positions, dim) cos and signed sin
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
        (T, dim) float32: HF's form, which the tests compare against HF and cos_signed_sin (what steps use) against."""
        emb = self._angles(positions, prompt_len, total_len)
        return emb.cos() * self.scaling, emb.sin() * self.scaling

    def cos_signed_sin(self, positions: torch.Tensor, prompt_len: torch.Tensor,
                       total_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos_sin()'s cos, and its sin with the first half negated (decoder.signed_sin's form), the same bits in
        fewer operations (each ~2 us on the development CPU, every step): the negation rides on the scaling's multiply
        (x * -s == -(x * s) in IEEE arithmetic), and cos skips a multiply by 1.0 (x * 1.0 == x)."""
        if self._tabled(positions):
            index = positions.to(self.device)
            return self._cos_rows.index_select(0, index), self._sin_rows.index_select(0, index)
        return self._cos_signed_sin(positions, prompt_len, total_len)

    def _cos_signed_sin(self, positions: torch.Tensor, prompt_len: torch.Tensor,
                        total_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self._angles(positions, prompt_len, total_len)
        cos = emb.cos() if self.scaling == 1.0 else emb.cos() * self.scaling
        return cos, emb.sin() * self._signed_scaling(emb.shape[-1])

    def _tabled(self, positions: torch.Tensor) -> bool:
        """Whether the table answers for these positions, made to cover them first: a static kind (one inv_freq for
        every token), a width of whole 32-float runs (so ATen's vectorized cos / sin compute every element of a step
        and of the table alike, with no scalar tail: the same bits), positions below _TABLE_MAX."""
        if self.spec.kind in ("longrope", "dynamic") or (2 * self.inv_freq.numel()) % 32 or positions.numel() == 0:
            return False
        top = int(positions.max())
        if not 0 <= top < _TABLE_MAX:
            return False
        have = 0 if self._cos_rows is None else self._cos_rows.shape[0]
        if top >= have:
            rows = torch.arange(have, (top // _TABLE_CHUNK + 1) * _TABLE_CHUNK)
            cos, sin = self._cos_signed_sin(rows, rows + 1, rows + 1)  # static: the lengths are not read
            self._cos_rows = cos if have == 0 else torch.cat((self._cos_rows, cos))
            self._sin_rows = sin if have == 0 else torch.cat((self._sin_rows, sin))
        return True

    def _angles(self, positions: torch.Tensor, prompt_len: torch.Tensor, total_len: torch.Tensor) -> torch.Tensor:
        """(T, dim) float32: each token's position times its inverse frequencies, the half repeated (HF's emb)."""
        inv = self._inv_freq(positions, prompt_len, total_len)  # (T, dim / 2) or (dim / 2,)
        freqs = positions.to(self.device).float()[:, None] * inv
        return torch.cat((freqs, freqs), dim=-1)

    def _signed_scaling(self, dim: int) -> torch.Tensor:
        """(dim,) float32: -scaling over the first half, scaling over the second (made once per width)."""
        if self._signs is None or self._signs.shape[0] != dim:
            half = torch.full((dim // 2,), self.scaling, dtype=torch.float32, device=self.device)
            self._signs = torch.cat((-half, half))
        return self._signs

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
