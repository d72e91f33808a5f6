"""Streaming detokenization: chunks decoded with their context concatenate to exactly the non-streamed text.

Checked on the demo byte-level BPE tokenizer and on a SentencePiece-style one (Metaspace + byte fallback, as
Llama/Mistral), which strips the leading space of a decode's first token and spells rare characters as byte tokens.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from backend.serving.detokenizer import CONTEXT_TOKENS, decode_delta, decode_text
from backend.serving.preprocess import load_tokenizer

# Words with 2-, 3- and 4-byte characters, combining accents and emoji sequences (skin tone, ZWJ family).
WORDS = ["hello", "world", "def", "return", "naïve", "café", "résumé", "e\u0301", "straße", "中文", "日本語",
         "你好世界", "漢字かな", "😀", "👍🏽", "👨\u200d👩\u200d👧", "🎉ok", "x", "42", "(", "):", "Ωμέγα", "привет"]
SEPARATORS = [" ", " ", " ", "  ", "", "\n"]
# In the SentencePiece-style training text, so some multi-byte characters are whole tokens; emoji are not: bytes.
TRAINING_EXTRA = " naïve café résumé straße 中文 日本語 你好世界 Ωμέγα привет " * 8


@pytest.fixture(scope="module")
def demo_tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """BPE over Metaspace pieces with byte fallback, trained here on a few KB of local text (json's source)."""
    text = Path(json.__file__).read_text()[:6000] + TRAINING_EXTRA
    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator([text], trainers.BpeTrainer(vocab_size=800, special_tokens=["<unk>", "<s>", "</s>"],
                                                            show_progress=False))
    # The trainer does not add the 256 <0xXX> byte tokens byte fallback needs: rebuild the model with them.
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture(params=["demo", "sentencepiece"])
def tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer")


def random_text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 12))]
    return rng.choice(["", " ", "  "]) + "".join(words)


def random_chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    chunks, start = [], 0
    while start < len(ids):
        size = rng.randint(1, 5)
        chunks.append(ids[start : start + size])
        start += size
    return chunks


def streamed(tok, chunks: list[list[int]], skip_special_tokens: bool = True) -> str:
    """What a streaming client shows: each chunk decoded with the last CONTEXT_TOKENS ids sent before it."""
    sent: list[int] = []
    parts = []
    for k, chunk in enumerate(chunks):
        parts.append(decode_delta(tok, sent[-CONTEXT_TOKENS:], chunk, final=k == len(chunks) - 1,
                                  skip_special_tokens=skip_special_tokens))
        sent.extend(chunk)
    return "".join(parts)


def naive(tok, chunks: list[list[int]]) -> str:
    """Each chunk decoded on its own (tensorrtllm_backend's postprocessing)."""
    return "".join(decode_text(tok, chunk) for chunk in chunks)


def test_streamed_chunks_concatenate_to_the_full_decode(tokenizer):
    rng = random.Random(1234)
    naive_differs = 0
    for _ in range(300):
        ids = tokenizer.encode(random_text(rng), add_special_tokens=False)
        chunks = random_chunks(ids, rng)
        full = tokenizer.decode(ids, skip_special_tokens=True)
        assert streamed(tokenizer, chunks) == full, (ids, chunks)
        naive_differs += naive(tokenizer, chunks) != full
    assert naive_differs > 0  # the reason this module exists


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_are_kept_or_skipped_as_asked_and_the_invariant_holds(tokenizer, skip):
    """postprocessing's skip_special_tokens (the anchor's parameter): special tokens (a chat template's markers, the
    end token) among the ids are left out of the text, or spelled out, in streamed chunks as in the whole decode."""
    rng = random.Random(77)
    special = tokenizer.all_special_ids
    assert special
    spelled = 0
    for _ in range(100):
        ids = []  # special tokens between pieces of text (inside a character a byte-fallback decoder breaks it)
        for _ in range(rng.randint(1, 3)):
            ids += tokenizer.encode(random_text(rng), add_special_tokens=False) + [rng.choice(special)]
        full = tokenizer.decode(ids, skip_special_tokens=skip)
        assert streamed(tokenizer, random_chunks(ids, rng), skip_special_tokens=skip) == full, ids
        spelled += any(tokenizer.convert_ids_to_tokens(t) in full for t in special)
    assert spelled == (0 if skip else 100)


def test_byte_level_holds_for_any_ids_even_invalid_utf8(demo_tokenizer):
    """What a model emits need not spell valid UTF-8; the byte-level decoder replaces invalid bytes locally."""
    rng = random.Random(5)
    for _ in range(200):
        ids = [rng.randrange(1, len(demo_tokenizer)) for _ in range(rng.randint(1, 30))]
        chunks = random_chunks(ids, rng)
        assert streamed(demo_tokenizer, chunks) == demo_tokenizer.decode(ids, skip_special_tokens=True), chunks


@pytest.mark.parametrize("name, text", [("demo", "ok 😀 done"), ("sentencepiece", "hello world 😀")])
def test_naive_per_token_decoding_breaks_what_decode_delta_keeps(name, text, request):
    tok = request.getfixturevalue(f"{name}_tokenizer")
    ids = tok.encode(text, add_special_tokens=False)
    per_token = [[t] for t in ids]
    assert naive(tok, per_token) != text  # split emoji bytes become U+FFFD; SentencePiece also loses spaces
    assert streamed(tok, per_token) == text


def test_an_incomplete_character_is_held_back_until_completed(demo_tokenizer):
    tok = demo_tokenizer
    ids = tok.encode("a😀", add_special_tokens=False)
    head = ids[:-1]  # ends inside the emoji's 4 bytes
    assert "\ufffd" in decode_text(tok, head)
    assert decode_delta(tok, [], head, final=False) == "a"
    assert decode_delta(tok, head, ids[-1:], final=True) == "😀"
    assert decode_delta(tok, [], head, final=True).startswith("a\ufffd")  # the stream ended: show what is there


def test_sentencepiece_keeps_the_space_a_fresh_decode_would_strip(sentencepiece_tokenizer):
    tok = sentencepiece_tokenizer
    ids = tok.encode("hello world", add_special_tokens=False)
    split = next(i for i, t in enumerate(ids) if tok.convert_ids_to_tokens(t).startswith("▁") and i > 0)
    assert decode_text(tok, ids[split:]).startswith("w")  # a fresh decode drops the word's space
    assert decode_delta(tok, ids[:split], ids[split:], final=True) == " world"


class CountingDecoder:
    """A tokenizer whose decode calls are counted (each is a trip into the tokenizer, per streamed token)."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, 0

    def decode(self, ids, skip_special_tokens=False):
        self.calls += 1
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("final", [False, True])
def test_a_plain_token_costs_two_decodes_not_three(demo_tokenizer, final):
    """The window decoded to find a character start is the one decoded for the text: once, not again."""
    ids = demo_tokenizer.encode("def main(): return value", add_special_tokens=False)
    counted = CountingDecoder(demo_tokenizer)
    text = decode_delta(counted, ids[:-1], ids[-1:], final=final)
    assert text == decode_delta(demo_tokenizer, ids[:-1], ids[-1:], final=final) != ""
    assert counted.calls == 2  # the context alone, and the context with the new token
