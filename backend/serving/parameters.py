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
# The Python backend's own model parameters (read by Triton, not by our models).
_BACKEND_PARAMETERS = frozenset({"EXECUTION_ENV_PATH", "FORCE_CPU_ONLY_INPUT_TENSORS"})


class ModelParameters:
    """config.pbtxt parameters of one model, typed on read."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = {k: v.strip() for k, v in values.items() if v.strip() and not v.strip().startswith("${")}
        self._read: set[str] = set()  # names asked for: refuse_unread() refuses the others

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any]) -> "ModelParameters":
        """From the model config Triton passes to initialize() (args["model_config"], parsed)."""
        params = model_config.get("parameters", {}) or {}
        return cls({k: str(v.get("string_value", "")) for k, v in params.items()})

    def _get(self, name: str) -> str | None:
        """The value set for name, if any; every reader goes through here, so that name counts as read."""
        self._read.add(name)
        return self._values.get(name)

    def has(self, name: str) -> bool:
        return self._get(name) is not None

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self._get(name)
        return default if value is None else value

    def required(self, name: str, what: str) -> str:
        value = self._get(name)
        if value is None:
            raise ValueError(f"parameter {name} ({what}) is required")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self._get(name)
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
        value = self._get(name)
        if value is None:
            return default
        try:
            return cast(value)
        except ValueError:
            raise ValueError(f"parameter {name} must be {what}, got {value!r}") from None

    def path(self, name: str) -> Path | None:
        value = self._get(name)
        return Path(value) if value is not None else None

    def refuse_unread(self, model: str) -> None:
        """Nothing set in a config.pbtxt is silently ignored: once a model has read its parameters, one with a value
        that it never asked for (another backend's, e.g. tensorrtllm_backend's normalize_log_probs, or a typo) fails
        the load, naming it. Unset, empty and unrendered ${...} ones are fine."""
        unread = sorted(set(self._values) - self._read - _BACKEND_PARAMETERS)
        if unread:
            named = ", ".join(f"{k}={self._values[k]!r}" for k in unread)
            raise ValueError(f"{model}: config.pbtxt parameter(s) {named} not supported by this model (nothing here "
                             "reads them): remove them or leave them empty")


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


# tensorrtllm_backend parameters whose only values here are what this engine does: accepted at those, refused
# (naming the parameter) otherwise.
_ANCHOR_CONSTANTS = {
    "max_beam_width": (("1",), "beam search is not supported"),
    "gpt_model_type": (("inflight_fused_batching", "inflight_batching"), "requests are always batched in flight"),
}


def check_anchor_constants(p: ModelParameters) -> None:
    for name, (allowed, why) in _ANCHOR_CONSTANTS.items():
        value = p.text(name)
        if value is not None and value.lower() not in allowed:
            raise ValueError(f"parameter {name} must be {' or '.join(allowed)} ({why}), got {value!r}")


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
    # Streamed responses carry at least this many new tokens (vLLM's --stream-interval): each response costs a send,
    # and in the ensemble a postprocessing execution, whatever it holds. The first and the last response of a row
    # go out at once; 1 sends every token as soon as it is made (backend/serving/triton_io.py's RowStream).
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (tokens per streamed response), got {self.stream_interval}")
        if not self.cancellation_check_period_s > 0:
            raise ValueError("cancellation_check_period_ms must be a positive number of milliseconds, got "
                             f"{self.cancellation_check_period_s * 1000:g}")
        if self.engine_cpus is not None:
            check_engine_threads(self.engine_cpus, self.engine.num_threads)

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "ServingConfig":
        check_anchor_constants(p)
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
            stream_interval=p.integer("stream_interval", cls.stream_interval),
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
class BlsConfig:
    """tensorrt_llm_bls: preprocessing's parameters, the LLM model it calls and where `stop` goes."""

    pre: PreprocessingConfig
    llm_model: str = "tensorrt_llm"
    stop_model: str = "tensorrt_llm"  # the canary router's repository: the LLM model itself, by served version
    skip_special_tokens: bool = True  # as postprocessing's

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "BlsConfig":
        llm = p.text("tensorrt_llm_model_name", cls.llm_model)
        return cls(pre=PreprocessingConfig.from_parameters(p), llm_model=llm, stop_model=p.text("stop_model", llm),
                   skip_special_tokens=p.flag("skip_special_tokens", cls.skip_special_tokens))


@dataclass(frozen=True)
class PostprocessingConfig:
    tokenizer_dir: Path
    stop_model: str = "tensorrt_llm"  # where `stop` goes: the LLM model (its version given by SERVED_VERSION)
    # The anchor's postprocessing parameter: special tokens (a chat template's markers) left out of the text.
    skip_special_tokens: bool = True

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "PostprocessingConfig":
        return cls(tokenizer_dir=Path(p.required("tokenizer_dir", "the HF tokenizer files")),
                   stop_model=p.text("stop_model", cls.stop_model),
                   skip_special_tokens=p.flag("skip_special_tokens", cls.skip_special_tokens))


@dataclass(frozen=True)
class RouterConfig:
    llm_model: str
    routing_file: Path

    @classmethod
    def from_parameters(cls, p: ModelParameters) -> "RouterConfig":
        return cls(llm_model=p.required("llm_model", "the model whose versions the router serves"),
                   routing_file=Path(p.required("routing_file", "the routing table file")))


ModelConfig = ServingConfig | PreprocessingConfig | BlsConfig | PostprocessingConfig | RouterConfig
# The config each of our Triton models reads its parameters into, by the model's role (its folder under
# model_repository/; a repository may serve it under another name).
CONFIG_OF: dict[str, type] = {"tensorrt_llm": ServingConfig, "preprocessing": PreprocessingConfig,
                              "postprocessing": PostprocessingConfig, "tensorrt_llm_bls": BlsConfig,
                              "router": RouterConfig}


def read_model_config(model_config: Mapping[str, Any], model_name: str, role: str) -> ModelConfig:
    """What a model's initialize() reads: its parameters into CONFIG_OF[role], then any parameter it did not read
    refused, naming the model (model_config: args["model_config"], parsed; model_name: args["model_name"])."""
    params = ModelParameters.from_model_config(model_config)
    config = CONFIG_OF[role].from_parameters(params)
    params.refuse_unread(model_name)
    return config
