"""What the scheduler decided for one step: which sequences run and how many of their tokens each processes."""
from __future__ import annotations

from dataclasses import dataclass, field

from backend.engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's share of a step, as scheduled: a snapshot that the step's bookkeeping cannot change."""

    seq: Sequence
    start: int  # first position processed this step (the tokens before it are in the KV cache)
    num_new_tokens: int  # tokens processed this step (a prefill chunk, or 1 to decode)
    samples: bool  # whether this step yields the sequence's next token (its prompt is then fully in the cache)

    @classmethod
    def of(cls, seq: Sequence, num_new_tokens: int) -> "ScheduledSeq":
        start = seq.num_computed_tokens
        return cls(seq, start, num_new_tokens, start + num_new_tokens == seq.num_tokens)

    @property
    def end(self) -> int:
        """The context length once this step ran."""
        return self.start + self.num_new_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's batch, in the order the model processes it: decoding sequences first, then prefill chunks."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.scheduled)

    def __iter__(self):
        return iter(self.scheduled)

    def __len__(self) -> int:
        return len(self.scheduled)

    @property
    def context(self) -> list[ScheduledSeq]:
        """The entries still prefilling (a prompt chunk, or a preempted context being recomputed)."""
        return [item for item in self.scheduled if item.seq.in_prefill]

    @property
    def num_context_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.context)

    @property
    def sampling(self) -> list[Sequence]:
        """The sequences that yield a token this step, in batch order (the rows of the step's logits)."""
        return [item.seq for item in self.scheduled if item.samples]
