"""The one reader of config.pbtxt parameters (string values, as the anchor's), for every Triton model of ours.

Triton hands a model its config as JSON: parameters are {name: {"string_value": ...}}. An unset parameter, an
empty one and an unrendered `${...}` placeholder all mean "the default"; defaults come from the dataclass each
value lands in (EngineConfig's limits: backend/engine/config.py), never restated here. Booleans follow one rule:
true / false, case-insensitive (1 / 0 and yes / no too); anything else is refused naming the parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from backend.engine.config import EngineConfig, SchedulerPolicy, engine_default
from backend.policy.request_context import TenancyConfig
from backend.serving.cpu_placement import check_engine_threads, parse_cpu_list

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


class ModelParameters:
    """config.pbtxt parameters of one model, typed on read."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = {k: v.strip() for k, v in values.items() if v.strip() and not v.strip().startswith("${")}

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any]) -> "ModelParameters":
        """From the model config Triton passes to initialize() (args["model_config"], parsed)."""
        params = model_config.get("parameters", {}) or {}
        return cls({k: str(v.get("string_value", "")) for k, v in params.items()})

    def has(self, name: str) -> bool:
        return name in self._values

    def text(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name, default)

    def required(self, name: str, what: str) -> str:
        if name not in self._values:
            raise ValueError(f"parameter {name} ({what}) is required")
        return self._values[name]

    def flag(self, name: str, default: bool) -> bool:
        value = self._values.get(name)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(f"parameter {name} must be true or false, got {value!r}")

    def integer(self, name: str, default: int | None) -> int | None:
        return self._typed(name, default, int, "an integer")

    def number(self, name: str, default: float) -> float:
        return self._typed(name, default, float, "a number")

    def _typed(self, name: str, default, cast, what: str):
        value = self._values.get(name)
        if value is None:
            return default
        try:
            return cast(value)
        except ValueError:
            raise ValueError(f"parameter {name} must be {what}, got {value!r}") from None

    def path(self, name: str) -> Path | None:
        value = self._values.get(name)
        return Path(value) if value is not None else None


def engine_config(p: ModelParameters) -> EngineConfig:
    """EngineConfig from tensorrt_llm's parameters (the anchor's names; ours: engine_device, engine_threads)."""
    limit = lambda name: p.integer(name, engine_default(name))  # noqa: E731
    return EngineConfig(
        max_batch_size=limit("max_batch_size"),
        max_num_tokens=limit("max_num_tokens"),
        max_input_len=limit("max_input_len"),
        max_seq_len=limit("max_seq_len"),
        tokens_per_block=limit("tokens_per_block"),
        max_tokens_in_paged_kv_cache=p.integer("max_tokens_in_paged_kv_cache", None),
        kv_cache_free_mem_fraction=p.number("kv_cache_free_gpu_mem_fraction",
                                            engine_default("kv_cache_free_mem_fraction")),
        policy=SchedulerPolicy(p.text("batch_scheduler_policy", engine_default("policy").value)),
        enable_chunked_context=p.flag("enable_chunked_context", engine_default("enable_chunked_context")),
        enable_kv_cache_reuse=p.flag("enable_kv_cache_reuse", engine_default("enable_kv_cache_reuse")),
        device=p.text("engine_device", engine_default("device")),
        num_threads=p.integer("engine_threads", None),
        adaptive_threads=p.flag("engine_adaptive_threads", engine_default("adaptive_threads")),
        cuda_graph_mode=cuda_graph_mode(p),
    )


def cuda_graph_mode(p: ModelParameters) -> str:
    """The anchor's boolean cuda_graph_mode: true "on", false "off"; unset or "auto": EngineConfig's default."""
    value = p.text("cuda_graph_mode")
    if value is None or value.lower() == "auto":
        return engine_default("cuda_graph_mode")
    try:
        return "on" if p.flag("cuda_graph_mode", False) else "off"
    except ValueError:
        raise ValueError(f"parameter cuda_graph_mode must be true, false or auto, got {value!r}") from None


@dataclass(frozen=True)
class ServingConfig:
    """The tensorrt_llm model's parameters."""

    engine_dir: Path
    engine: EngineConfig
    exclude_input_in_output: bool = True
    cancellation_check_period_s: float = 0.1
    # False where several versions of the model are loaded at once (a canary repository): the 2.51 Python backend
    # crashes when a model with several loaded versions uses the metric API (docs/canary.md); the router then
    # publishes the per-version figures.
    publish_metrics: bool = True
    tenancy: TenancyConfig = field(default_factory=TenancyConfig)
    # Unsafe (the anchor's behaviour): a `stop` without request_key ends the requests of its Triton request id,
    # which any client can send. Off: stop needs the request's request_key.
    stop_by_request_id: bool = False
    # CPUs the engine's step thread (and its OpenMP threads) runs on; None: anywhere. The launcher keeps
    # tritonserver off them (backend/serving/cpu_placement.py).
    engine_cpus: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if not self.cancellation_check_period_s > 0:
            raise ValueError("cancellation_check_period_ms must be a positive number of milliseconds, got "
                             f"{self.cancellation_check_period_s * 1000:g}")
        if self.engine_cpus is not None:
            check_engine_threads(self.engine_cpus, self.engine.num_threads)

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "ServingConfig":
        return cls(
            engine_dir=Path(p.required("gpt_model_path", "the checkpoint or engine directory")),
            engine=engine_config(p),
            exclude_input_in_output=p.flag("exclude_input_in_output", True),
            cancellation_check_period_s=p.integer("cancellation_check_period_ms", 100) / 1000.0,
            publish_metrics=p.flag("publish_engine_metrics", True),
            tenancy=TenancyConfig(limits_file=p.path("limits_file"),
                                  tenant_header=p.text("tenant_header", TenancyConfig.tenant_header)),
            stop_by_request_id=p.flag("stop_by_request_id", False),
            engine_cpus=parse_cpu_list(p.text("engine_cpus")) if p.has("engine_cpus") else None,
        )


@dataclass(frozen=True)
class PreprocessingConfig:
    tokenizer_dir: Path
    add_special_tokens: bool = False
    max_prompt_bytes: int | None = None  # text_input over this is refused before tokenizing

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "PreprocessingConfig":
        return cls(tokenizer_dir=Path(p.required("tokenizer_dir", "the HF tokenizer files")),
                   add_special_tokens=p.flag("add_special_tokens", False),
                   max_prompt_bytes=p.integer("max_prompt_bytes", None))


@dataclass(frozen=True)
class PostprocessingConfig:
    tokenizer_dir: Path
    stop_model: str = "tensorrt_llm"  # where `stop` goes: the LLM model (its version given by SERVED_VERSION)

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "PostprocessingConfig":
        return cls(tokenizer_dir=Path(p.required("tokenizer_dir", "the HF tokenizer files")),
                   stop_model=p.text("stop_model", "tensorrt_llm"))


@dataclass(frozen=True)
class RouterConfig:
    llm_model: str
    routing_file: Path

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "RouterConfig":
        return cls(llm_model=p.required("llm_model", "the model whose versions the router serves"),
                   routing_file=Path(p.required("routing_file", "the routing table file")))
