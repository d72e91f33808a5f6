"""Request bodies of /v1/completions and /v1/chat/completions (pydantic), as the openai SDK and vLLM send them.

Fields this server implements are declared; everything else lands in `model_extra` and is checked by
`refuse_unsupported`: OpenAI / vLLM fields we cannot honour pass only with a value that changes nothing (null,
empty, the default), otherwise 400 naming the field; a field nobody defines is refused as unknown. Nothing is
silently ignored.
"""
from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from frontend.openai_api.errors import bad_request, unsupported


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = True  # vLLM's default when the object is given
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = Field(default=None, max_length=256)
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_tokens: int = 0
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    # ours: the request's deadline (docs/rate_limiting.md)
    timeout_ms: int | None = None


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {} or v == ""


# Fields we do not implement -> which values are harmless (they ask for nothing we would skip).
_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "logit_bias": _empty, "best_of": _is(None, 1), "use_beam_search": _is(None, False), "length_penalty": _is(None, 1),
    "min_p": _is(None, 0), "top_a": _is(None, 0), "stop_token_ids": _empty, "include_stop_str_in_output": _is(None, False),
    "bad_words": _empty, "allowed_token_ids": _empty, "prompt_logprobs": _empty, "logits_processors": _empty,
    "guided_json": _empty, "guided_regex": _empty, "guided_choice": _empty, "guided_grammar": _empty,
    "structural_tag": _empty, "response_format": lambda v: _empty(v) or v == {"type": "text"},
    "truncate_prompt_tokens": _empty, "return_tokens_as_token_ids": _is(None, False), "priority": _is(None, 0),
    "cache_salt": _empty, "kv_transfer_params": _empty, "vllm_xargs": _empty,
    "skip_special_tokens": _is(None, True), "spaces_between_special_tokens": _is(None, True),
    "store": _is(None, False), "metadata": _empty, "service_tier": _is(None, "auto", "default"),
}
_UNSUPPORTED_COMPLETION = {"suffix": _empty}
_UNSUPPORTED_CHAT = {
    "tools": _empty, "tool_choice": _is(None, "none"), "functions": _empty, "function_call": _is(None, "none"),
    "parallel_tool_calls": _is(None, True, False), "audio": _empty, "modalities": lambda v: _empty(v) or v == ["text"],
    "prediction": _empty, "web_search_options": _empty, "reasoning_effort": _empty, "chat_template": _empty,
    "documents": _empty,
}


def refuse_unsupported(request: _Common) -> None:
    """400 for an extra field that is unknown, or known but set to something this server would not honour."""
    table = _UNSUPPORTED | (_UNSUPPORTED_CHAT if isinstance(request, ChatCompletionRequest) else _UNSUPPORTED_COMPLETION)
    for name, value in (request.model_extra or {}).items():
        harmless = table.get(name)
        if harmless is None:
            raise bad_request(f"unknown field `{name}`", name, code="unknown_parameter")
        if not harmless(value):
            raise unsupported(name)
