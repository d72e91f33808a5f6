"""The config.json fields of released checkpoints of each family (the public Hugging Face values; structure only, no
weights), and memory plans of them: weights on the meta device (nothing allocated), per quantization and TP size,
through the same converter and planner a real build runs (hf_families -> plan.plan_memory).

`python -m build_engines plan-families --device-memory-gib 24` prints the table docs/families.md shows.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoConfig

from backend.formats.checkpoint import TrtllmCheckpointConfig
from build_engines.hf_families.configs import checkpoint_config
from build_engines.hf_families.fields import FAMILIES, check_fields
from build_engines.plan import MemoryPlan, plan_memory
from build_engines.spec import BuildSpec, Limits, MemoryBudget, SpecError

_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
REAL_CONFIGS: dict[str, dict] = {
    "Llama-3.1-8B": dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         rope_scaling=_LLAMA31_ROPE, tie_word_embeddings=False, bos_token_id=128000,
                         eos_token_id=[128001, 128008, 128009], hidden_act="silu", attention_bias=False,
                         mlp_bias=False),
    "Mistral-7B-v0.3": dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=32768,
                            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
                            rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False, bos_token_id=1,
                            eos_token_id=2, hidden_act="silu"),
    "Mistral-7B-v0.1": dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=32000,
                            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
                            rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False, bos_token_id=1,
                            eos_token_id=2, hidden_act="silu"),
    "Qwen2.5-7B": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=152064, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       use_sliding_window=False, sliding_window=131072, max_window_layers=28,
                       tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151643, hidden_act="silu"),
    "Gemma-2-9B": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=256000, hidden_size=3584,
                       intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0, max_position_embeddings=8192, rms_norm_eps=1e-6,
                       rope_theta=10000.0, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                       hidden_act="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0),
}
QUANTIZATIONS = (("bfloat16", "none", "none"), ("fp8 + fp8 KV", "fp8", "fp8"), ("int8_wo", "int8_wo", "none"),
                 ("int4_awq", "int4_awq", "none"))
PLAN_LIMITS = Limits(max_batch_size=256, max_input_len=4096, max_seq_len=8192, max_num_tokens=2048,
                     tokens_per_block=64)


def real_checkpoint_config(name: str, dtype: str = "bfloat16") -> TrtllmCheckpointConfig:
    """The TRT-LLM config the converter writes for that released checkpoint (its fields checked as a real one's)."""
    raw = REAL_CONFIGS[name]
    family = FAMILIES[raw["model_type"]]
    check_fields(family, raw, name)
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
    return checkpoint_config(family, AutoConfig.for_model(raw["model_type"], **fields), raw, dtype)


@dataclass(frozen=True)
class PlanRow:
    model: str
    quantization: str
    tp_size: int
    plan: MemoryPlan | None
    refusal: str | None  # the planner's message when it does not fit or split

    def cells(self) -> list[str]:
        if self.plan is None:
            return [self.model, self.quantization, str(self.tp_size), "refused", "", "", "", self.refusal or ""]
        rank = self.plan.ranks[0]
        return [self.model, self.quantization, str(self.tp_size), f"{rank.weight_bytes / 2**30:.2f} GiB",
                f"{rank.kv_bytes_per_token / 1024:.0f} KiB", f"{self.plan.kv_tokens:,}",
                f"{self.plan.sequence_tokens:,}", str(self.plan.kv_tokens // self.plan.sequence_tokens)]


def plan_row(model: str, label: str, quantization: str, kv_cache: str, tp_size: int, device_memory_gib: float,
             limits: Limits = PLAN_LIMITS) -> PlanRow:
    spec = BuildSpec(name="plan", source=model, dtype="bfloat16", quantization=quantization, kv_cache=kv_cache,
                     tp_size=tp_size, limits=limits, memory=MemoryBudget(device_memory_gib=device_memory_gib))
    try:
        return PlanRow(model, label, tp_size, plan_memory(real_checkpoint_config(model), spec), None)
    except SpecError as exc:
        return PlanRow(model, label, tp_size, None, str(exc))


def plan_table(device_memory_gib: float, tp_sizes: tuple[int, ...] = (1, 2), limits: Limits = PLAN_LIMITS) -> str:
    rows = [plan_row(m, label, q, kv, tp, device_memory_gib, limits)
            for m in REAL_CONFIGS for label, q, kv in QUANTIZATIONS for tp in tp_sizes]
    head = ["model", "weights", "tp", "weights / rank", "KV / token / rank", "KV tokens that fit",
            f"KV tokens a {limits.max_seq_len}-token sequence holds", "such sequences at once"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)
