"""POST /v1/completions: one or several prompts, n sequences each (choice index = prompt * n + sequence),
echo, log-probs (the sampled tokens' and up to 5 alternatives), stop strings, streamed or not."""
from __future__ import annotations

import time
import uuid

from starlette.responses import JSONResponse, Response

from frontend.openai_api.context import Serving
from frontend.openai_api.errors import bad_request
from frontend.openai_api.generation import Caller, Generation, usage
from frontend.openai_api.logprobs import completion_logprobs
from frontend.openai_api.params import generation_params
from frontend.openai_api.protocol import CompletionRequest, refuse_unsupported
from frontend.openai_api.streaming import sse_events, sse_response
from frontend.openai_api.triton_stream import Chunk

MAX_LOGPROBS = 5  # OpenAI's limit for completions
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for completions


def _check(req: CompletionRequest) -> list[str]:
    refuse_unsupported(req)
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not prompts or not all(prompts):
        raise bad_request("prompt must be a non-empty string or a list of non-empty strings.", "prompt")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise bad_request(f"logprobs must be in [0, {MAX_LOGPROBS}], got {req.logprobs}.", "logprobs")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo with logprobs needs the prompt's log-probs, which this server does not return.",
                          "echo")
    if req.stream_options is not None and not req.stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    return prompts


class CompletionFormat:
    def __init__(self, serving: Serving, prompts: list[str], gens: list[Generation], echo: bool, logprobs: bool):
        self.serving, self.prompts, self.gens, self.echo, self.logprobs = serving, prompts, gens, echo, logprobs
        self.started: set[int] = set()
        self.offsets: dict[int, int] = {}

    def opening(self, index: int) -> list[dict]:
        return []

    def delta(self, index: int, chunk: Chunk, prompt: int) -> dict | None:
        text = chunk.text
        if self.echo and index not in self.started:
            text = self.prompts[prompt] + text
        self.started.add(index)
        if not text and not chunk.token_ids:
            return None
        lps = None
        if self.logprobs:
            at = self.offsets.get(index, len(self.prompts[prompt]) if self.echo else 0)
            lps = completion_logprobs(self.serving.tokenizer, chunk.token_ids, chunk.log_probs, chunk.top, at)
            self.offsets[index] = at + len(chunk.text)
        return {"index": index, "text": text, "logprobs": lps, "finish_reason": None}

    def finish(self, index: int, reason: str) -> dict:
        return {"index": index, "text": "", "logprobs": None, "finish_reason": reason}


def _choices(serving: Serving, prompts: list[str], gens: list[Generation], req: CompletionRequest) -> list[dict]:
    choices = []
    for p, gen in enumerate(gens):
        for i, seq in sorted(gen.sequences.items()):
            text = "".join(seq.text)
            lps = None
            if req.logprobs is not None:
                start = len(prompts[p]) if req.echo else 0
                lps = completion_logprobs(serving.tokenizer, seq.token_ids, seq.log_probs, seq.top, start)
            choices.append({"index": p * gen.params.n + i, "text": (prompts[p] if req.echo else "") + text,
                            "logprobs": lps, "finish_reason": seq.finish_reason(gen.params.max_tokens)})
    return choices


async def create_completion(serving: Serving, req: CompletionRequest, caller: Caller) -> Response:
    prompts = _check(req)
    model = serving.check_model(req.model)
    params = generation_params(req, DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens,
                               logprobs=req.logprobs is not None, top_logprobs=req.logprobs or 0)
    if len(prompts) * params.n > serving.config.max_sequences:
        raise bad_request(f"{len(prompts)} prompts x n={params.n} would start {len(prompts) * params.n} sequences; "
                          f"at most {serving.config.max_sequences} per request (the server's --max-sequences)",
                          "prompt")
    gens = [Generation(serving.client, serving.config.model, prompt, params, caller,
                       tag=f"-{p}" if len(prompts) > 1 else "") for p, prompt in enumerate(prompts)]
    await serving.start_all(gens)
    base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model}
    if req.stream:
        opts = req.stream_options
        fmt = CompletionFormat(serving, prompts, gens, req.echo, req.logprobs is not None)
        return sse_response(sse_events(fmt, gens, base, bool(opts and opts.include_usage),
                                       bool(opts and opts.continuous_usage_stats)))
    await serving.finish_all(gens)
    return JSONResponse({**base, "system_fingerprint": None, "choices": _choices(serving, prompts, gens, req),
                         "usage": usage(gens)})
