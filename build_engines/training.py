"""Next-token training on a flat token stream: fixed schedule, fixed data order, CPU threads."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase


@dataclass(frozen=True)
class TrainSchedule:
    """AdamW with linear warmup then cosine decay to `min_lr_ratio * learning_rate`.

    A step count, not a wall-clock budget, so the result does not depend on machine speed.
    `threads` is part of the schedule because CPU reductions split by thread count, and a
    different split changes float rounding and so the trained weights.
    """

    seq_len: int = 256
    # Small batches, many steps: this early in training more updates beat less noisy ones.
    batch_size: int = 4
    steps: int = 1000
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    threads: int = 2

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "steps", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.grad_clip <= 0:
            raise ValueError(f"need weight_decay >= 0 and grad_clip > 0, got {self.weight_decay}, {self.grad_clip}")

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.learning_rate * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - 1 - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.learning_rate * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)  # one per step
    seconds: float = 0.0
    tokens_seen: int = 0

    @property
    def final_loss(self) -> float:
        """Mean of the last 20 step losses (one step's loss is noisy)."""
        tail = self.losses[-20:]
        return sum(tail) / len(tail)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def batch_offsets(n_tokens: int, schedule: TrainSchedule, seed: int) -> np.ndarray:
    """(steps, batch_size) window start positions, drawn once from `seed`."""
    if n_tokens <= schedule.seq_len:
        raise ValueError(f"corpus has {n_tokens} tokens, fewer than one window of {schedule.seq_len}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_tokens - schedule.seq_len, size=(schedule.steps, schedule.batch_size))


def windows(tokens: torch.Tensor, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    """tokens (n,) -> (len(starts), seq_len) slices."""
    return torch.stack([tokens[s:s + seq_len] for s in starts.tolist()])


def _optimizer(model: torch.nn.Module, schedule: TrainSchedule) -> torch.optim.AdamW:
    # Decay matrices only; norm gains (1-D) stay undecayed, as is usual for transformers.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": schedule.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=schedule.learning_rate, betas=(0.9, 0.95), eps=1e-8)


def train_model(model: LlamaForCausalLM, tokens: torch.Tensor, schedule: TrainSchedule, seed: int) -> TrainResult:
    """Train in place on random windows of `tokens` (1-D int64); returns per-step losses."""
    offsets = batch_offsets(len(tokens), schedule, seed)
    result = TrainResult()
    with torch_threads(schedule.threads):
        torch.manual_seed(seed)
        model.train()
        optimizer = _optimizer(model, schedule)
        start = time.perf_counter()
        bar = tqdm(range(schedule.steps), desc="train", unit="step")
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr_at(step)
            x = windows(tokens, offsets[step], schedule.seq_len)  # (batch, seq_len)
            loss = model(input_ids=x, labels=x).loss  # HF shifts labels by one inside
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
            optimizer.step()
            result.losses.append(loss.item())
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{schedule.lr_at(step):.2e}")
        result.seconds = time.perf_counter() - start
        result.tokens_seen = schedule.steps * schedule.batch_size * schedule.seq_len
    model.eval()
    return result


@torch.no_grad()
def mean_loss(model: LlamaForCausalLM, tokens: torch.Tensor, seq_len: int, max_windows: int = 32) -> float:
    """Mean next-token loss over consecutive non-overlapping windows of `tokens`."""
    n = min(max_windows, len(tokens) // seq_len)
    if n == 0:
        raise ValueError(f"need at least {seq_len} tokens, got {len(tokens)}")
    x = tokens[:n * seq_len].view(n, seq_len)
    total = 0.0
    for batch in x.split(8):  # (<=8, seq_len); every window has the same token count
        total += model(input_ids=batch, labels=batch).loss.item() * len(batch)
    return total / n


@torch.no_grad()
def greedy_sample(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompt: str,
                  max_new_tokens: int = 48) -> str:
    """Prompt plus its greedy continuation, decoded."""
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0])
