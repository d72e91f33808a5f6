"""POST /v1/chat/completions: the conversation rendered by the model's chat template, n choices, log-probs with
up to 20 alternatives per token, stop strings, echo (vLLM's), streamed or not."""
from __future__ import annotations

import time
import uuid

from starlette.responses import JSONResponse, Response

from frontend.openai_api.context import Serving
from frontend.openai_api.errors import bad_request
from frontend.openai_api.generation import Caller, Generation, usage
from frontend.openai_api.logprobs import chat_logprobs
from frontend.openai_api.params import generation_params
from frontend.openai_api.protocol import ChatCompletionRequest, refuse_unsupported
from frontend.openai_api.streaming import sse_events, sse_response
from frontend.openai_api.triton_stream import Chunk


def _check(req: ChatCompletionRequest) -> int:
    """Validate what the sampling params do not cover; the top_logprobs to ask for."""
    refuse_unsupported(req)
    if req.top_logprobs and not req.logprobs:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    return req.top_logprobs or 0


def _response_role(req: ChatCompletionRequest) -> str:
    return "assistant" if req.add_generation_prompt else req.messages[-1].role


def _echo(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's content, when it has the role of the answer."""
    last = req.messages[-1]
    return last.text() if req.echo and last.role == _response_role(req) else ""


class ChatFormat:
    def __init__(self, serving: Serving, role: str, echo: str, logprobs: bool) -> None:
        self.serving, self.role, self.echo, self.logprobs = serving, role, echo, logprobs

    def opening(self, index: int) -> list[dict]:
        choices = [{"index": index, "delta": {"role": self.role, "content": ""}, "logprobs": None,
                    "finish_reason": None}]
        if self.echo:
            choices.append({"index": index, "delta": {"content": self.echo}, "logprobs": None, "finish_reason": None})
        return choices

    def delta(self, index: int, chunk: Chunk, prompt: int) -> dict | None:
        if not chunk.text and not (self.logprobs and chunk.token_ids):
            return None
        lps = None
        if self.logprobs:
            lps = chat_logprobs(self.serving.tokenizer, chunk.token_ids, chunk.log_probs, chunk.top)
        return {"index": index, "delta": {"content": chunk.text}, "logprobs": lps, "finish_reason": None}

    def finish(self, index: int, reason: str) -> dict:
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}


def _choices(serving: Serving, gen: Generation, req: ChatCompletionRequest) -> list[dict]:
    role, echo = _response_role(req), _echo(req)
    choices = []
    for i, seq in sorted(gen.sequences.items()):
        lps = chat_logprobs(serving.tokenizer, seq.token_ids, seq.log_probs, seq.top) if req.logprobs else None
        choices.append({"index": i, "message": {"role": role, "content": echo + "".join(seq.text)},
                        "logprobs": lps, "finish_reason": seq.finish_reason(gen.params.max_tokens)})
    return choices


async def create_chat_completion(serving: Serving, req: ChatCompletionRequest, caller: Caller) -> Response:
    top_logprobs = _check(req)
    model = serving.check_model(req.model)
    prompt = serving.tokenizer.render_chat([{"role": m.role, "content": m.text()} for m in req.messages],
                                           req.add_generation_prompt, req.continue_final_message,
                                           req.chat_template_kwargs)
    max_tokens = next((v for v in (req.max_completion_tokens, req.max_tokens) if v is not None),
                      serving.config.default_max_tokens)
    params = generation_params(req, max_tokens, logprobs=req.logprobs, top_logprobs=top_logprobs)
    gen = Generation(serving.client, serving.config.model, prompt, params, caller)
    await serving.start_all([gen])
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model}
    if req.stream:
        opts = req.stream_options
        fmt = ChatFormat(serving, _response_role(req), _echo(req), req.logprobs)
        return sse_response(sse_events(fmt, [gen], {**base, "object": "chat.completion.chunk"},
                                       bool(opts and opts.include_usage), bool(opts and opts.continuous_usage_stats)))
    await serving.finish_all([gen])
    return JSONResponse({**base, "system_fingerprint": None, "choices": _choices(serving, gen, req),
                         "usage": usage([gen])})
