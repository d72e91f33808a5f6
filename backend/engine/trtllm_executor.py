"""Serve a TensorRT-LLM engine dir (config.json + rank{N}.engine from trtllm-build) through
tensorrt_llm.bindings.executor: TensorRT-LLM's own in-flight batching, paged KV cache and KV block reuse.

TrtllmExecutorEngine has the engine interface the Triton adapter and EngineLoop use (validate, add_request, abort,
step, has_work, stats, close), so a model version whose folder serves an engine dir runs on it, and one that
serves a checkpoint runs on LLMEngine (see `is_engine_dir`). The mapping from our config and requests to the
executor's objects is plain data (executor_settings, request_settings) and unit-tested without tensorrt_llm;
only the class below imports it. Every request is streamed from the executor (new tokens each step), as
LLMEngine emits them; triton_io decides what the client sees.
"""
from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from pathlib import Path

from backend.engine.config import EngineConfig, SchedulerPolicy
from backend.engine.interface import RequestOutput
from backend.engine.sequence import FinishReason, Request
from backend.engine.stats import EngineStats
from backend.errors import InvalidRequestError

ENGINE_GLOB = "rank*.engine"
AWAIT_MS = 5  # how long one step() waits for responses: short, so the engine loop sees cancellations promptly
# The executor's FinishReason names -> ours.
FINISH_REASONS = {"END_ID": FinishReason.END_ID, "STOP_WORDS": FinishReason.STOP_WORD,
                  "LENGTH": FinishReason.LENGTH, "CANCELLED": FinishReason.CANCELLED,
                  "TIMED_OUT": FinishReason.CANCELLED}


@dataclass
class InFlight:
    """One of our requests while the executor runs it."""

    request: Request
    executor_id: int  # the executor's id for it
    num_output_tokens: int = 0  # generated so far


def is_engine_dir(path: Path) -> bool:
    """A trtllm-build output (rank*.engine files), as opposed to a checkpoint (rank*.safetensors)."""
    return any(Path(path).glob(ENGINE_GLOB))


def attention_windows(pretrained_config: dict, max_seq_len: int) -> list[int] | None:
    """KvCacheConfig.max_attention_window for a checkpoint's sliding layers (our sliding_window / layer_types keys):
    one entry per layer, the window or max_seq_len (TensorRT-LLM applies windows only at run time); None without."""
    window, types = pretrained_config.get("sliding_window"), pretrained_config.get("layer_types")
    if window is None or not types or "sliding_attention" not in types:
        return None
    return [min(window, max_seq_len) if t == "sliding_attention" else max_seq_len for t in types]


def executor_settings(cfg: EngineConfig, windows: list[int] | None = None) -> dict:
    """ExecutorConfig's arguments (nested: scheduler_config, kv_cache_config) from the engine config, and the
    per-layer attention windows (attention_windows) when the model slides."""
    policy = "GUARANTEED_NO_EVICT" if cfg.policy is SchedulerPolicy.GUARANTEED_NO_EVICT else "MAX_UTILIZATION"
    kv_cache = {"enable_block_reuse": cfg.enable_kv_cache_reuse, "max_tokens": cfg.max_tokens_in_paged_kv_cache,
                "free_gpu_memory_fraction": cfg.kv_cache_free_mem_fraction}
    if windows is not None:
        kv_cache["max_attention_window"] = windows
    return {
        "max_beam_width": 1,
        "max_batch_size": cfg.max_batch_size,
        "max_num_tokens": cfg.max_num_tokens,
        "enable_chunked_context": cfg.enable_chunked_context,
        "scheduler_config": {"capacity_scheduler_policy": policy},
        "kv_cache_config": kv_cache,
    }


def request_settings(request: Request) -> dict:
    """executor.Request's arguments (nested: sampling_config, output_config) for one of our requests."""
    s = request.sampling
    sampling = {"beam_width": 1, "seed": s.seed, "min_tokens": s.min_tokens or None,
                "repetition_penalty": s.repetition_penalty if s.repetition_penalty != 1.0 else None,
                "presence_penalty": s.presence_penalty or None, "frequency_penalty": s.frequency_penalty or None}
    if s.greedy:
        sampling["top_k"] = 1  # TensorRT-LLM's greedy
    else:
        sampling.update(top_k=s.top_k or None, top_p=s.top_p, temperature=s.temperature)
    return {
        "input_token_ids": list(request.prompt_ids),
        "max_tokens": s.max_tokens,
        "streaming": True,
        "end_id": s.end_id,
        "stop_words": [list(w) for w in s.stop_words] or None,
        "bad_words": [list(w) for w in s.bad_words] or None,
        "sampling_config": {k: v for k, v in sampling.items() if v is not None},
        "output_config": {"return_log_probs": s.return_log_probs, "exclude_input_from_output": True},
    }


def _executor_module():
    try:
        import tensorrt_llm.bindings.executor as trtllm
    except Exception as exc:
        raise RuntimeError(f"this model version serves a TensorRT-LLM engine (rank*.engine), which needs "
                           f"tensorrt_llm 1.2.x and a GPU ({type(exc).__name__}: {exc}); serve it from the "
                           f"Dockerfile's gpu image, or install a torch-target build of the model here") from None
    return trtllm


