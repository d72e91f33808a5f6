"""What a model step needs, and nothing engine-side: the boundary between the scheduler's batch and the model.

StepInputs is small (token ids, each sequence's new-token range, context window, rope state and KV slots) and packs
into two int64 tensors, so the parallel runtime's driver can broadcast it to every rank (backend/model/parallel/);
each rank then derives the AttentionMetadata itself with step_tensors(), the same code the single-process
ModelRunner uses.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from backend.model.decoder import AttentionMetadata
from backend.model.rotary import RotaryEmbedding

_HEADER = 3  # T, B, L
_PER_SEQ = ("start", "end", "sampled", "ctx_start", "prompt_len", "total_len")


@dataclass(frozen=True)
class StepInputs:
    """T = tokens this step, B = sequences, L = longest context kept (cached + new). All int64 on CPU."""

    tokens: torch.Tensor  # (T,) new token ids, sequence after sequence
    start: torch.Tensor  # (B,) first new position of each sequence
    end: torch.Tensor  # (B,) context length after this step
    sampled: torch.Tensor  # (B,) 1 where the sequence yields its next token this step
    context_slots: torch.Tensor  # (B, L) KV cache slot of context positions ctx_start.., padded with 0
    ctx_start: torch.Tensor  # (B,) position of context_slots' first column (> 0 when a sliding window dropped keys)
    prompt_len: torch.Tensor  # (B,) the request's prompt length (rope state: dynamic NTK)
    total_len: torch.Tensor  # (B,) the sequence's whole length, prompt + generated, this step (rope state: longrope)

    @classmethod
    def of(cls, tokens: torch.Tensor, start: torch.Tensor, end: torch.Tensor, sampled: torch.Tensor,
           context_slots: torch.Tensor, ctx_start: torch.Tensor | None = None, prompt_len: torch.Tensor | None = None,
           total_len: torch.Tensor | None = None) -> StepInputs:
        """Whole contexts from position 0, each sequence's prompt and total being its context (scoring windows)."""
        zeros = torch.zeros_like(start)
        return cls(tokens, start, end, sampled, context_slots, zeros if ctx_start is None else ctx_start,
                   end if prompt_len is None else prompt_len, end if total_len is None else total_len)

    @property
    def is_decode(self) -> bool:
        """Every sequence brings exactly one new token (T == B, Q == 1): a decode step."""
        return self.tokens.numel() == self.start.numel() and bool((self.end - self.start == 1).all())

    @property
    def num_sampled(self) -> int:
        return int(self.sampled.sum())

    def pack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(header (3,) = [T, B, L], payload (T + 6B + B*L,)): what the driver broadcasts."""
        B, L = self.context_slots.shape
        header = torch.tensor([self.tokens.numel(), B, L], dtype=torch.long)
        per_seq = [getattr(self, name) for name in _PER_SEQ]
        payload = torch.cat([self.tokens, *per_seq, self.context_slots.reshape(-1)])
        return header, payload.long()

    @staticmethod
    def payload_size(header: torch.Tensor) -> int:
        T, B, L = header.tolist()
        return T + len(_PER_SEQ) * B + B * L

    @classmethod
    def unpack(cls, header: torch.Tensor, payload: torch.Tensor) -> StepInputs:
        T, B, L = header.tolist()
        tokens, *per_seq, slots = payload.split([T] + [B] * len(_PER_SEQ) + [B * L])
        return cls(tokens, *per_seq[:3], slots.view(B, L), *per_seq[3:])


def step_tensors(inputs: StepInputs, rotary: RotaryEmbedding, windows: set[int | None], dtype: torch.dtype,
                 device: torch.device, paged_decode: bool = False,
                 causal_prefill: bool = False) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """(input_ids (T,), AttentionMetadata, logits_index (S,)), built with vectorised ops (no per-token Python).
    `windows`: the distinct sliding windows of the model's layers (None: full attention), one mask each.
    `paged_decode`: a decode step gets each window's column ranges for the paged kernel (decode_columns).
    `causal_prefill`: a step with causal windows gets each sequence's token range for that kernel (causal_seqs)."""
    if inputs.is_decode:
        return _decode_tensors(inputs, rotary, windows, dtype, device, paged_decode)
    return _step_tensors(inputs, rotary, windows, dtype, device, paged_decode, causal_prefill)


