"""Our engine: step() = schedule -> run the model -> sample -> post-process -> emit, one line each."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.interface import PerfMetrics, RequestOutput
from backend.engine.memory_plan import free_memory_bytes, plan_kv_cache
from backend.engine.rope_regime import RopeRegime
from backend.engine.sampler import SampleResult, sample
from backend.engine.scheduler import Scheduler
from backend.engine.scheduler_output import SchedulerOutput
from backend.engine.sequence import Emitted, FinishReason, Request, SeqStatus, Sequence
from backend.engine.stats import EngineStats, StepSummary
from backend.engine.thread_governor import ThreadGovernor
from backend.errors import InvalidRequestError
from backend.model.config import ModelConfig, kv_window, load_model_config, position_limit, torch_dtype
from backend.model.features import DecoderFeatures
from backend.model.host_memory import retain_freed_memory
from backend.model.kernels.gemv import gemv_dtype, resolve_decode_gemv
from backend.model.loader import float32_growth, load_model, widened_bytes
from backend.model.parallel.driver import ParallelModelRunner
from backend.model.prepacked_linear import gemv_copy_bytes, resolve_linear_dtype, resolve_linear_kernel
from backend.model.runner import ModelRunner
from backend.model.step_inputs import StepInputs

log = logging.getLogger(__name__)


def _not_plain(cfg: ModelConfig) -> str | None:
    """Why this checkpoint's linears are not plain float ones in this process (None: they are)."""
    quant = cfg.quantization
    if quant.quantized:
        return f"the checkpoint is quantized ({quant.quant_algo}, KV cache {quant.kv_cache_quant_algo})"
    if cfg.mapping.world_size > 1:
        return f"the checkpoint is sharded ({cfg.mapping}): its ranks run torch's linears"
    return None


def _linear_dtype(ckpt_dir: Path, cfg: ModelConfig, config: EngineConfig, device: torch.device) -> torch.dtype | None:
    """EngineConfig.linear_dtype resolved for this checkpoint (None: the linears run in the checkpoint's dtype).
    "auto" takes bf16 linears beside float32 activations, or a widened float32 model, only where the KV cache keeps
    the capacity the checkpoint's dtype would give it: beside bf16 linears its rows stay bf16, but the embedding and
    the norms widen to float32; in a float32 model every tensor and K/V row widens."""
    if config.linear_dtype == "checkpoint" or (config.linear_kernel == "torch" and config.linear_dtype != "float32"):
        return None  # EngineConfig refuses an explicit "bfloat16" beside linear_kernel "torch"
    dtype = resolve_linear_dtype(config.linear_dtype, device, torch_dtype(cfg), _not_plain(cfg))
    if dtype is None or config.linear_dtype != "auto":
        return dtype
    free = free_memory_bytes(device) - (Path(ckpt_dir) / "rank0.safetensors").stat().st_size
    if dtype == torch.float32:
        wide_cfg, grown, what = dataclasses.replace(cfg, dtype="float32"), float32_growth(ckpt_dir), "model"
    else:
        wide_cfg, grown, what = cfg, widened_bytes(cfg, ckpt_dir), "embedding and norms"
    try:
        own = plan_kv_cache(cfg, config, free).tokens
        wide = plan_kv_cache(wide_cfg, config, free - grown).tokens
    except ValueError:  # not even one sequence fits one way: keep the checkpoint's dtype (its own refusal follows)
        return None
    if wide < own:
        log.info("linear_dtype 'auto' keeps %s linears: a float32 %s would leave the KV cache %d tokens, not %d",
                 cfg.dtype, what, wide, own)
        return None
    return dtype


def _gemv_copy_bytes(model: torch.nn.Module | None, kv_cfg: ModelConfig, config: EngineConfig,
                     linear_dtype: torch.dtype | None, device: torch.device, free: int) -> int | None:
    """The bytes of the GEMV's weight copies where EngineConfig.decode_gemv resolves to on for this model,
    None where it is off. "auto" takes the GEMV only where the KV cache, planned with the copies in memory, holds
    what it would hold without them (the copies take the linears' weight bytes again, half of them where bf16 holds
    a float32 linear's weights exactly: kernels/gemv.py's copy_bytes)."""
    if model is None:
        return None
    model_dtype = torch_dtype(model.config)
    onednn = resolve_linear_kernel(config.linear_kernel, device, model_dtype) == "onednn"
    if not resolve_decode_gemv(config.decode_gemv, device, gemv_dtype(linear_dtype, model_dtype), onednn):
        return None
    copy = gemv_copy_bytes(model, linear_dtype)
    if config.decode_gemv == "on":
        return copy
    try:
        own = plan_kv_cache(kv_cfg, config, free).tokens
        less = plan_kv_cache(kv_cfg, config, free - copy).tokens
    except ValueError:  # not even one sequence fits one way: no copy (the plan's own refusal follows, if any)
        return None
    if less < own:
        log.info("decode_gemv 'auto' is off: its weight copies (%d MiB) would leave the KV cache %d tokens, not %d",
                 copy >> 20, less, own)
        return None
    return copy


