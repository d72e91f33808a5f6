"""The build spec: one YAML or TOML file that says what `python -m build_engines build SPEC` makes.

    name: demo-fp8                 # names the build's output folder and the report
    source: demo                   # a HF Llama checkpoint dir, or `demo` (the trained demo model)
    dtype: bfloat16                # float32 | bfloat16 | float16: weights that are not quantized
    quantization: fp8              # none | fp8 | int4_awq | int8_wo
    kv_cache: fp8                  # none | fp8
    tp_size: 1
    pp_size: 1
    limits: {max_batch_size: 16, max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 2048, tokens_per_block: 32}
    memory: {device_memory_gib: 16, kv_cache_free_mem_fraction: 0.9}
    target: torch                  # torch | tensorrt_llm
    version: 2                     # model-repository version to install into (default: next free one)

Every check that needs only the spec happens in __post_init__ and says what to change; checks that need the
model (tp dividing the heads, the model fitting the device) happen in the memory plan (plan.py), before building.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
import yaml

from backend.engine.config import EngineConfig, engine_default
from backend.formats.checkpoint import DTYPES
from build_engines.quantize.methods import KvCacheMethod, QuantMethod

# What a build may ask for (int4_rtn, AWQ's baseline, is for measurements only).
QUANT_METHODS = tuple(m.value for m in QuantMethod if m is not QuantMethod.INT4_RTN)
KV_CACHE_METHODS = tuple(m.value for m in KvCacheMethod)
TARGETS = ("torch", "tensorrt_llm")
DEMO_SOURCE = "demo"


class SpecError(ValueError):
    """A spec that cannot be built; the message names the field and what to change."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SpecError(message)


@dataclass(frozen=True)
class Limits:
    """The engine's limits: the same fields as config.pbtxt and trtllm-build's flags."""

    max_batch_size: int = engine_default("max_batch_size")
    max_input_len: int = engine_default("max_input_len")
    max_seq_len: int = engine_default("max_seq_len")
    max_num_tokens: int = engine_default("max_num_tokens")
    tokens_per_block: int = engine_default("tokens_per_block")

    def __post_init__(self) -> None:
        try:  # the runtime's own checks, so a spec the engine would refuse is refused here
            self.engine_config()
        except ValueError as exc:
            raise SpecError(f"limits: {exc}") from None

    def engine_config(self, kv_cache_free_mem_fraction: float = 0.9) -> EngineConfig:
        return EngineConfig(**dataclasses.asdict(self), kv_cache_free_mem_fraction=kv_cache_free_mem_fraction,
                            device="cpu")


@dataclass(frozen=True)
class MemoryBudget:
    """The device the memory plan sizes the KV cache for (per rank)."""

    device_memory_gib: float = 16.0
    kv_cache_free_mem_fraction: float = 0.9  # share of memory left after the weights that the KV cache takes

    def __post_init__(self) -> None:
        _require(self.device_memory_gib > 0, f"memory.device_memory_gib must be > 0, got {self.device_memory_gib}")
        _require(0.0 < self.kv_cache_free_mem_fraction <= 1.0,
                 f"memory.kv_cache_free_mem_fraction must be in (0, 1], got {self.kv_cache_free_mem_fraction}")

    @property
    def device_bytes(self) -> int:
        return int(self.device_memory_gib * 2**30)


@dataclass(frozen=True)
class VerifySpec:
    """What verification measures (verify.py, quantize/evaluate.py)."""

    eval_tokens: int = 16384  # held-out tokens scored for perplexity / top-1 agreement (part 1 of the split)
    seq_len: int = 256  # scored in windows of this many tokens
    shard_check_prompts: int = 4  # sharded builds: held-out prompts whose greedy tokens are compared
    shard_check_tokens: int = 32  # greedy tokens per prompt
    throughput_batches: tuple[int, ...] = (1, 16)  # tokens/s measured at these batch sizes (empty: skip)
    prompt_len: int = 128  # tokens/s runs: prompt tokens and new tokens per request
    new_tokens: int = 128
    onnx_layer: bool = True  # export decoder layer 0 to ONNX and compare with polygraphy (onnxruntime)

    def __post_init__(self) -> None:
        object.__setattr__(self, "throughput_batches", tuple(self.throughput_batches))
        for name in ("eval_tokens", "shard_check_prompts", "shard_check_tokens", "prompt_len", "new_tokens"):
            _require(getattr(self, name) > 0, f"verify.{name} must be > 0, got {getattr(self, name)}")
        _require(self.seq_len >= 2, f"verify.seq_len must be >= 2 (a window predicts its own next tokens), "
                                    f"got {self.seq_len}")
        _require(self.eval_tokens >= self.seq_len, f"verify.eval_tokens ({self.eval_tokens}) must hold at least one "
                                                   f"window of seq_len ({self.seq_len})")
        _require(all(b > 0 for b in self.throughput_batches),
                 f"verify.throughput_batches must be positive batch sizes, got {list(self.throughput_batches)}")


