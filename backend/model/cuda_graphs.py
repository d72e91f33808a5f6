"""CUDA graphs of decode steps: one graph captured per (batch, context) bucket, replayed with each step's inputs
copied into its static buffers.

On CUDA a small model's decode step is bound by the CPU launching its kernels, not by the GPU (perf/CUDA.md: the
1B model at batch 64 in bf16, 10.4 ms a step of which the GPU is busy 2.3 ms, ~520 launches). A replay launches the
whole step at once. Only decode steps (every sequence one new token) replay; prefill chunks run eagerly.

A step is padded to its bucket: its B sequences to the next batch bucket (1, 2, 4, 8, then multiples of 8), its
context width L to its bucket (context_bucket: at most ~25 % more columns). A padded sequence is one token at
position 0 whose K/V go to the scratch slot (a row past the blocks the block manager hands out: KVCache's
scratch_rows) and which attends to that slot alone; padded context columns are masked. Real rows compute what they
would unpadded, up to the rounding of kernels chosen for other shapes (perf/CUDA.md compares the tokens with HF's).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import torch

from backend.kernel_choices import CUDA_GRAPH_MODES
from backend.model.decoder import AttentionMetadata
from backend.model.step_inputs import StepInputs

log = logging.getLogger(__name__)

MIN_CONTEXT = 64  # smallest context bucket: fewer graphs for short contexts, little padded attention work

# StepInputs -> (input_ids (T,), metadata, logits_index (S,)) on the device: the runner's step_tensors
StepBuilder = Callable[[StepInputs], tuple[torch.Tensor, AttentionMetadata, torch.Tensor]]
# (input_ids, metadata, logits_index) -> (S, vocab) float32 logits: the model's forward over the KV pools
Forward = Callable[[torch.Tensor, AttentionMetadata, torch.Tensor], torch.Tensor]


def batch_bucket(batch: int) -> int:
    """The padded batch of a step of `batch` sequences: 1, 2, 4, 8, then the next multiple of 8."""
    if batch <= 8:
        return 1 << (batch - 1).bit_length()
    return -(-batch // 8) * 8


def context_bucket(width: int) -> int:
    """The padded context width: at least MIN_CONTEXT, else the next multiple of an eighth of the power of two
    above it (four buckets per doubling: at most ~25 % padded columns; powers of two padded up to 2x and made the
    1B model's float32 batch-64 step slower with graphs than without, perf/CUDA.md)."""
    if width <= MIN_CONTEXT:
        return MIN_CONTEXT
    step = 1 << ((width - 1).bit_length() - 3)
    return -(-width // step) * step


def pad_decode_step(inputs: StepInputs, batch: int, width: int, scratch_slot: int) -> StepInputs:
    """The decode step padded to `batch` sequences and `width` context columns. Added sequences: token 0 at position
    0, its K/V written to and read from scratch_slot only, not sampled; added columns lie past every context's end,
    so the masks hide them."""
    B, L = inputs.context_slots.shape
    if batch < B or width < L:
        raise ValueError(f"a step of {B} sequences x {L} context columns does not fit the bucket {batch} x {width}")
    slots = torch.zeros(batch, width, dtype=inputs.context_slots.dtype)
    slots[:B, :L] = inputs.context_slots
    slots[B:, 0] = scratch_slot

    def pad(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat((t, t.new_full((batch - B,), fill)))

    return StepInputs(tokens=pad(inputs.tokens, 0), start=pad(inputs.start, 0), end=pad(inputs.end, 1),
                      sampled=pad(inputs.sampled, 0), context_slots=slots, ctx_start=pad(inputs.ctx_start, 0),
                      prompt_len=pad(inputs.prompt_len, 1), total_len=pad(inputs.total_len, 1))


# The decode metadata's tensor fields a graph owns copies of (besides the masks): one list for the copies made at
# capture and the copies into them at each replay, so that the two cannot drift apart.
_FIELDS = ("slot_mapping", "query_index", "query_flat", "context_slots", "cos", "sin_signed")


def _tensors(meta: AttentionMetadata) -> list[torch.Tensor]:
    """A decode step's metadata tensors in a fixed order (_FIELDS, then the masks by window, None last)."""
    masks = [meta.masks[w] for w in sorted(meta.masks, key=lambda w: (w is None, w or 0))]
    return [*(getattr(meta, name) for name in _FIELDS), *masks]


def _check_graphable(meta: AttentionMetadata) -> None:
    """What the captured step reads must be static tensors: no per-step Python choices left in the metadata."""
    if not meta.decode_only or meta.parts is not None or meta.decode_columns is not None or meta.causal:
        raise ValueError("only a decode step over gathered attention (no paged kernel, no groups) can be captured")


class CaptureError(RuntimeError):
    """A bucket's graph could not be captured (an operation that cannot run inside a capture)."""


class _Graph:
    """One bucket's static inputs, its logits buffer, and the replay that refreshes them."""

    def __init__(self, input_ids: torch.Tensor, meta: AttentionMetadata, forward: Forward, capture: bool,
                 pool) -> None:
        """input_ids / meta: the graph's own static tensors (from _static_copy), read by every replay."""
        _check_graphable(meta)
        self.input_ids, self.meta, self.static = input_ids, meta, _tensors(meta)
        rows = torch.arange(input_ids.numel(), device=input_ids.device)
        self.run = lambda: forward(self.input_ids, self.meta, rows)  # noqa: E731 -- (batch, vocab) logits
        self.logits: torch.Tensor | None = None
        self.graph = self._capture(pool) if capture else None

    def _capture(self, pool) -> torch.cuda.CUDAGraph:
        # Warm-up on a side stream first (cuBLAS workspaces, cuDNN plans), as torch.cuda.graphs asks. The caller has
        # pointed every row's K/V write at the scratch slot, so neither run touches a sequence's cache.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads of the process (the server's send thread) may use CUDA meanwhile
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            self.logits = self.run()
        return graph

    def replay(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        self.input_ids.copy_(input_ids)
        for static, value in zip(self.static, _tensors(meta), strict=True):
            static.copy_(value)
        if self.graph is None:  # not captured (CPU, the unit tests): run the same forward over the same buffers
            self.logits = self.run()
        else:
            self.graph.replay()
        return self.logits


class DecodeGraphs:
    """Decode steps through captured graphs, one per bucket, captured on first use. `capture=False` runs the same
    padded forward over the same static buffers without a graph (how the CPU tests check everything but the
    capture itself)."""

    def __init__(self, build: StepBuilder, forward: Forward, scratch_slot: int, capture: bool = True) -> None:
        self.build, self.forward, self.scratch_slot, self.capture = build, forward, scratch_slot, capture
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool shared by every graph

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """A decode step's (S, vocab) logits, S = its sampled sequences in order (as ModelRunner.run)."""
        B, L = inputs.context_slots.shape
        key = (batch_bucket(B), context_bucket(L))
        input_ids, meta, _ = self.build(pad_decode_step(inputs, *key, self.scratch_slot))
        graph = self.graphs.get(key) or self._new(key, input_ids, meta)
        logits = graph.replay(input_ids, meta)  # (batch bucket, vocab): rows past B are the padding's
        sampled = inputs.sampled.bool().nonzero().squeeze(1).to(logits.device)
        return logits[sampled]  # a copy: the next replay overwrites the graph's buffer

    def _new(self, key: tuple[int, int], input_ids: torch.Tensor, meta: AttentionMetadata) -> _Graph:
        try:
            graph = _Graph(*_static_copy(input_ids, meta, self.scratch_slot), self.forward, self.capture, self.pool)
        except RuntimeError as exc:
            raise CaptureError(f"capturing the decode step of {key[0]} sequences x {key[1]} context columns "
                               f"failed: {exc}") from exc
        self.graphs[key] = graph
        log.info("decode graph for %d sequences x %d context columns %s", *key,
                 "captured" if self.capture else "built (not captured)")
        return graph


def _static_copy(input_ids: torch.Tensor, meta: AttentionMetadata,
                 scratch_slot: int) -> tuple[torch.Tensor, AttentionMetadata]:
    """Copies of a step's tensors for a graph to own, every K/V write pointed at the scratch slot: the warm-up runs
    before capturing execute, and must not touch a sequence's cache. Each replay copies the real step in."""
    owned = {name: getattr(meta, name).clone() for name in _FIELDS}
    owned["slot_mapping"].fill_(scratch_slot)
    return input_ids.clone(), dataclasses.replace(meta, **owned, masks={w: m.clone() for w, m in meta.masks.items()})


def resolve_cuda_graphs(mode: str, device: torch.device) -> bool:
    """Whether decode steps replay CUDA graphs: "on" (refused off CUDA), "off", "auto" (on CUDA). A sharded
    checkpoint's ranks run eagerly (LLMEngine refuses "on" for one)."""
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graph_mode must be one of {CUDA_GRAPH_MODES}, got {mode!r}")
    if mode == "on" and device.type != "cuda":
        raise ValueError(f"cuda_graph_mode 'on' runs on CUDA only, not on device {str(device)!r}")
    return mode != "off" and device.type == "cuda"
