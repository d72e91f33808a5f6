"""A request and the state of its sequence while it lives in the engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from backend.sampling_params import SamplingParams


class FinishReason(str, enum.Enum):
    END_ID = "end_id"
    STOP_WORD = "stop_word"
    LENGTH = "length"  # max_tokens generated
    CANCELLED = "cancelled"


class SeqStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    arrival_time_ns: int = 0


@dataclass
class Sequence:
    request: Request
    token_ids: list[int]  # prompt + generated
    num_prompt_tokens: int
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)  # physical KV block of each logical block
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    generator: torch.Generator | None = None  # per-request RNG: same seed -> same tokens in any batch
    output_log_probs: list[float] = field(default_factory=list)

    @classmethod
    def from_request(cls, request: Request) -> "Sequence":
        seq = cls(request=request, token_ids=list(request.prompt_ids), num_prompt_tokens=len(request.prompt_ids))
        seed = request.sampling.seed
        if not request.sampling.greedy:
            seq.generator = torch.Generator()
            if seed is None:
                seq.generator.seed()
            else:
                seq.generator.manual_seed(seed)
        return seq

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def in_prefill(self) -> bool:
        """More than the newest token is missing from the cache (a prompt, or a context to recompute)."""
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def max_total_tokens(self) -> int:
        """The longest this sequence can grow: the KV it may need."""
        return self.num_prompt_tokens + self.request.sampling.max_tokens

    def append(self, token: int, log_prob: float | None) -> None:
        self.token_ids.append(token)
        if log_prob is not None:
            self.output_log_probs.append(log_prob)
        self.finish_reason = self._stop_reason()
        if self.finish_reason is FinishReason.END_ID:
            # As TensorRT-LLM: end_id ends the sequence but is not part of the output.
            self.token_ids.pop()
            if log_prob is not None:
                self.output_log_probs.pop()
        if self.finish_reason is not None:
            self.status = SeqStatus.FINISHED

    def _stop_reason(self) -> FinishReason | None:
        sampling = self.request.sampling
        n_out = self.num_output_tokens
        if sampling.end_id is not None and self.token_ids[-1] == sampling.end_id:
            return FinishReason.END_ID
        for word in sampling.stop_words:
            if n_out >= len(word) and tuple(self.token_ids[-len(word) :]) == word:
                return FinishReason.STOP_WORD
        if n_out >= sampling.max_tokens:
            return FinishReason.LENGTH
        return None
