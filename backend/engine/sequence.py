"""A request and the state of its sequence while it lives in the engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from backend.engine.sampling_params import SamplingParams

TopLogProbs = tuple[tuple[int, float], ...]  # (token id, log-prob) of the most likely tokens, highest first


class FinishReason(str, enum.Enum):
    END_ID = "end_id"
    STOP_WORD = "stop_word"
    LENGTH = "length"  # max_tokens generated
    CANCELLED = "cancelled"
    ERROR = "error"  # this request's step failed (RequestOutput.error says why)


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
    # Prefix-cache isolation: blocks are only shared between requests with the same salt (e.g. a tenant id).
    cache_salt: str | None = None
    priority: int = 0  # scheduler priority level: higher levels are admitted first, FCFS within a level


@dataclass(frozen=True)
class Emitted:
    """Output tokens handed to the caller in one step, with what was asked alongside each."""

    token_ids: list[int]
    log_probs: list[float]  # one per token with return_log_probs, else empty
    top_log_probs: list[TopLogProbs]  # one per token with num_top_log_probs, else empty


@dataclass
class Sequence:
    request: Request
    token_ids: list[int]  # prompt + generated
    num_prompt_tokens: int
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    # Physical KV block of each logical block; None once released (outside every sliding window).
    block_table: list[int | None] = field(default_factory=list)
    block_keys: list[int] = field(default_factory=list)  # prefix-cache key of each full block registered so far
    kv_regime: str | None = None  # rope regime tag its cached K/V were computed under (rope_regime.py); None: none
    reused_blocks: int = 0  # blocks taken from the prefix cache at admission
    new_blocks: int = 0  # blocks allocated fresh
    first_scheduled_time_ns: int = 0
    num_preemptions: int = 0  # times its KV was freed to make room (it waits first in line then)
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    generator: torch.Generator | None = None  # per-request RNG: same seed -> same tokens in any batch
    output_log_probs: list[float] = field(default_factory=list)
    output_top_log_probs: list[TopLogProbs] = field(default_factory=list)
    num_emitted: int = 0  # output tokens already handed to the caller

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

    def append(self, token: int, log_prob: float | None, top: TopLogProbs = ()) -> None:
        self.token_ids.append(token)
        if log_prob is not None:
            self.output_log_probs.append(log_prob)
        if top:
            self.output_top_log_probs.append(top)
        self.finish_reason, drop = self._stop_reason()
        # end_id (as TensorRT-LLM) and a matched stop word end the sequence but are not part of the output.
        for _ in range(drop):
            self.token_ids.pop()
            if self.output_log_probs:
                self.output_log_probs.pop()
            if self.output_top_log_probs:
                self.output_top_log_probs.pop()
        if self.finish_reason is not None:
            self.status = SeqStatus.FINISHED

    def take_emittable(self) -> Emitted:
        """Output tokens (and their log-probs) not yet emitted that can be emitted now: while running, a tail
        that could be the start of a stop word is held back, so no client ever sees part of a stop word."""
        end = self.num_output_tokens
        if self.status is not SeqStatus.FINISHED:
            end -= self._stop_word_prefix_len()
        start = self.num_emitted
        self.num_emitted = max(self.num_emitted, end)
        prompt = self.num_prompt_tokens  # token_ids sliced in place: output_ids would copy the whole output each step
        return Emitted(self.token_ids[prompt + start : prompt + end], self.output_log_probs[start:end],
                       self.output_top_log_probs[start:end])

    def _stop_word_prefix_len(self) -> int:
        if not self.request.sampling.stop_words:
            return 0
        out, longest = self.output_ids, 0
        for word in self.request.sampling.stop_words:
            for k in range(min(len(word) - 1, len(out)), longest, -1):
                if tuple(out[-k:]) == word[:k]:
                    longest = k
                    break
        return longest

    def _stop_reason(self) -> tuple[FinishReason | None, int]:
        """Why the sequence ends after its newest token, if it does, and how many trailing tokens to drop."""
        sampling = self.request.sampling
        n_out = self.num_output_tokens
        if sampling.end_id is not None and self.token_ids[-1] == sampling.end_id:
            return FinishReason.END_ID, 1
        for word in sampling.stop_words:
            if n_out >= len(word) and tuple(self.token_ids[-len(word) :]) == word:
                return FinishReason.STOP_WORD, len(word)
        if n_out >= sampling.max_tokens:
            return FinishReason.LENGTH, 0
        return None, 0
