"""One rank's shard of the model: its layers and heads (from its rank{N}.safetensors), its KV cache shard (same
block tables as every rank, its own KV heads and layers), and how it runs one step."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from backend.formats.checkpoint import rank_file
from backend.formats.rank_layout import RankPosition, kv_heads_per_rank
from backend.model.causal_lm import CausalLM
from backend.model.config import ModelConfig, torch_dtype
from backend.model.loader import load_weights
from backend.model.parallel.pipeline_parallel import apply_pipeline, logits_to_driver, stage_forward
from backend.model.parallel.tensor_parallel import add_all_reduce, shard_linears
from backend.model.quantized_kv import kv_pools
from backend.model.quantized_linear import apply_quantization
from backend.model.runner import model_step_tensors
from backend.model.step_inputs import StepInputs


def load_rank_model(ckpt_dir: Path, cfg: ModelConfig, pos: RankPosition, tp_group: dist.ProcessGroup,
                    device: torch.device) -> CausalLM:
    """Build the whole model on the meta device (no memory), cut it to this rank (pipeline stage, then tensor-
    parallel shares, then quantized linears of those shares, then the all-reduces), load the rank's file."""
    dtype = torch_dtype(cfg)
    with torch.device("meta"):
        model = CausalLM(cfg).to(dtype=dtype)
    shard_linears(apply_pipeline(model, pos), pos.tp_size, tp_group)
    model = apply_quantization(model, cfg.quantization, dtype)
    add_all_reduce(model, pos.tp_size, tp_group)
    weights_file = Path(ckpt_dir) / rank_file(pos.rank)
    if not weights_file.is_file():
        raise FileNotFoundError(f"{weights_file} not found: the checkpoint's mapping ({cfg.mapping}) needs one "
                                f"file per rank")
    return load_weights(model, cfg, weights_file, device)


class RankModel:
    """A loaded shard plus its KV cache: execute() runs this rank's part of a step."""

    def __init__(self, ckpt_dir: Path, cfg: ModelConfig, pos: RankPosition, tp_group: dist.ProcessGroup,
                 num_blocks: int, block_size: int, device: torch.device) -> None:
        self.cfg, self.pos, self.device, self.dtype = cfg, pos, device, torch_dtype(cfg)
        self.model = load_rank_model(ckpt_dir, cfg, pos, tp_group, device)
        # (slots, local kv heads, head_dim) per local layer; slot numbers are the same on every rank.
        shape = (num_blocks * block_size, kv_heads_per_rank(cfg.num_key_value_heads, pos.tp_size), cfg.head_size)
        self.kv = kv_pools(self.model.transformer.layers, shape, self.dtype, device)

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor | None:
        """Logits (S, vocab) float32 on rank 0; None on the other ranks."""
        m = self.model
        input_ids, meta, logits_index = model_step_tensors(m, inputs, self.device)
        logits = stage_forward(m, self.pos, input_ids, meta, self.kv, logits_index, self.dtype)
        return logits_to_driver(logits, self.pos, inputs.num_sampled, self.cfg.vocab_size, self.device)
