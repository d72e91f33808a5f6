"""Streaming detokenization whose chunks concatenate to exactly the non-streamed text.

Decoding each streamed chunk on its own (as tensorrtllm_backend's postprocessing does) loses the leading space
SentencePiece tokenizers strip from a decode's first token and splits multi-byte characters across chunks.
Here each chunk is decoded together with the few tokens before it (its context), starting at a character
boundary, and the tokens of an incomplete character at the end (decoded as U+FFFD) are held back until the
token that completes it arrives, or the stream ends.

Invariant: for output tokens split into chunks c1..cn, with context_k = the last CONTEXT_TOKENS tokens before ck,
    "".join(decode_delta(tok, context_k, ck, final=(k == n))) == tok.decode(c1 + ... + cn)
It holds for any ids under a byte-level decoder (invalid bytes become U+FFFD locally), and for ids that spell
valid UTF-8 under a byte-fallback one, which turns a whole run of byte tokens with an invalid byte into U+FFFD:
no bounded context reproduces that.
"""
from __future__ import annotations

from typing import Protocol, Sequence

# A UTF-8 character has at most 4 bytes and a token at least one byte: an incomplete character at the end of a
# decode spans at most 3 tokens, and a context that starts mid-character reaches a character start within 3 tokens.
_MAX_PARTIAL_TOKENS = 3
# Room for both (3 + 3) and a word boundary before the chunk.
CONTEXT_TOKENS = 8
_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def decode_text(tokenizer: Decoder, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


class _Decodes:
    """decode_text with each distinct id run decoded once: one decode_delta decodes its whole window up to three
    times (the character-start probe, the settled text, the final text), a tokenizer call each."""

    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.seen: dict[tuple[int, ...], str] = {}

    def __call__(self, ids: list[int]) -> str:
        key = tuple(ids)
        if key not in self.seen:
            self.seen[key] = decode_text(self.tokenizer, key, self.skip_special_tokens)
        return self.seen[key]


def _complete(decode: _Decodes, ids: list[int]) -> str | None:
    """The text of ids without the tokens of a trailing incomplete character; None if no cut ends cleanly.

    The incomplete character's tokens are dropped, not just its U+FFFD: a byte-fallback decoder (SentencePiece
    style) turns a whole run of byte tokens into U+FFFD when the run ends mid-character.
    """
    for cut in range(min(_MAX_PARTIAL_TOKENS, len(ids)) + 1):
        text = decode(ids[: len(ids) - cut])
        if not text.endswith(_REPLACEMENT):
            return text
    return None


def _settled(decode: _Decodes, ids: list[int]) -> str:
    """The text of ids that more tokens cannot change."""
    text = _complete(decode, ids)
    return text if text is not None else decode(ids).rstrip(_REPLACEMENT)  # invalid bytes


def _char_start(decode: _Decodes, ids: list[int], limit: int) -> int:
    """The first index below limit where a character starts (its decode has no leading U+FFFD); 0 if none."""
    for start in range(min(limit, _MAX_PARTIAL_TOKENS + 1)):
        text = _complete(decode, ids[start:])
        if text is not None and not text.startswith(_REPLACEMENT):
            return start
    return 0


def decode_delta(tokenizer: Decoder, context_ids: Sequence[int], new_ids: Sequence[int], final: bool,
                 skip_special_tokens: bool = True) -> str:
    """The text that new_ids add after context_ids (see the module's invariant; the tokenizer's decode with
    skip_special_tokens as given)."""
    ids = list(context_ids) + list(new_ids)
    decode = _Decodes(tokenizer, skip_special_tokens)
    # A context cut mid-character decodes its first bytes as U+FFFD (a byte-fallback decoder: its whole byte run).
    start = _char_start(decode, ids, len(context_ids))
    before = _settled(decode, ids[start : len(context_ids)])
    after = decode(ids[start:]) if final else _settled(decode, ids[start:])
    # HF decoders are prefix-stable from a character start once a trailing partial character is set aside.
    return after[len(before) :]
