"""The whole model: embedding -> decoder layers -> final norm -> lm_head (-> soft-cap), split in three steps so that
pipeline parallelism (backend/model/parallel/pipeline_parallel.py) runs each stage's part with the same code."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from backend.model.config import ModelConfig
from backend.model.decoder import AttentionMetadata, Transformer
from backend.model.features import DecoderFeatures
from backend.model.rotary import RotaryEmbedding


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.features = f = DecoderFeatures.of(cfg)
        self.transformer = Transformer(f)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Not part of the checkpoint: built for the device once the weights are loaded (backend/model/loader.py).
        self.rotary: RotaryEmbedding | None = None

    def fuse(self) -> CausalLM:
        for layer in self.transformer.layers:
            layer.mlp.fuse()
        return self

    def to(self, *args, **kwargs) -> CausalLM:
        super().to(*args, **kwargs)
        if self.rotary is not None:
            self.rotary = self.rotary.to(next(self.parameters()).device)
        return self

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.transformer.vocab_embedding(input_ids)  # (T, hidden)
        if self.features.embedding_scale is not None:
            # HF Gemma: a float32 scalar cast to the weights' dtype first (bf16 rounds sqrt(hidden)).
            x = x * torch.tensor(self.features.embedding_scale).to(x.dtype)
        return x

    def run_layers(self, x: torch.Tensor, meta: AttentionMetadata,
                   kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        for layer, (k_cache, v_cache) in zip(self.transformer.layers, kv_caches):
            x = layer(x, k_cache, v_cache, meta)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """(S, hidden) last hidden states -> (S, vocab) float32 logits."""
        logits = self.lm_head(self.transformer.ln_f(x))
        cap = self.features.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k, v), each (slots, n_kv, head_dim)
        logits_index: torch.Tensor,  # (S,) flat index of the tokens whose next-token logits are wanted
        layers: Callable[[torch.Tensor, AttentionMetadata, list], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`layers`: what runs the decoder layers instead of run_layers (the same signature and result; the
        compiled decode layers, backend/model/kernels/decode_layers.py)."""
        x = (layers or self.run_layers)(self.embed(input_ids), meta, kv_caches)
        return self.head(x[logits_index])  # (S, vocab)
