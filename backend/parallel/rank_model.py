"""One rank's shard of the model: its layers and heads (from its rank{N}.safetensors), its KV cache shard (same
block tables as every rank, its own KV heads and layers), and how it runs one step."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from backend.model import LlamaForCausalLM, rotary_tables
from backend.model_config import ModelConfig, torch_dtype
from backend.parallel.pipeline_parallel import apply_pipeline, logits_to_driver, stage_forward
from backend.parallel.tensor_parallel import add_all_reduce, shard_linears
from backend.step_inputs import StepInputs, step_tensors
from build_engines.checkpoint_format import rank_file
from build_engines.rank_layout import RankPosition, kv_heads_per_rank


def load_rank_model(ckpt_dir: Path, cfg: ModelConfig, pos: RankPosition, tp_group: dist.ProcessGroup,
                    device: torch.device) -> LlamaForCausalLM:
    """Build the whole model on the meta device (no memory), cut it to this rank (pipeline stage, then tensor-
    parallel shares, then quantized linears of those shares, then the all-reduces), load the rank's file."""
    dtype = torch_dtype(cfg)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(dtype=dtype)
    shard_linears(apply_pipeline(model, pos), pos.tp_size, tp_group)
    model = quantize(model, cfg, dtype)
    add_all_reduce(model, pos.tp_size, tp_group)
    weights_file = Path(ckpt_dir) / rank_file(pos.rank)
    if not weights_file.is_file():
        raise FileNotFoundError(f"{weights_file} not found: the checkpoint's mapping ({cfg.mapping}) needs one "
                                f"file per rank")
    state = load_file(str(weights_file))
    expected = set(model.state_dict().keys())
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"{weights_file}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")
    model.load_state_dict(state, strict=True, assign=True)
    model.rope_cos, model.rope_sin = rotary_tables(cfg.head_size, cfg.max_position_embeddings, cfg.rotary_base)
    return prepare(model.to(device=device).eval()).fuse()  # no dtype cast: float8 / int tensors keep theirs


def quantize(model: LlamaForCausalLM, cfg: ModelConfig, dtype: torch.dtype) -> LlamaForCausalLM:
    """Quantized linears (backend/quantized_linear.py, from the issue-4 build pipeline) where the checkpoint is
    quantized; a clear error where this tree has no quantized runtime."""
    quant = cfg.quantization
    if not (quant.quant_algo or quant.kv_cache_quant_algo):
        return model
    try:
        from backend.quantized_linear import apply_quantization
    except ImportError:
        raise ValueError(f"quantized checkpoints ({quant}) are not supported by this runtime") from None
    return apply_quantization(model, quant, dtype)


def prepare(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """Quantized linears convert their loaded tensors to their kernels' layout (a no-op for float models)."""
    try:
        from backend.quantized_linear import prepare_quantized
    except ImportError:
        return model
    return prepare_quantized(model)


class RankModel:
    """A loaded shard plus its KV cache: execute() runs this rank's part of a step."""

    def __init__(self, ckpt_dir: Path, cfg: ModelConfig, pos: RankPosition, tp_group: dist.ProcessGroup,
                 num_blocks: int, block_size: int, device: torch.device) -> None:
        self.cfg, self.pos, self.device, self.dtype = cfg, pos, device, torch_dtype(cfg)
        self.model = load_rank_model(ckpt_dir, cfg, pos, tp_group, device)
        # (slots, local kv heads, head_dim) per local layer; slot numbers are the same on every rank.
        shape = (num_blocks * block_size, kv_heads_per_rank(cfg.num_key_value_heads, pos.tp_size), cfg.head_size)
        self.kv = [(torch.zeros(shape, dtype=self.dtype, device=device),
                    torch.zeros(shape, dtype=self.dtype, device=device))
                   for _ in range(len(self.model.transformer.layers))]

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor | None:
        """Logits (S, vocab) float32 on rank 0; None on the other ranks."""
        m = self.model
        input_ids, meta, logits_index = step_tensors(inputs, m.rope_cos, m.rope_sin, self.dtype, self.device)
        logits = stage_forward(m, self.pos, input_ids, meta, self.kv, logits_index, self.dtype)
        return logits_to_driver(logits, self.pos, inputs.num_sampled, self.cfg.vocab_size, self.device)
