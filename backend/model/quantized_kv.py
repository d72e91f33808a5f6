"""The paged KV pools a runner allocates per layer: float tensors, or FP8 pools when the checkpoint's KV cache is
FP8 (its attentions then hold kv_cache_scaling_factor, see backend/model/quantized_linear.py).

An Fp8KVPool indexes like the float pool Attention writes and reads (pool.index_copy_(0, slots, kv);
pool.index_select(0, slots)), so the model code is the same for both: writes store kv / scale as
float8_e4m3fn (saturated at +-448), reads return the stored values times scale in the activations' dtype. One scale
per layer serves K and V alike (TRT-LLM's kv_cache_scaling_factor)."""
from __future__ import annotations

import torch
from torch import nn

from backend.formats.fp8 import FP8, from_fp8, to_fp8


class Fp8KVPool:
    def __init__(self, shape: tuple[int, ...], scale: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        self.data = torch.zeros(shape, dtype=FP8, device=device)  # (slots, n_kv, head_dim)
        self.scale = scale.to(device=device, dtype=torch.float32)
        self.dtype = dtype

    def index_copy_(self, dim: int, index: torch.Tensor, value: torch.Tensor) -> Fp8KVPool:
        # index_copy_ has no float8 kernel on CPU: copy the bytes
        self.data.view(torch.uint8).index_copy_(dim, index, to_fp8(value, self.scale).view(torch.uint8))
        return self

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        return from_fp8(self.data[index], self.scale, self.dtype)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        return from_fp8(self.data.index_select(dim, index), self.scale, self.dtype)


def kv_pools(layers: nn.ModuleList, shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device) -> list[tuple[torch.Tensor | Fp8KVPool, torch.Tensor | Fp8KVPool]]:
    """(K, V) per layer, each `shape` = (slots, n_kv_heads, head_dim): FP8 where the layer has a KV scale."""
    pools = []
    for layer in layers:
        scale = getattr(layer.attention, "kv_cache_scaling_factor", None)
        if scale is None:
            pools.append((torch.zeros(shape, dtype=dtype, device=device),
                          torch.zeros(shape, dtype=dtype, device=device)))
        else:
            pools.append((Fp8KVPool(shape, scale, dtype, device), Fp8KVPool(shape, scale, dtype, device)))
    return pools
