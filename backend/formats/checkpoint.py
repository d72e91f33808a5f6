"""The TensorRT-LLM 1.2.x checkpoint layout for LlamaForCausalLM, as typed objects.

A checkpoint directory holds `config.json` (TrtllmCheckpointConfig) and one
`rank{N}.safetensors` per rank. The writer (convert.py) and the reader
(backend/model/loader.py) both use these definitions, so names and shapes agree.

Tensor names and the MLP mapping match TensorRT-LLM's own Llama converter
(tensorrt_llm/models/llama/convert.py) and GatedMLP (tensorrt_llm/layers/mlp.py):
`mlp.fc` is the projection that goes through the activation (HF gate_proj), `mlp.gate`
is the one it is multiplied by (HF up_proj): out = proj(silu(fc(x)) * gate(x)).
Every weight is (out_features, in_features), as in torch.nn.Linear.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from fnmatch import fnmatchcase
from pathlib import Path

CONFIG_FILE = "config.json"
DTYPES = ("float32", "float16", "bfloat16")
QUANT_ALGOS = (None, "FP8", "W4A16_AWQ", "W8A16")
KV_CACHE_QUANT_ALGOS = (None, "FP8", "INT8")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)

VOCAB_EMBEDDING = "transformer.vocab_embedding.weight"
LN_F = "transformer.ln_f.weight"
LM_HEAD = "lm_head.weight"


def rank_file(rank: int) -> str:
    return f"rank{rank}.safetensors"


def layer_prefix(i: int) -> str:
    return f"transformer.layers.{i}."


@dataclass(frozen=True)
class LayerNames:
    """Tensor names of decoder layer i."""

    input_layernorm: str
    qkv: str  # rows: q heads, then k heads, then v heads
    dense: str  # attention output projection (HF o_proj)
    post_layernorm: str
    mlp_fc: str  # HF gate_proj, goes through SiLU
    mlp_gate: str  # HF up_proj, multiplies silu(fc(x))
    mlp_proj: str  # HF down_proj

    @classmethod
    def of(cls, i: int) -> LayerNames:
        p = layer_prefix(i)
        return cls(input_layernorm=f"{p}input_layernorm.weight", qkv=f"{p}attention.qkv.weight",
                   dense=f"{p}attention.dense.weight", post_layernorm=f"{p}post_layernorm.weight",
                   mlp_fc=f"{p}mlp.fc.weight", mlp_gate=f"{p}mlp.gate.weight", mlp_proj=f"{p}mlp.proj.weight")


@dataclass(frozen=True)
class Mapping:
    """How the model is split over ranks: tp_size-way tensor parallel x pp_size pipeline stages."""

    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1

    def __post_init__(self) -> None:
        if min(self.world_size, self.tp_size, self.pp_size) < 1:
            raise ValueError(f"mapping sizes must be >= 1, got {self}")
        if self.world_size != self.tp_size * self.pp_size:
            raise ValueError(f"mapping.world_size ({self.world_size}) must equal tp_size * pp_size "
                             f"({self.tp_size} * {self.pp_size})")


@dataclass(frozen=True)
class QuantConfig:
    """Quantization block; all-None means unquantized weights and KV cache."""

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int = 128  # columns per scale for group-wise algorithms (W4A16_AWQ)
    has_zero_point: bool = False
    pre_quant_scale: bool = False
    exclude_modules: tuple[str, ...] | None = None  # name patterns left unquantized

    def __post_init__(self) -> None:
        if self.quant_algo not in QUANT_ALGOS:
            raise ValueError(f"quantization.quant_algo must be one of {QUANT_ALGOS}, got {self.quant_algo!r}")
        if self.kv_cache_quant_algo not in KV_CACHE_QUANT_ALGOS:
            raise ValueError(f"quantization.kv_cache_quant_algo must be one of {KV_CACHE_QUANT_ALGOS}, "
                             f"got {self.kv_cache_quant_algo!r}")
        if self.group_size < 1:
            raise ValueError(f"quantization.group_size must be >= 1, got {self.group_size}")
        if self.exclude_modules is not None:
            object.__setattr__(self, "exclude_modules", tuple(self.exclude_modules))  # JSON gives a list

    def excludes(self, module: str) -> bool:
        """Whether the linear `module` (e.g. "transformer.layers.0.mlp.fc", "lm_head") stays unquantized: a
        pattern of exclude_modules (fnmatch, as TRT-LLM's "*.mlp.gate") matches its full or last name."""
        short = module.rsplit(".", 1)[-1]
        return any(fnmatchcase(module, p) or fnmatchcase(short, p) for p in self.exclude_modules or ())


@dataclass(frozen=True)
class TrtllmCheckpointConfig:
    """`config.json` of a TRT-LLM checkpoint (the PretrainedConfig fields a Llama needs)."""

    vocab_size: int
    max_position_embeddings: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    intermediate_size: int
    norm_epsilon: float
    rotary_base: float
    architecture: str = "LlamaForCausalLM"
    dtype: str = "float32"
    logits_dtype: str = "float32"
    hidden_act: str = "silu"
    position_embedding_type: str = "rope_gpt_neox"  # rotate halves, as HF Llama does
    rotary_scaling: dict | None = None
    share_embedding_table: bool = False
    mapping: Mapping = field(default_factory=Mapping)
    quantization: QuantConfig = field(default_factory=QuantConfig)
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not supported (only {SUPPORTED_ARCHITECTURES})")
        for name in ("dtype", "logits_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        for name in ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_size", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act != "silu" or self.position_embedding_type != "rope_gpt_neox":
            raise ValueError(f"a Llama needs hidden_act 'silu' and position_embedding_type 'rope_gpt_neox', "
                             f"got {self.hidden_act!r}, {self.position_embedding_type!r}")
        if self.num_attention_heads % self.mapping.tp_size:
            raise ValueError(f"mapping.tp_size ({self.mapping.tp_size}) must divide num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.mapping.pp_size > self.num_hidden_layers:
            raise ValueError(f"mapping.pp_size ({self.mapping.pp_size}) exceeds num_hidden_layers "
                             f"({self.num_hidden_layers})")

    @property
    def qkv_split_sizes(self) -> tuple[int, int, int]:
        """Rows of the fused qkv weight taken by q, k and v (unsharded)."""
        kv_rows = self.num_key_value_heads * self.head_size
        return self.num_attention_heads * self.head_size, kv_rows, kv_rows

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of an unsharded, unquantized checkpoint, by name."""
        h, inter, vocab = self.hidden_size, self.intermediate_size, self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {VOCAB_EMBEDDING: (vocab, h), LN_F: (h,), LM_HEAD: (vocab, h)}
        for i in range(self.num_hidden_layers):
            n = LayerNames.of(i)
            shapes.update({
                n.input_layernorm: (h,),
                n.qkv: (sum(self.qkv_split_sizes), h),
                n.dense: (h, self.num_attention_heads * self.head_size),
                n.post_layernorm: (h,),
                n.mlp_fc: (inter, h),
                n.mlp_gate: (inter, h),
                n.mlp_proj: (h, inter),
            })
        return shapes

    def to_dict(self) -> dict:
        """JSON-ready dict, identity keys first as in TRT-LLM's own config.json."""
        data = asdict(self)
        out = {k: data.pop(k) for k in ("architecture", "dtype", "logits_dtype")}
        out.update(data)
        if out["quantization"]["exclude_modules"] is not None:
            out["quantization"]["exclude_modules"] = list(out["quantization"]["exclude_modules"])
        for key in ("bos_token_id", "eos_token_id"):
            if out[key] is None:
                del out[key]  # only written when known
        return out

    @classmethod
    def from_dict(cls, data: dict) -> TrtllmCheckpointConfig:
        """Build from a config.json dict; keys this project does not use are ignored
        (TRT-LLM itself writes many more, e.g. use_parallel_embedding, moe)."""
        known = {f.name for f in fields(cls)}
        missing = sorted(f.name for f in fields(cls) if f.name in _REQUIRED and f.name not in data)
        if missing:
            raise ValueError(f"checkpoint config lacks required keys: {', '.join(missing)}")
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["mapping"] = _pick(Mapping, data.get("mapping") or {})
        kwargs["quantization"] = _pick(QuantConfig, data.get("quantization") or {})
        return cls(**kwargs)

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: Path) -> TrtllmCheckpointConfig:
        """Read `path`, or `path / config.json` when given a checkpoint directory."""
        path = Path(path)
        if path.is_dir():
            path = path / CONFIG_FILE
        return cls.from_dict(json.loads(path.read_text()))


_REQUIRED = ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_size", "intermediate_size", "norm_epsilon", "rotary_base")


def _pick(cls: type, data: dict):
    """cls(**data) keeping only cls's fields (TRT-LLM's Mapping also has rank, cp_size, ...)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
