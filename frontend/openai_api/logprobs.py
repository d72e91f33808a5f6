"""OpenAI's log-prob objects from the engine's per-token ids, log-probs and top alternatives.

Log-probs are those of the model's unmodified distribution (before temperature, penalties and masks), as vLLM
reports by default. Values are clamped at -9999.0 so the JSON stays finite (a masked token has -inf)."""
from __future__ import annotations

from frontend.openai_api.tokenizer import ModelTokenizer

FLOOR = -9999.0


def _lp(value: float) -> float:
    return max(FLOOR, value) if value == value else FLOOR  # NaN -> floor too


def completion_logprobs(tok: ModelTokenizer, ids: list[int], lps: list[float],
                        top: list[list[tuple[int, float]]], text_start: int) -> dict:
    """{tokens, token_logprobs, top_logprobs, text_offset}: top_logprobs[i] maps the sampled token and the top-k
    alternatives to their log-probs (vLLM's shape); text_offset[i] is where token i starts in the choice's text."""
    tokens = tok.token_strings(ids)
    offsets, at = [], text_start
    for text in tokens:
        offsets.append(at)
        at += len(text)
    tops = []
    for i, (token, lp) in enumerate(zip(tokens, lps)):
        entry = {token: _lp(lp)}
        if i < len(top):
            alternatives = tok.token_strings([t for t, _ in top[i]])
            entry.update({s: _lp(v) for s, (_, v) in zip(alternatives, top[i]) if s not in entry})
        tops.append(entry)
    return {"tokens": tokens, "token_logprobs": [_lp(x) for x in lps], "top_logprobs": tops, "text_offset": offsets}


def _token(text: str, lp: float) -> dict:
    return {"token": text, "logprob": _lp(lp), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tok: ModelTokenizer, ids: list[int], lps: list[float], top: list[list[tuple[int, float]]]) -> dict:
    """{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}, ...]}, ...]}."""
    content = []
    for i, (text, lp) in enumerate(zip(tok.token_strings(ids), lps)):
        entry = _token(text, lp)
        alternatives = top[i] if i < len(top) else []
        entry["top_logprobs"] = [_token(s, v) for s, (_, v) in
                                 zip(tok.token_strings([t for t, _ in alternatives]), alternatives)]
        content.append(entry)
    return {"content": content}