def _decode_tensors(inputs: StepInputs, rotary: RotaryEmbedding, windows: set[int | None], dtype: torch.dtype,
                    device: torch.device, paged_decode: bool) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """_step_tensors' result for a decode step (one new token per sequence: T == B, Q == 1), from the formulas that
    case reduces to (token b is sequence b's, at position start; it sees its context columns up to end): the same
    tensors (tests/unit/model/test_step_inputs.py) in a third of the time (~95 us instead of ~285 for 16 sequences
    on the development CPU, 4 % of the demo model's batch-16 step; perf/ISSUE16.md)."""
    start, end, ctx_slots, ctx0 = inputs.start, inputs.end, inputs.context_slots, inputs.ctx_start
    B = ctx_slots.shape[0]
    cos, sin_signed = rotary.cos_signed_sin(start, inputs.prompt_len, inputs.total_len)
    flat = torch.arange(B)  # token b is sequence b's only one
    meta = AttentionMetadata(
        slot_mapping=ctx_slots.gather(1, (start - ctx0)[:, None])[:, 0].to(device),
        query_index=flat[:, None].to(device),
        query_flat=flat.to(device),
        context_slots=ctx_slots.to(device),
        masks=DecodeMasks(inputs, windows, device),
        cos=cos.to(dtype),
        sin_signed=sin_signed.to(dtype),
        decode_only=True,
    )
    if paged_decode:
        meta.decode_columns = _decode_columns(end - ctx0, windows, device)
    return inputs.tokens.to(device), meta, flat[inputs.sampled.bool()].to(device)


class DecodeMasks(Mapping):
    """window (None: full) -> (B, 1, 1, L) bool mask of a decode step's queries, each built on first use: the paged
    kernel and the compiled layers never read them (~15 us a step saved), SDPA over gathered rows does (FP8 pools,
    attention_kernel "torch", CUDA graphs). The query at start sees keys at positions < end, and within a window w
    those > start - w."""

    def __init__(self, inputs: StepInputs, windows: set[int | None], device: torch.device) -> None:
        self._inputs, self._windows, self._device = inputs, windows, device
        self._built: dict[int | None, torch.Tensor] = {}

    def __getitem__(self, window: int | None) -> torch.Tensor:
        if window not in self._windows:
            raise KeyError(window)
        if window not in self._built:
            self._built[window] = self._build(window).to(self._device)
        return self._built[window]

    def _build(self, window: int | None) -> torch.Tensor:
        start, end, ctx0 = self._inputs.start, self._inputs.end, self._inputs.ctx_start
        key_pos = ctx0[:, None] + torch.arange(self._inputs.context_slots.shape[1])  # (B, L) each column's position
        seen = key_pos < end[:, None]
        if window is not None:
            seen &= key_pos > (start - window)[:, None]
        return seen[:, None, None, :]

    def __iter__(self) -> Iterator[int | None]:
        return iter(self._windows)

    def __len__(self) -> int:
        return len(self._windows)


