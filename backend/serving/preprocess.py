"""The preprocessing step: text -> token ids, word lists -> the anchor's [2, N] format, end/pad id defaults."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from transformers import AutoTokenizer

from backend.errors import InvalidRequestError


def load_tokenizer(tokenizer_dir: str | Path):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tok.clean_up_tokenization_spaces = False  # keep decode lossless: never rewrite " ," to ","
    return tok


def decode_utf8(value: bytes | str, name: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{name} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


# A stop / bad word list's size limit in UTF-8 bytes (all its words together): checked before tokenizing.
MAX_WORD_LIST_BYTES = 4096


class Preprocessor:
    def __init__(self, tokenizer_dir: str | Path, add_special_tokens: bool = False, max_words: int = 64,
                 max_prompt_bytes: int | None = None) -> None:
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.add_special_tokens = add_special_tokens
        self.max_words = max_words
        self.max_word_bytes = MAX_WORD_LIST_BYTES
        self.max_prompt_bytes = max_prompt_bytes  # checked before tokenizing: a huge prompt costs no CPU
        eos = self.tokenizer.eos_token_id
        self.end_id = eos
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos

    def encode_query(self, value: bytes | str) -> list[int]:
        size = len(value.encode() if isinstance(value, str) else value)
        if self.max_prompt_bytes is not None and size > self.max_prompt_bytes:
            raise InvalidRequestError(f"text_input is {size} bytes, more than the limit ({self.max_prompt_bytes})")
        text = decode_utf8(value, "text_input")
        if not text:
            raise InvalidRequestError("text_input is empty: a prompt of at least one character is needed")
        ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
        if not ids:
            raise InvalidRequestError("text_input tokenizes to no tokens")
        return ids

    def encode_queries(self, values: Sequence[bytes | str]) -> tuple[np.ndarray, np.ndarray]:
        """(B,) texts -> input ids (B, L) padded with pad_id, lengths (B, 1)."""
        rows = [self.encode_query(v) for v in values]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        return ids, np.array([[len(r)] for r in rows], dtype=np.int32)

    def no_decoder_input(self, decoder_query, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """DECODER_INPUT_ID (B, 0) and REQUEST_DECODER_INPUT_LEN (B, 1) of 0: a decoder-only model has no decoder
        input; a DECODER_QUERY (encoder-decoder models' decoder prompt) is refused rather than ignored."""
        if decoder_query is not None and any(decode_utf8(v, "decoder_text_input") for v in decoder_query.reshape(-1)):
            raise InvalidRequestError("decoder_text_input (DECODER_QUERY) is for encoder-decoder models; this model "
                                      "is decoder-only")
        return np.zeros((batch_size, 0), dtype=np.int32), np.zeros((batch_size, 1), dtype=np.int32)

    def word_lists(self, batch: Sequence[Sequence[bytes | str]] | None, batch_size: int, name: str) -> np.ndarray:
        """Words per row -> (B, 2, N): row 0 flat ids padded with 0, row 1 cumulative end offsets padded with -1."""
        rows = []
        for b in range(batch_size):
            raw = list(batch[b]) if batch is not None else []
            size = sum(len(w.encode() if isinstance(w, str) else w) for w in raw)
            if size > self.max_word_bytes:
                raise InvalidRequestError(f"{name} is {size} bytes, more than the limit ({self.max_word_bytes})")
            words = [w for w in (decode_utf8(w, name) for w in raw) if w]  # "" is no word ([[""]]: none)
            if len(words) > self.max_words:
                raise InvalidRequestError(f"{name} has {len(words)} words, more than the limit ({self.max_words})")
            rows.append([self.tokenizer.encode(w, add_special_tokens=False) for w in words])
        width = max([sum(len(w) for w in r) for r in rows] + [1])
        out = np.zeros((batch_size, 2, width), dtype=np.int32)
        out[:, 1, :] = -1
        for b, r in enumerate(rows):
            flat = [t for w in r for t in w]
            out[b, 0, : len(flat)] = flat
            out[b, 1, : len(r)] = np.cumsum([len(w) for w in r])
        return out
