"""Per-request decoding options (the anchor's sampling contract), validated at the boundary.

Ranges are TensorRT-LLM's (executor SamplingConfig checks): what it accepts is accepted with its meaning, what it
refuses is refused; every float must also be finite (NaN / +-Inf are refused, naming the field).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from backend.errors import InvalidRequestError

# Longest stop / bad word list a request may carry, in token ids (all words of one list together): each held word
# is compared against the output tail at every step.
MAX_WORD_LIST_TOKENS = 1024
MAX_TOP_LOG_PROBS = 20  # alternatives per generated token (OpenAI's top_logprobs limit)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message)


def _finite(name: str, value: float) -> None:
    _check(math.isfinite(value), f"{name} must be a finite number, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0: greedy (as TensorRT-LLM, whose kernel scales by 1 / (t + 1e-6))
    top_k: int = 0  # 0: no top-k limit
    top_p: float | None = None  # None: no nucleus limit (the Triton input's 0 or less means the same)
    seed: int | None = None  # None: a fresh random stream per request
    end_id: int | None = None  # generation stops after emitting it; None: never
    pad_id: int | None = None  # pads shorter sequences in a response holding several; checked against the vocab
    min_tokens: int = 0  # end_id is masked until this many tokens were generated
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    length_penalty: float = 0.0  # beam search only: no effect with beam width 1, as in TensorRT-LLM
    # Token sequences that end generation when the output ends with one of them.
    stop_words: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    # Token sequences that are never generated: their last token is masked when the rest is the current suffix.
    bad_words: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    return_log_probs: bool = False
    # How many of the most likely tokens (ids and log-probs under the unmodified distribution) to return per
    # generated token; 0: none.
    num_top_log_probs: int = 0

    def __post_init__(self) -> None:
        for name in ("temperature", "repetition_penalty", "presence_penalty", "frequency_penalty", "length_penalty"):
            _finite(name, getattr(self, name))
        if self.top_p is not None:
            _finite("top_p", self.top_p)
        _check(self.max_tokens > 0, f"max_tokens must be > 0, got {self.max_tokens}")
        _check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check(self.top_p is None or 0.0 < self.top_p <= 1.0,
               f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}")
        _check(self.repetition_penalty > 0.0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check(self.length_penalty >= 0.0, f"length_penalty must be >= 0, got {self.length_penalty}")
        _check(self.seed is None or 0 <= self.seed < 2**64, f"seed must be >= 0 and < 2^64, got {self.seed}")
        _check(0 <= self.num_top_log_probs <= MAX_TOP_LOG_PROBS,
               f"num_top_log_probs must be in [0, {MAX_TOP_LOG_PROBS}], got {self.num_top_log_probs}")
        for name in ("stop_words", "bad_words"):
            words = getattr(self, name)
            _check(all(len(w) > 0 for w in words), f"{name} contains an empty word")
            size = sum(len(w) for w in words)
            _check(size <= MAX_WORD_LIST_TOKENS,
                   f"{name} holds {size} token ids, more than the limit ({MAX_WORD_LIST_TOKENS})")

    @property
    def greedy(self) -> bool:
        """Greedy unless a sampling option asks otherwise (the anchor's default is greedy: top_k = top_p = 0)."""
        if self.temperature == 0.0 or self.top_k == 1:
            return True
        return self.top_k == 0 and self.top_p is None

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