def _step_tensors(inputs: StepInputs, rotary: RotaryEmbedding, windows: set[int | None], dtype: torch.dtype,
                  device: torch.device, paged_decode: bool,
                  causal_prefill: bool) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """step_tensors for any step: prompts, chunks, decode tokens, mixed."""
    start, end, ctx_slots, ctx0 = inputs.start, inputs.end, inputs.context_slots, inputs.ctx_start
    q_len = end - start
    B, L = ctx_slots.shape
    Q = int(q_len.max())
    key_pos = ctx0[:, None] + torch.arange(L)  # (B, L) position held by each context column
    ctx_valid = key_pos < end[:, None]
    offsets = torch.arange(Q)
    q_valid = offsets[None, :] < q_len[:, None]  # (B, Q)
    # Padded queries repeat the sequence's first query (their rows are dropped), so no mask row is empty.
    q_pos = torch.where(q_valid, start[:, None] + offsets, start[:, None])  # (B, Q)
    first = torch.cumsum(q_len, 0) - q_len  # (B,) flat index of each sequence's first new token
    q_idx = torch.where(q_valid, first[:, None] + offsets, 0)
    causal = (key_pos[:, None, :] <= q_pos[:, :, None]) & ctx_valid[:, None, :]  # (B, Q, L)
    masks = {w: (causal if w is None else causal & (key_pos[:, None, :] > q_pos[:, :, None] - w))[:, None].to(device)
             for w in windows}
    positions = q_pos[q_valid]  # (T,)
    per_token = [t[:, None].expand(B, Q)[q_valid] for t in (inputs.prompt_len, inputs.total_len)]
    cos, sin_signed = rotary.cos_signed_sin(positions, *per_token)
    meta = AttentionMetadata(
        slot_mapping=ctx_slots.gather(1, q_pos - ctx0[:, None])[q_valid].to(device),
        query_index=q_idx.to(device),
        query_flat=(torch.arange(B)[:, None] * Q + offsets)[q_valid].to(device),
        context_slots=ctx_slots.to(device),
        masks=masks,
        cos=cos.to(dtype),
        sin_signed=sin_signed.to(dtype),
        decode_only=Q == 1 and inputs.tokens.numel() == B,
        causal=_causal_windows(start, ctx0, Q, windows),
    )
    if paged_decode and meta.decode_only:
        meta.decode_columns = _decode_columns(end - ctx0, windows, device)
    if causal_prefill and meta.causal:
        meta.causal_seqs = torch.stack((first, q_len), dim=1).to(device)
    decoding = q_len == 1
    if Q > 1 and bool(decoding.any()):  # decode tokens beside prompts: each group attends on its own
        meta.parts = [_part(inputs, group, q_len, rotary, windows, dtype, device, paged_decode, causal_prefill)
                      for group in (decoding, ~decoding)]
    logits_index = (first + q_len - 1)[inputs.sampled.bool()]  # the last new token of each sequence that samples
    return inputs.tokens.to(device), meta, logits_index.to(device)


def _part(inputs: StepInputs, group: torch.Tensor, q_len: torch.Tensor, rotary: RotaryEmbedding,
          windows: set[int | None], dtype: torch.dtype, device: torch.device, paged_decode: bool,
          causal_prefill: bool) -> tuple[torch.Tensor, AttentionMetadata]:
    """group (B,) bool: those sequences' flat token indices (T_g,) and their own step metadata, as if they were the
    step (contexts cut to the longest of theirs). Only the attention reads it: the K/V writes use the whole step's."""
    tokens = group.repeat_interleave(q_len).nonzero().squeeze(1)  # (T_g,) tokens of the group's sequences
    width = int((inputs.end - inputs.ctx_start)[group].max())
    sub = StepInputs(inputs.tokens[tokens], inputs.start[group], inputs.end[group], inputs.sampled[group],
                     inputs.context_slots[group, :width], inputs.ctx_start[group], inputs.prompt_len[group],
                     inputs.total_len[group])
    _, meta, _ = step_tensors(sub, rotary, windows, dtype, device, paged_decode, causal_prefill)
    return tokens.to(device), meta


def _causal_windows(start: torch.Tensor, ctx0: torch.Tensor, Q: int, windows: set[int | None]) -> frozenset:
    """The windows whose mask is top-left causal: every sequence's context columns are its new tokens (its first
    new position is its first context position), so query q sees columns 0..q, and the window (if any) spans all Q.
    Padded query rows then see padded columns too; their rows are dropped."""
    if Q == 1 or not bool((start == ctx0).all()):
        return frozenset()
    return frozenset(w for w in windows if w is None or w >= Q)


def _decode_columns(stop: torch.Tensor, windows: set[int | None],
                    device: torch.device) -> dict[int | None, tuple[torch.Tensor, torch.Tensor]]:
    """stop (B,): past-the-last context column (the new token's). The query at position p sees keys at p - w + 1
    .. p under a window w (the masks' rule), so columns from stop - w, clamped to 0; all of them without one."""
    stop = stop.to(device)
    return {w: ((stop - w).clamp(min=0) if w is not None else torch.zeros_like(stop), stop) for w in windows}
