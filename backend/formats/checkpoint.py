"""The TensorRT-LLM 1.2.x checkpoint config (`config.json`) as a typed object, for the decoder families we serve.

A checkpoint directory holds `config.json` (TrtllmCheckpointConfig) and one `rank{N}.safetensors` per rank. The
writer (build_engines/convert.py) and the reader (backend/model/) share these definitions. The keys are TensorRT-LLM's
own (tensorrt_llm/models/modeling_utils.py PretrainedConfig, and the per-family configs: llama/config.py,
qwen/config.py, gemma/config.py with its Gemma2ConfigGroup, phi3/config.py); the JSON is flat as TRT-LLM writes it,
and keys that belong together are grouped here (Gemma2Keys, LongRopeKeys). Two keys are ours: `sliding_window`
and `layer_types` (TRT-LLM sets unknown keys as attributes and only warns). Which keys each architecture may carry,
and with which values, is backend/formats/families.py; every other key is checked by checkpoint_keys.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from fnmatch import fnmatchcase
from pathlib import Path

from backend.formats.config_groups import Gemma2Keys, LongRopeKeys

CONFIG_FILE = "config.json"
DTYPES = ("float32", "float16", "bfloat16")
QUANT_ALGOS = (None, "FP8", "W4A16_AWQ", "W8A16")
KV_CACHE_QUANT_ALGOS = (None, "FP8", "INT8")
LAYER_TYPES = ("full_attention", "sliding_attention")

VOCAB_EMBEDDING = "transformer.vocab_embedding.weight"
LN_F = "transformer.ln_f.weight"
LM_HEAD = "lm_head.weight"


def rank_file(rank: int) -> str:
    return f"rank{rank}.safetensors"


def layer_prefix(i: int) -> str:
    return f"transformer.layers.{i}."


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

    @property
    def quantized(self) -> bool:
        """Weights or KV cache quantized (the tensors are not all float)."""
        return bool(self.quant_algo or self.kv_cache_quant_algo)

    def excludes(self, module: str) -> bool:
        """Whether the linear `module` (e.g. "transformer.layers.0.mlp.fc", "lm_head") stays unquantized: a
        pattern of exclude_modules (fnmatch, as TRT-LLM's "*.mlp.gate") matches its full or last name."""
        short = module.rsplit(".", 1)[-1]
        return any(fnmatchcase(module, p) or fnmatchcase(short, p) for p in self.exclude_modules or ())


_GROUPS = {"gemma2": Gemma2Keys, "longrope": LongRopeKeys}


@dataclass(frozen=True)
class TrtllmCheckpointConfig:
    """`config.json` of a TRT-LLM checkpoint: the PretrainedConfig fields the supported families use."""

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
    position_embedding_type: str = "rope_gpt_neox"  # rotate halves, as HF does; "long_rope" for Phi-3 longrope
    rotary_scaling: dict | None = None  # {"type": linear|dynamic|llama3|yarn, "factor": ..., ...} or null
    rotary_pct: float = 1.0  # share of head_size that is rotated (Phi-3 / Phi-4-mini partial rotary)
    attn_bias: bool = False  # q/k/v biases (Qwen2); a dense (o_proj) bias is refused by families.py
    mlp_bias: bool = False
    qk_layernorm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    qwen_type: str | None = None  # "qwen2" | "qwen3" (TRT-LLM's Qwen model switches on it)
    tie_word_embeddings: bool = False
    share_embedding_table: bool = False
    use_parallel_embedding: bool = False
    embedding_sharding_dim: int = 0
    sliding_window: int | None = None  # ours: the window of the layers layer_types marks sliding
    layer_types: tuple[str, ...] | None = None  # ours: per layer, "full_attention" | "sliding_attention"
    gemma2: Gemma2Keys | None = None
    longrope: LongRopeKeys | None = None
    mapping: Mapping = field(default_factory=Mapping)
    quantization: QuantConfig = field(default_factory=QuantConfig)
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        from backend.formats.families import check_family

        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
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
        self._check_windows()
        if self.num_attention_heads % self.mapping.tp_size:
            raise ValueError(f"mapping.tp_size ({self.mapping.tp_size}) must divide num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.mapping.pp_size > self.num_hidden_layers:
            raise ValueError(f"mapping.pp_size ({self.mapping.pp_size}) exceeds num_hidden_layers "
                             f"({self.num_hidden_layers})")
        check_family(self)

    def _check_windows(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or null, got {self.sliding_window}")
        if self.layer_types is None:
            if self.sliding_window is not None:
                raise ValueError("sliding_window is set but layer_types is not: say which layers slide")
            return
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(f"layer_types must list one of {LAYER_TYPES} per layer ({self.num_hidden_layers}), "
                             f"got {list(self.layer_types)}")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is null")

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer: the sliding window (keys p - W < k <= p are seen), or None for full causal attention."""
        types = self.layer_types or ("full_attention",) * self.num_hidden_layers
        return tuple(self.sliding_window if t == "sliding_attention" else None for t in types)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_size * self.rotary_pct)

    def to_dict(self) -> dict:
        """JSON-ready dict, identity keys first as in TRT-LLM's own config.json; groups flattened; keys that are
        only written when set (token ids, qwen_type, the groups) are left out otherwise."""
        data = asdict(self)
        out = {k: data.pop(k) for k in ("architecture", "dtype", "logits_dtype")}
        groups = {name: data.pop(name) for name in _GROUPS}
        out.update(data)
        for group in groups.values():
            out.update(group or {})
        if out["quantization"]["exclude_modules"] is not None:
            out["quantization"]["exclude_modules"] = list(out["quantization"]["exclude_modules"])
        for key in ("layer_types", "longrope_scaling_short_factors", "longrope_scaling_long_factors"):
            if out.get(key) is not None:
                out[key] = list(out[key])
        for key in ("bos_token_id", "eos_token_id", "qwen_type"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> TrtllmCheckpointConfig:
        """Build from a config.json dict. Keys of TRT-LLM's own that change nothing here are accepted at their
        inert values; any other key is refused, naming it (checkpoint_keys.check_keys)."""
        from backend.formats.checkpoint_keys import check_keys

        missing = sorted(k for k in _REQUIRED if k not in data)
        if missing:
            raise ValueError(f"checkpoint config lacks required keys: {', '.join(missing)}")
        group_keys = {k for g in _GROUPS.values() for k in (f.name for f in fields(g))}
        plain = {f.name for f in fields(cls)} - set(_GROUPS) - {"mapping", "quantization"}
        check_keys(data, plain | group_keys)
        kwargs = {k: v for k, v in data.items() if k in plain}
        for name, group in _GROUPS.items():
            kwargs[name] = _group(group, data)
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


def _group(cls: type, data: dict):
    """The group when any of its keys is present (then its required keys must be too), else None."""
    names = [f.name for f in fields(cls)]
    if not any(n in data for n in names):
        return None
    try:
        return cls(**{n: data[n] for n in names if n in data})
    except TypeError as exc:
        raise ValueError(f"checkpoint config: incomplete {cls.__name__} keys ({exc})") from None


def _pick(cls: type, data: dict):
    """cls(**data) keeping only cls's fields (TRT-LLM's Mapping also has rank, cp_size, ...; checked by
    checkpoint_keys)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
