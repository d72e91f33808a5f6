"""The model's tokenizer as the front needs it: the chat template (the checkpoint's own, from its tokenizer config
or chat_template.jinja, unless --chat-template overrides it) and token strings for log-probs. Loaded once, locally
(no hub access)."""
from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from frontend.openai_api.errors import bad_request

log = logging.getLogger("tritonllm.front")

NO_TEMPLATE = ("this model's tokenizer has no chat template: start the server with --chat-template FILE, or use "
               "/v1/completions")


class ModelTokenizer:
    def __init__(self, tokenizer_dir: Path | None, chat_template: Path | None = None) -> None:
        self.tokenizer = None
        self.reserved: frozenset[str] = frozenset()  # names chat_template_kwargs may not use (_reserved)
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            self.reserved = _reserved(self.tokenizer)
        self.template = chat_template.read_text() if chat_template else getattr(self.tokenizer, "chat_template", None)
        if not self.template:
            log.warning("front: %s", NO_TEMPLATE)

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool, continue_final_message: bool,
                    kwargs: dict[str, Any] | None) -> str:
        """The prompt text of a conversation (400 when there is no template or the template refuses it)."""
        if self.tokenizer is None or not self.template:
            raise bad_request(NO_TEMPLATE, "messages", code="chat_template_missing")
        if add_generation_prompt and continue_final_message:
            raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                              "continue_final_message")
        from jinja2 import TemplateError

        reserved = sorted(set(kwargs or ()) & self.reserved)
        if reserved:
            raise bad_request(f"chat_template_kwargs may not set {', '.join(map(repr, reserved))}: the server sets "
                              f"them (the request's own fields where there are any)", "chat_template_kwargs")
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(kwargs or {}))
        except TemplateError as exc:
            raise bad_request(f"the chat template refused the conversation: {exc}", "messages") from None
        except ValueError as exc:  # e.g. continue_final_message on a conversation it cannot continue
            raise bad_request(str(exc), "messages") from None
        except TypeError as exc:  # a template variable of the wrong type for what the template does with it
            raise bad_request(f"the chat template failed on this request: {exc}", "chat_template_kwargs") from None

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token as text on its own (OpenAI's `tokens` / `token`): a byte-level token that is part of a
        multi-byte character shows as U+FFFD, as other servers do; an id past the tokenizer's (a padded vocabulary's
        row, which the model may generate or rank among the top log-probs) as "", as the text holds nothing for it."""
        if self.tokenizer is None:
            raise bad_request("log-probs need the model's tokenizer: start the server with --tokenizer-dir",
                              "logprobs")
        pieces = self.tokenizer.convert_ids_to_tokens(ids)
        return ["" if p is None else self.tokenizer.convert_tokens_to_string([p]) for p in pieces]


def _reserved(tokenizer) -> frozenset[str]:
    """Names chat_template_kwargs may not use: apply_chat_template's own arguments, and the conversation under the
    names transformers renders it with (passed twice, they fail as a TypeError). Read once, at load."""
    names = set(inspect.signature(tokenizer.apply_chat_template).parameters) - {"kwargs"}
    return frozenset(names | {"messages", "conversation", "conversations"})
