"""What a model step needs, and nothing engine-side: the boundary between the scheduler's batch and the model.

StepInputs is small (token ids, each sequence's new-token range and KV slots) and packs into two int64 tensors,
so the parallel runtime's driver can broadcast it to every rank (backend/model/parallel/); each rank then derives the
AttentionMetadata itself with step_tensors(), the same code the single-process ModelRunner uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.model.decoder import AttentionMetadata

_HEADER = 3  # T, B, L


@dataclass(frozen=True)
class StepInputs:
    """T = tokens this step, B = sequences, L = longest context (cached + new). All int64 on CPU."""

    tokens: torch.Tensor  # (T,) new token ids, sequence after sequence
    start: torch.Tensor  # (B,) first new position of each sequence
    end: torch.Tensor  # (B,) context length after this step
    sampled: torch.Tensor  # (B,) 1 where the sequence yields its next token this step
    context_slots: torch.Tensor  # (B, L) KV cache slot of each context position, padded with 0

    @property
    def num_sampled(self) -> int:
        return int(self.sampled.sum())

    def pack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(header (3,) = [T, B, L], payload (T + 3B + B*L,)): what the driver broadcasts."""
        B, L = self.context_slots.shape
        header = torch.tensor([self.tokens.numel(), B, L], dtype=torch.long)
        payload = torch.cat([self.tokens, self.start, self.end, self.sampled, self.context_slots.reshape(-1)])
        return header, payload.long()

    @staticmethod
    def payload_size(header: torch.Tensor) -> int:
        T, B, L = header.tolist()
        return T + 3 * B + B * L

    @classmethod
    def unpack(cls, header: torch.Tensor, payload: torch.Tensor) -> StepInputs:
        T, B, L = header.tolist()
        tokens, start, end, sampled, slots = payload.split([T, B, B, B, B * L])
        return cls(tokens, start, end, sampled, slots.view(B, L))


def step_tensors(inputs: StepInputs, rope_cos: torch.Tensor, rope_sin: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """(input_ids (T,), AttentionMetadata, logits_index (S,)), built with vectorised ops (no per-token Python)."""
    start, end, ctx_slots = inputs.start, inputs.end, inputs.context_slots
    q_len = end - start
    B, L = ctx_slots.shape
    Q = int(q_len.max())
    keys = torch.arange(L)
    ctx_valid = keys[None, :] < end[:, None]  # (B, L)
    offsets = torch.arange(Q)
    q_valid = offsets[None, :] < q_len[:, None]  # (B, Q)
    q_pos = torch.where(q_valid, start[:, None] + offsets, 0)  # (B, Q); padded queries sit at position 0
    first = torch.cumsum(q_len, 0) - q_len  # (B,) flat index of each sequence's first new token
    q_idx = torch.where(q_valid, first[:, None] + offsets, 0)
    # Query at position p sees keys at positions <= p; padded queries see key 0 only, so no row is empty.
    mask = (keys[None, None, :] <= q_pos[:, :, None]) & ctx_valid[:, None, :]  # (B, Q, L)
    positions = q_pos[q_valid].to(device)  # (T,)
    meta = AttentionMetadata(
        slot_mapping=ctx_slots.gather(1, q_pos)[q_valid].to(device),
        query_index=q_idx.to(device),
        query_flat=(torch.arange(B)[:, None] * Q + offsets)[q_valid].to(device),
        context_slots=ctx_slots.to(device),
        mask=mask[:, None].to(device),
        cos=rope_cos[positions].to(dtype),
        sin=rope_sin[positions].to(dtype),
    )
    logits_index = (first + q_len - 1)[inputs.sampled.bool()]  # the last new token of each sequence that samples
    return inputs.tokens.to(device), meta, logits_index.to(device)