@dataclass(frozen=True)
class BuildSpec:
    name: str
    source: str  # HF checkpoint directory, or "demo"
    dtype: str = "bfloat16"
    quantization: str = "none"
    kv_cache: str = "none"
    group_size: int = 128  # columns per INT4 scale (int4_awq)
    calib_tokens: int = 4096  # calibration tokens for fp8 / int4_awq scales (held-out part 0, never scored)
    tp_size: int = 1
    pp_size: int = 1
    limits: Limits = field(default_factory=Limits)
    memory: MemoryBudget = field(default_factory=MemoryBudget)
    target: str = "torch"
    version: int | None = None  # model-repository version; None: the next free number
    model_repository: Path | None = None  # where to install; None: build only (the CLI flag overrides)
    output_dir: Path = Path("build")  # the build goes to output_dir / name
    verify: VerifySpec = field(default_factory=VerifySpec)

    def __post_init__(self) -> None:
        _require(bool(self.name) and "/" not in self.name and self.name not in (".", ".."),
                 f"name must be a non-empty folder name (it names the output folder), got {self.name!r}")
        _require(bool(self.source), "source must name a HF checkpoint directory or 'demo'")
        _require(self.dtype in DTYPES, f"dtype {self.dtype!r} is not one of {list(DTYPES)}")
        _require(self.quantization in QUANT_METHODS,
                 f"quantization {self.quantization!r} is not one of {list(QUANT_METHODS)}")
        _require(self.kv_cache in KV_CACHE_METHODS, f"kv_cache {self.kv_cache!r} is not one of {list(KV_CACHE_METHODS)}")
        _require(self.group_size > 0 and self.group_size % 2 == 0,
                 f"group_size must be a positive even number (INT4 values are packed in pairs), got {self.group_size}")
        _require(self.calib_tokens > 0, f"calib_tokens must be > 0, got {self.calib_tokens}")
        for name in ("tp_size", "pp_size"):
            _require(isinstance(getattr(self, name), int) and getattr(self, name) >= 1,
                     f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        _require(self.target in TARGETS, f"target {self.target!r} is not one of {list(TARGETS)}")
        _require(self.version is None or (isinstance(self.version, int) and self.version >= 1),
                 f"version must be a positive integer (or left out for the next free one), got {self.version!r}")
        if QuantMethod(self.quantization) is not QuantMethod.NONE or KvCacheMethod(self.kv_cache) is KvCacheMethod.FP8:
            _require(self.dtype != "float32" or self.target == "torch",
                     f"quantization {self.quantization!r} / kv_cache {self.kv_cache!r} on target tensorrt_llm needs "
                     "dtype bfloat16 or float16 (TensorRT-LLM's quantized kernels take 16-bit activations): "
                     "set dtype: bfloat16")
        if self.model_repository is not None:
            object.__setattr__(self, "model_repository", Path(self.model_repository))
        object.__setattr__(self, "output_dir", Path(self.output_dir))

    @property
    def quant_algo(self) -> str | None:
        return QuantMethod(self.quantization).quant_algo

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return KvCacheMethod(self.kv_cache).quant_algo

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def build_dir(self) -> Path:
        return self.output_dir / self.name

    @classmethod
    def from_dict(cls, data: dict, base_dir: Path | None = None) -> BuildSpec:
        """From a parsed file; relative paths (source, output_dir, model_repository) are taken from base_dir, and
        output_dir defaults to base_dir / "build"."""
        if not isinstance(data, dict):
            raise SpecError(f"a build spec is a mapping of fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        _require(not unknown, f"unknown fields {unknown}; the fields are {sorted(known)}")
        missing = [k for k in ("name", "source") if k not in data]
        _require(not missing, f"missing required fields {missing}")
        kwargs = dict(data)
        for key, sub in (("limits", Limits), ("memory", MemoryBudget), ("verify", VerifySpec)):
            if key in kwargs:
                kwargs[key] = _sub(sub, key, kwargs[key])
        base = Path(base_dir) if base_dir else Path.cwd()
        kwargs.setdefault("output_dir", "build")
        if kwargs["source"] != DEMO_SOURCE:
            kwargs["source"] = str(_resolve(base, kwargs["source"]))
        for key in ("output_dir", "model_repository"):
            if kwargs.get(key) is not None:
                kwargs[key] = _resolve(base, kwargs[key])
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a wrongly typed value that a comparison tripped over
            raise SpecError(f"a field has the wrong type: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> BuildSpec:
        """Read a .yaml/.yml or .toml spec file."""
        path = Path(path)
        if not path.is_file():
            raise SpecError(f"{path}: no such spec file")
        text = path.read_text()
        try:
            if path.suffix == ".toml":
                data = tomllib.loads(text)
            elif path.suffix in (".yaml", ".yml"):
                data = yaml.safe_load(text)
            else:
                raise SpecError(f"{path}: a spec is a .yaml, .yml or .toml file")
        except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
            raise SpecError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
        try:
            return cls.from_dict(data, base_dir=path.parent)
        except SpecError as exc:
            raise SpecError(f"{path}: {exc}") from None

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["verify"]["throughput_batches"] = list(self.verify.throughput_batches)
        for key in ("output_dir", "model_repository"):
            data[key] = None if data[key] is None else str(data[key])
        return data


def _sub(cls: type, key: str, value: object):
    _require(isinstance(value, dict), f"{key} must be a mapping of fields, got {value!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - known)
    _require(not unknown, f"{key}: unknown fields {unknown}; the fields are {sorted(known)}")
    try:
        return cls(**value)
    except TypeError as exc:
        raise SpecError(f"{key}: a field has the wrong type: {exc}") from None


def _resolve(base: Path, value: str | Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()