class TrtllmExecutorEngine:
    def __init__(self, engine_dir: Path, config: EngineConfig) -> None:
        self.trtllm = trtllm = _executor_module()
        self.config = config
        engine_config = json.loads((Path(engine_dir) / "config.json").read_text())
        s = executor_settings(config, attention_windows(engine_config.get("pretrained_config", {}), config.max_seq_len))
        policy = getattr(trtllm.CapacitySchedulerPolicy, s["scheduler_config"]["capacity_scheduler_policy"])
        exec_config = trtllm.ExecutorConfig(
            max_beam_width=1, scheduler_config=trtllm.SchedulerConfig(capacity_scheduler_policy=policy),
            kv_cache_config=trtllm.KvCacheConfig(**s["kv_cache_config"]),
            enable_chunked_context=s["enable_chunked_context"], max_batch_size=s["max_batch_size"],
            max_num_tokens=s["max_num_tokens"])
        self.executor = trtllm.Executor(Path(engine_dir), trtllm.ModelType.DECODER_ONLY, exec_config)
        self.by_executor_id: dict[int, InFlight] = {}
        self.by_request_id: dict[str, InFlight] = {}
        self.iterations = 0

    def validate(self, request: Request) -> None:
        n, cfg = len(request.prompt_ids), self.config
        if n == 0 or n > cfg.max_input_len:
            raise InvalidRequestError(f"the prompt has {n} tokens; it must have 1 to max_input_len "
                                      f"({cfg.max_input_len})")
        if n + request.sampling.max_tokens > cfg.max_seq_len:
            raise InvalidRequestError(f"prompt ({n} tokens) + max_tokens ({request.sampling.max_tokens}) exceeds "
                                      f"max_seq_len ({cfg.max_seq_len})")
        if request.request_id in self.by_request_id:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in flight")
        if request.sampling.num_top_log_probs:
            raise InvalidRequestError("num_top_log_probs is not supported by the TensorRT-LLM executor engine "
                                      "(its executor returns the sampled tokens' log-probs only)")

    def add_request(self, request: Request) -> None:
        self.validate(request)
        r = request_settings(request)
        r["sampling_config"] = self.trtllm.SamplingConfig(**r["sampling_config"])
        r["output_config"] = self.trtllm.OutputConfig(**r["output_config"])
        entry = InFlight(request, self.executor.enqueue_request(self.trtllm.Request(**r)))
        self.by_executor_id[entry.executor_id] = self.by_request_id[request.request_id] = entry

    def abort(self, request_id: str) -> RequestOutput | None:
        entry = self.by_request_id.get(request_id)
        if entry is None:
            return None
        self.executor.cancel_request(entry.executor_id)
        self._forget(entry)
        return self._output(entry, [], [], True, FinishReason.CANCELLED)

    def has_work(self) -> bool:
        return bool(self.by_request_id)

    def step(self) -> list[RequestOutput]:
        outputs = []
        for response in self.executor.await_responses(datetime.timedelta(milliseconds=AWAIT_MS)):
            entry = self.by_executor_id.get(response.request_id)
            if entry is None:
                continue  # cancelled by us already
            if response.has_error():
                self._forget(entry)
                raise RuntimeError(f"TensorRT-LLM executor failed request {entry.request.request_id}: "
                                   f"{response.error_msg}")
            result = response.result
            new = list(result.output_token_ids[0])
            wants_lps = entry.request.sampling.return_log_probs
            lps = list(result.log_probs[0]) if wants_lps and result.log_probs else []
            entry.num_output_tokens += len(new)
            reason = None
            if result.is_final:
                reason = FINISH_REASONS.get(result.finish_reasons[0].name, FinishReason.LENGTH)
                self._forget(entry)
            outputs.append(self._output(entry, new, lps, result.is_final, reason))
        self.iterations += 1
        return outputs

    def stats(self) -> EngineStats:
        it = (self.executor.get_latest_iteration_stats() or [None])[-1]
        kv = getattr(it, "kv_cache_stats", None)
        ifb = getattr(it, "inflight_batching_stats", None)
        return EngineStats(
            active_requests=getattr(it, "num_active_requests", len(self.by_request_id)),
            max_requests=self.config.max_batch_size,
            scheduled_requests=getattr(ifb, "num_scheduled_requests", 0),
            context_requests=getattr(ifb, "num_context_requests", 0),
            waiting_requests=getattr(it, "num_queued_requests", 0),
            max_blocks=getattr(kv, "max_num_blocks", 0), free_blocks=getattr(kv, "free_num_blocks", 0),
            used_blocks=getattr(kv, "used_num_blocks", 0),
            tokens_per_block=getattr(kv, "tokens_per_block", self.config.tokens_per_block),
            reused_blocks=getattr(kv, "reused_blocks", 0), cached_blocks=0,
            total_context_tokens=getattr(ifb, "num_ctx_tokens", 0),
            generation_requests=getattr(ifb, "num_gen_requests", 0),
            paused_requests=getattr(ifb, "num_paused_requests", 0),
            iteration_counter=getattr(it, "iter", self.iterations), timestamp_us=time.time_ns() // 1000,
            prefix_cache_hit_rate=0.0)

    def close(self) -> None:
        self.executor.shutdown()

    def _forget(self, entry: InFlight) -> None:
        del self.by_executor_id[entry.executor_id], self.by_request_id[entry.request.request_id]

    def _output(self, entry: InFlight, new: list[int], lps: list[float], finished: bool,
                reason: FinishReason | None) -> RequestOutput:
        request = entry.request
        return RequestOutput(request_id=request.request_id, new_token_ids=new, new_log_probs=lps, finished=finished,
                             finish_reason=reason, num_input_tokens=len(request.prompt_ids),
                             num_output_tokens=entry.num_output_tokens)