class LLMEngine:
    def __init__(self, ckpt_dir: Path, config: EngineConfig) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        retain_freed_memory()  # a step's transient tensors reuse the last step's pages (backend/model/host_memory.py)
        log.info("%d torch threads, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s (backend/__init__.py)",
                 torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
        self.config = config
        self.device = torch.device(config.device)
        cfg = load_model_config(ckpt_dir)
        linear_dtype = _linear_dtype(ckpt_dir, cfg, config, self.device)
        # K/V rows in the linears' dtype (runner.KVCache): bf16 linears keep a bf16 KV cache
        kv_cfg = (cfg if linear_dtype is None
                  else dataclasses.replace(cfg, dtype=str(linear_dtype).removeprefix("torch.")))
        if linear_dtype is not None:  # bf16 linears beside float32 activations: the rest of the model in float32
            log.info("linear_dtype %r: the %s checkpoint runs %s", config.linear_dtype, cfg.dtype,
                     "in float32, its weights widened (exact)" if linear_dtype == torch.float32
                     else "bf16 linears beside float32 activations")
            cfg = dataclasses.replace(cfg, dtype="float32")
        self.model_config = cfg
        limit = position_limit(cfg)
        if limit is not None and config.max_seq_len > limit:
            raise ValueError(f"max_seq_len ({config.max_seq_len}) exceeds the model's max_position_embeddings ({limit})")
        # A sharded checkpoint runs on one process per rank (backend/model/parallel/): no whole model in this one.
        model = None if cfg.mapping.world_size > 1 else load_model(ckpt_dir, self.device, linear_dtype)
        if linear_dtype == torch.float32:  # a float32 model from here on: its linears in its own dtype
            linear_dtype = None
        free = free_memory_bytes(self.device)
        copy = _gemv_copy_bytes(model, kv_cfg, config, linear_dtype, self.device, free)  # None: no GEMV
        self.kv_plan = plan_kv_cache(kv_cfg, config, free - (copy or 0))
        log.info("%s; 2 x %d layers x %d kv heads x %d dims x %s", self.kv_plan.describe(), cfg.num_hidden_layers,
                 cfg.num_key_value_heads, cfg.head_size, kv_cfg.dtype)
        self.blocks = BlockManager(self.kv_plan.blocks, config.tokens_per_block, config.enable_kv_cache_reuse,
                                   window=kv_window(cfg), max_chunk_tokens=config.max_num_tokens,
                                   regime=rope_regime(cfg))
        num_blocks, block_size = self.blocks.num_blocks, self.blocks.block_size
        if model is None and config.linear_kernel == "onednn":
            raise ValueError("linear_kernel 'onednn' is not implemented for a sharded checkpoint (tensor or pipeline "
                             "parallel ranks run torch's linears): use 'auto' or 'torch'")
        if model is None and config.attention_kernel == "paged":
            raise ValueError("attention_kernel 'paged' is not implemented for a sharded checkpoint (tensor or pipeline "
                             "parallel ranks gather and run SDPA): use 'auto' or 'torch'")
        if model is None and config.decode_layers == "native":
            raise ValueError("decode_layers 'native' is not implemented for a sharded checkpoint (tensor or pipeline "
                             "parallel ranks run the Python layers): use 'auto' or 'python'")
        if model is None and config.decode_gemv == "on":
            raise ValueError("decode_gemv 'on' is not implemented for a sharded checkpoint (tensor or pipeline "
                             "parallel ranks run torch's linears): use 'auto' or 'off'")
        if model is None and config.cuda_graph_mode == "on":
            raise ValueError("cuda_graph_mode 'on' is not implemented for a sharded checkpoint (tensor or pipeline "
                             "parallel ranks run eagerly): use 'auto' or 'off'")
        self.runner = (ModelRunner(model, num_blocks, block_size, self.device, config.linear_kernel,
                                   config.attention_kernel, config.decode_layers, linear_dtype,
                                   config.cuda_graph_mode, "off" if copy is None else "on")
                       if model is not None else ParallelModelRunner(ckpt_dir, cfg, num_blocks, block_size, self.device,
                                                config.num_threads or 1))
        self.scheduler = Scheduler(config, self.blocks)
        # Sharded ranks run in their own processes with their own threads; CUDA steps do not use torch's CPU threads.
        adaptive = config.adaptive_threads and model is not None and self.device.type == "cpu"
        self.governor = ThreadGovernor(torch.get_num_threads(), torch.set_num_threads) if adaptive else None
        self.sequences: dict[str, Sequence] = {}
        self.iterations = 0
        self.last_step = StepSummary()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def close(self) -> None:
        """Release what outlives the object (a parallel engine's worker processes)."""
        self.runner.close()

    def validate(self, request: Request) -> None:
        """Refuse at admission what could never run (raises InvalidRequestError naming the limit)."""
        n, cfg = len(request.prompt_ids), self.config
        if n == 0:
            raise InvalidRequestError("the prompt is empty: at least one input token is needed")
        if n > cfg.max_input_len:
            raise InvalidRequestError(f"the prompt has {n} tokens, more than max_input_len ({cfg.max_input_len})")
        if request.sampling.max_tokens > cfg.max_output_len:
            raise InvalidRequestError(
                f"max_tokens ({request.sampling.max_tokens}) exceeds max_output_len ({cfg.max_output_len})"
            )
        # The KV plan holds at least one max_seq_len sequence: within max_seq_len, a request can always run.
        if n + request.sampling.max_tokens > cfg.max_seq_len:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_tokens ({request.sampling.max_tokens}) exceeds max_seq_len ({cfg.max_seq_len})"
            )
        self._check_vocab("input token ids", request.prompt_ids)
        # The sampler indexes logits with these: an id outside the vocabulary would fail the whole batch's step.
        sampling = request.sampling
        self._check_vocab("end_id", [] if sampling.end_id is None else [sampling.end_id])
        self._check_vocab("pad_id", [] if sampling.pad_id is None else [sampling.pad_id])
        self._check_vocab("stop word ids", [t for w in sampling.stop_words for t in w])
        self._check_vocab("bad word ids", [t for w in sampling.bad_words for t in w])
        if request.request_id in self.sequences:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in flight")

    def _check_vocab(self, what: str, ids: Iterable[int]) -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"{what} {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")

    def add_request(self, request: Request) -> None:
        self.validate(request)
        if not request.arrival_time_ns:
            request = dataclasses.replace(request, arrival_time_ns=time.time_ns())
        seq = Sequence.from_request(request)
        self.sequences[request.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.CANCELLED
        return self._output(seq, seq.take_emittable())

    def _fail(self, seq: Sequence, message: str) -> RequestOutput:
        """End seq with an error, freeing what it holds: the engine stays consistent for every other request."""
        self.sequences.pop(seq.request_id, None)
        self.scheduler.finish(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.ERROR
        return dataclasses.replace(self._output(seq, Emitted([], [], [])), error=message)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            self.last_step = StepSummary()
            return []
        inputs = self._step_inputs(batch)
        began = self._govern(len(batch), len(inputs.tokens))
        try:
            logits = self.runner.run(inputs)
        except Exception as exc:  # noqa: BLE001 -- the batch's requests fail; the engine and the others go on
            log.exception("model forward failed: failing the %d requests of this step", len(batch))
            return [self._fail(item.seq, f"model forward failed: {exc}") for item in batch]
        sampled = sample(logits, batch.sampling)
        if self.governor is not None:
            self.governor.end(time.perf_counter() - began)
        self._postprocess(batch)
        return self._emit(batch.sampling, sampled)

    def _govern(self, sequences: int, tokens: int) -> float:
        """Set this step's thread count (backend/engine/thread_governor.py); the time the step starts."""
        if self.governor is not None:
            self.governor.begin((sequences, tokens))
        return time.perf_counter()

    def _step_inputs(self, batch: SchedulerOutput) -> StepInputs:
        """The model's view of the batch (token ids, positions, KV slots); stamps the step's bookkeeping."""
        self.iterations += 1
        self.last_step = StepSummary(len(batch), len(batch.context), batch.num_context_tokens)
        now = time.time_ns()
        for item in batch:
            item.seq.first_scheduled_time_ns = item.seq.first_scheduled_time_ns or now
        seqs = [item.seq for item in batch]
        ends = [item.end for item in batch]
        firsts = [self.blocks.first_live_position(item.start) for item in batch]
        # (6, B): one tensor for the per-sequence columns, each row contiguous (torch.tensor costs ~6 us a call)
        per_seq = torch.tensor([[item.start for item in batch], ends, [int(item.samples) for item in batch], firsts,
                                [seq.num_prompt_tokens for seq in seqs], [seq.num_tokens for seq in seqs]])
        start, end, sampled, ctx_start, prompt_len, total_len = per_seq.unbind()
        return StepInputs(
            tokens=torch.tensor([t for item in batch for t in item.seq.token_ids[item.start : item.end]]),
            start=start,
            end=end,
            sampled=sampled,
            context_slots=self.blocks.slots(seqs, ends, firsts),
            ctx_start=ctx_start,
            prompt_len=prompt_len,
            total_len=total_len,
        )

    def _postprocess(self, batch: SchedulerOutput) -> None:
        """The step's tokens are in the KV cache now: advance each sequence, index its full blocks for reuse, and
        release those no sliding window reaches any more."""
        for item in batch:
            item.seq.num_computed_tokens = item.end
            self.blocks.register_full_blocks(item.seq)
            self.blocks.release_outside_window(item.seq)

    def _emit(self, seqs: list[Sequence], sampled: list[SampleResult]) -> list[RequestOutput]:
        """Append each sampled token, finish what ended, and hand out what may be shown."""
        outputs = []
        now = time.time_ns()
        for seq, result in zip(seqs, sampled):
            if result.error is not None:  # this row alone failed (backend/engine/sampler.py)
                outputs.append(self._fail(seq, result.error))
                continue
            seq.first_token_time_ns = seq.first_token_time_ns or now
            seq.last_token_time_ns = now
            seq.append(result.token, result.log_prob, result.top)
            emitted = seq.take_emittable()
            if seq.status is SeqStatus.FINISHED:
                self.scheduler.finish(seq)
                del self.sequences[seq.request_id]
            outputs.append(self._output(seq, emitted))
        return outputs

    def _output(self, seq: Sequence, emitted: Emitted) -> RequestOutput:
        cum = sum(seq.output_log_probs) if seq.request.sampling.return_log_probs else None
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=emitted.token_ids,
            new_log_probs=emitted.log_probs,
            new_top_log_probs=emitted.top_log_probs,
            finished=seq.status is SeqStatus.FINISHED,
            finish_reason=seq.finish_reason,
            num_input_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            cum_log_prob=cum,
            perf=PerfMetrics(
                kv_cache_alloc_new_blocks=seq.new_blocks,
                kv_cache_reused_blocks=seq.reused_blocks,
                kv_cache_alloc_total_blocks=seq.new_blocks + seq.reused_blocks,
                arrival_time_ns=seq.request.arrival_time_ns,
                first_scheduled_time_ns=seq.first_scheduled_time_ns,
                first_token_time_ns=seq.first_token_time_ns,
                last_token_time_ns=seq.last_token_time_ns,
            ),
        )

    def stats(self) -> EngineStats:
        blocks, last = self.blocks, self.last_step
        return EngineStats(
            active_requests=self.scheduler.num_running,
            max_requests=self.config.max_batch_size,
            scheduled_requests=last.scheduled,
            context_requests=last.context,
            waiting_requests=self.scheduler.num_waiting,
            max_blocks=blocks.num_blocks,
            free_blocks=blocks.num_free_blocks,
            used_blocks=blocks.num_used_blocks,
            tokens_per_block=blocks.block_size,
            reused_blocks=blocks.prefix_hits,
            cached_blocks=blocks.num_cached_blocks,
            total_context_tokens=last.context_tokens,
            generation_requests=last.scheduled - last.context,
            paused_requests=self.scheduler.num_preempted,
            iteration_counter=self.iterations,
            timestamp_us=time.time_ns() // 1000,
            prefix_cache_hit_rate=blocks.prefix_hit_rate,
        )

    def generate(self, requests: list[Request]) -> dict[str, list[int]]:
        """Run requests to completion in-process (tests, benchmarks): request id -> output token ids."""
        for r in requests:
            self.add_request(r)
        out: dict[str, list[int]] = {r.request_id: [] for r in requests}
        while self.has_work():
            for o in self.step():
                out[o.request_id].extend(o.new_token_ids)
        return out


def rope_regime(cfg: ModelConfig) -> RopeRegime:
    """The prefix cache's and scheduler's view of the model's rotary embedding (backend/engine/rope_regime.py)."""
    rope = DecoderFeatures.of(cfg).rope
    if rope.kind == "dynamic":
        return RopeRegime("dynamic", rope.max_positions)
    if rope.kind == "longrope":
        return RopeRegime("longrope", rope.params["original_max_position_embeddings"])
    return RopeRegime()
