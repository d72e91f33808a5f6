"""EngineConfig from the tensorrt_llm model's config.pbtxt parameters (string values, as the anchor's)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from backend.config import EngineConfig, SchedulerPolicy


def _flag(value: str, name: str, default: bool) -> bool:
    if not value.strip():
        return default  # unset, or an unrendered ${...} placeholder
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"parameter {name} must be true or false, got {value!r}")


def _int_or_none(value: str) -> int | None:
    return int(value) if value.strip() else None


@dataclass(frozen=True)
class ServingConfig:
    engine_dir: Path
    engine: EngineConfig
    exclude_input_in_output: bool
    cancellation_check_period_s: float
    # False where several versions of the model are loaded at once (a canary repository): the 2.51 Python backend
    # crashes when a model with several loaded versions uses the metric API (docs/canary.md); the router then
    # publishes the per-version figures.
    publish_metrics: bool = True

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> "ServingConfig":
        """params: config.pbtxt parameters, key -> string_value; unrendered ${...} placeholders count as unset."""
        p = {k: ("" if v.startswith("${") else v) for k, v in params.items()}
        if not p.get("gpt_model_path"):
            raise ValueError("parameter gpt_model_path (the checkpoint or engine directory) is required")
        engine = EngineConfig(
            max_batch_size=int(p.get("max_batch_size") or 16),
            max_num_tokens=int(p.get("max_num_tokens") or 2048),
            max_input_len=int(p.get("max_input_len") or 1024),
            max_seq_len=int(p.get("max_seq_len") or 2048),
            tokens_per_block=int(p.get("tokens_per_block") or 32),
            max_tokens_in_paged_kv_cache=_int_or_none(p.get("max_tokens_in_paged_kv_cache", "")),
            kv_cache_free_mem_fraction=float(p.get("kv_cache_free_gpu_mem_fraction") or 0.9),
            policy=SchedulerPolicy(p.get("batch_scheduler_policy") or "guaranteed_no_evict"),
            enable_chunked_context=_flag(p.get("enable_chunked_context", ""), "enable_chunked_context", True),
            enable_kv_cache_reuse=_flag(p.get("enable_kv_cache_reuse", ""), "enable_kv_cache_reuse", False),
            device=p.get("engine_device") or "auto",
            num_threads=_int_or_none(p.get("engine_threads", "")),
        )
        return cls(
            engine_dir=Path(p["gpt_model_path"]),
            engine=engine,
            exclude_input_in_output=_flag(p.get("exclude_input_in_output", ""), "exclude_input_in_output", True),
            cancellation_check_period_s=int(p.get("cancellation_check_period_ms") or 100) / 1000.0,
            publish_metrics=_flag(p.get("publish_engine_metrics", ""), "publish_engine_metrics", True),
        )
