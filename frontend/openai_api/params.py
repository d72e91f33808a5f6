"""What an OpenAI request asks of the engine, validated (400 naming the field, vLLM's wording), and the ensemble
input tensors that carry it. OpenAI samples by default (temperature 1, top_p 1) while the ensemble is greedy unless
asked: temperature and top_p are therefore always sent; temperature 0 is greedy."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from frontend.openai_api.errors import bad_request

MAX_N = 16  # the engine's num_return_sequences limit (backend/serving/triton_io.MAX_RETURN_SEQUENCES)
MAX_STOP = 64  # stop words per request (preprocessing's limit)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat; completions allow 5
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    logprobs: bool = False  # the sampled tokens' log-probs
    top_logprobs: int = 0  # alternatives per token (needs logprobs)

    def __post_init__(self) -> None:
        _range("max_tokens", self.max_tokens, 1, INT32_MAX)
        _finite("temperature", self.temperature)
        _check(0.0 <= self.temperature <= 2.0, "temperature", f"temperature must be in [0, 2], got {self.temperature}.")
        _finite("top_p", self.top_p)
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}.")
        _check(0 <= self.top_k <= INT32_MAX, "top_k", f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        _check(0 <= self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}.")
        _check(self.seed is None or 0 <= self.seed < 2**64, "seed", f"seed must be in [0, 2**64), got {self.seed}.")
        _check(len(self.stop) <= MAX_STOP, "stop", f"stop may hold at most {MAX_STOP} strings, got {len(self.stop)}.")
        _check(all(self.stop), "stop", "stop cannot contain an empty string.")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _finite(name, value)
            _check(-2.0 <= value <= 2.0, name, f"{name} must be in [-2, 2], got {value}.")
        _finite("repetition_penalty", self.repetition_penalty)
        _check(self.repetition_penalty > 0, "repetition_penalty",
               f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        _check(1 <= self.n <= MAX_N, "n", f"n must be in [1, {MAX_N}], got {self.n}.")
        _check(self.n == 1 or self.temperature > 0, "n", f"n must be 1 when using greedy sampling, got {self.n}.")
        _check(0 <= self.top_logprobs <= MAX_TOP_LOGPROBS, "top_logprobs",
               f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}.")

    def inputs(self, prompt: str, stream: bool) -> dict[str, np.ndarray]:
        """Ensemble input name -> array with the batch dim: (1, 1), stop_words (1, k)."""
        arrays = {
            "text_input": _bytes([prompt]),
            "max_tokens": _scalar(self.max_tokens, np.int32),
            "stream": _scalar(stream, np.bool_),
            "exclude_input_in_output": _scalar(True, np.bool_),  # echo is done here, from the prompt text
            "return_num_input_tokens": _scalar(True, np.bool_),
            "temperature": _scalar(self.temperature, np.float32),
            "top_p": _scalar(self.top_p, np.float32),
        }
        optional = {"top_k": (self.top_k, 0, np.int32), "min_tokens": (self.min_tokens, 0, np.int32),
                    "presence_penalty": (self.presence_penalty, 0.0, np.float32),
                    "frequency_penalty": (self.frequency_penalty, 0.0, np.float32),
                    "repetition_penalty": (self.repetition_penalty, 1.0, np.float32),
                    "num_return_sequences": (self.n, 1, np.int32),
                    "num_top_log_probs": (self.top_logprobs, 0, np.int32)}
        for name, (value, default, dtype) in optional.items():
            if value != default:
                arrays[name] = _scalar(value, dtype)
        if self.seed is not None:
            arrays["seed"] = _scalar(self.seed, np.uint64)
        if self.stop:
            arrays["stop_words"] = _bytes(list(self.stop))
        if self.logprobs:
            arrays["return_log_probs"] = _scalar(True, np.bool_)
        return arrays

    def outputs(self) -> list[str]:
        # output_token_ids: usage and finish_reason count them (exact whatever num_output_tokens means when
        # streaming: a running total or a per-response count).
        names = ["text_output", "sequence_index", "num_input_tokens", "output_token_ids"]
        if self.logprobs:
            names.append("output_log_probs")
        if self.top_logprobs:
            names += ["top_log_probs", "top_log_probs_ids"]
        return names


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise bad_request(message, param)


def _finite(name: str, value: float) -> None:
    _check(math.isfinite(value), name, f"{name} must be a finite number, got {value}.")


def _range(name: str, value: int, lo: int, hi: int) -> None:
    _check(lo <= value <= hi, name, f"{name} must be in [{lo}, {hi}], got {value}.")


def _scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def _bytes(values: list[str]) -> np.ndarray:
    return np.array([[v.encode("utf-8") for v in values]], dtype=np.object_)


def generation_params(req, max_tokens: int, logprobs: bool = False, top_logprobs: int = 0) -> GenerationParams:
    """GenerationParams of a completion or chat request (protocol._Common), OpenAI's defaults applied."""
    _check(req.seed is None or req.seed >= -1, "seed", f"seed must be in [0, 2**64) or -1 (unset), got {req.seed}.")
    _check(req.top_k is None or req.top_k >= -1, "top_k", f"top_k must be 0 (disable), or at least 1, got {req.top_k}.")
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k in (None, -1) else req.top_k,
        min_tokens=max_tokens if req.ignore_eos else req.min_tokens,  # EOS masked until max_tokens: exact length
        seed=None if req.seed in (None, -1) else req.seed,
        stop=(req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ()),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        n=req.n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
