"""Pre- and postprocessing steps on the demo tokenizer: text <-> ids, word lists, streamed text."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from backend.errors import InvalidRequestError
from backend.serving.postprocess import Postprocessor
from backend.serving.preprocess import Preprocessor
from backend.serving.triton_io import parse_word_list

TEXT = "def naïve(x):  return '中文 😀'\n"


@pytest.fixture(scope="module")
def pre(tokenizer_dir) -> Preprocessor:
    return Preprocessor(tokenizer_dir, max_words=3)


@pytest.fixture(scope="module")
def post(tokenizer_dir) -> Postprocessor:
    return Postprocessor(tokenizer_dir)


def test_encode_query_round_trips_bytes_and_str(pre):
    ids = pre.encode_query(TEXT.encode())
    assert ids == pre.encode_query(TEXT) and pre.tokenizer.decode(ids) == TEXT
    assert pre.end_id == pre.pad_id == pre.tokenizer.eos_token_id == 0


@pytest.mark.parametrize("value, message", [
    (b"", "text_input is empty"),
    ("", "text_input is empty"),
    (b"ok \xff\xfe", r"text_input is not valid UTF-8 \(invalid start byte at byte 3\)"),
    ("中".encode()[:2], r"text_input is not valid UTF-8 \(unexpected end of data at byte 0\)"),
])
def test_encode_query_refuses_empty_and_invalid_utf8(pre, value, message):
    with pytest.raises(InvalidRequestError, match=message):
        pre.encode_query(value)


def test_encode_queries_pads_to_the_longest(pre):
    ids, lengths = pre.encode_queries([b"a", TEXT.encode()])
    n = len(pre.encode_query(TEXT))
    assert ids.shape == (2, n) and ids.dtype == np.int32 and lengths.tolist() == [[1], [n]]
    assert ids[0, 1:].tolist() == [pre.pad_id] * (n - 1)


def test_word_lists_anchor_format(pre):
    batch = [[b"return", "中文 😀".encode(), b""], []]  # empty words are dropped
    out = pre.word_lists(batch, 2, "stop_words")
    words = [pre.tokenizer.encode(w, add_special_tokens=False) for w in ("return", "中文 😀")]
    flat = words[0] + words[1]
    assert out.shape == (2, 2, len(flat)) and out.dtype == np.int32
    assert out[0, 0].tolist() == flat
    assert out[0, 1].tolist() == [len(words[0]), len(flat)] + [-1] * (len(flat) - 2)
    assert out[1, 0].tolist() == [0] * len(flat) and out[1, 1].tolist() == [-1] * len(flat)
    assert parse_word_list(out, 0, "stop_words") == tuple(tuple(w) for w in words)  # the engine reads it back
    assert parse_word_list(out, 1, "stop_words") == ()


def test_word_lists_without_words(pre):
    out = pre.word_lists(None, 2, "bad_words")
    assert out.tolist() == [[[0], [-1]], [[0], [-1]]]


def test_word_lists_limits(pre):
    with pytest.raises(InvalidRequestError, match=r"bad_words has 4 words, more than the limit \(3\)"):
        pre.word_lists([[b"a", b"b", b"c", b"d"]], 1, "bad_words")
    with pytest.raises(InvalidRequestError, match="bad_words is not valid UTF-8"):
        pre.word_lists([[b"\xff"]], 1, "bad_words")


def test_texts_without_context_decode_the_tokens(post, pre):
    ids = pre.encode_query(TEXT)
    tokens = np.zeros((2, 1, len(ids) + 2), dtype=np.int32)
    tokens[0, 0, : len(ids)] = ids
    tokens[1, 0, :2] = ids[:2]
    out = post.texts(tokens, np.array([[len(ids)], [2]]), None, None)
    assert out.shape == (2,)  # flat, one entry per (row, beam), as the anchor's OUTPUT
    assert out[0] == TEXT.encode() and out[1] == pre.tokenizer.decode(ids[:2]).encode()


@pytest.mark.parametrize("tokens, lengths, message", [
    ([[[5, -3]]], [[2]], r"TOKENS_BATCH holds token ids outside the model's vocabulary \[0, \d+\): \[-3\]"),
    ([[[5, 2**30]]], [[2]], "TOKENS_BATCH holds token ids outside"),
    ([[[5, 6]]], [[3]], r"SEQUENCE_LENGTH values must be in \[0, 2\]"),
    ([[[5, 6]]], [[-1]], r"SEQUENCE_LENGTH values must be in \[0, 2\]"),
    ([[5, 6]], [[2]], r"TOKENS_BATCH must have shape \[batch, beams, tokens\]"),
    ([[[5, 6]]], [[1, 1]], r"SEQUENCE_LENGTH must have shape \[1, 1\]"),
])
def test_texts_refuse_what_cannot_be_decoded(post, tokens, lengths, message):
    with pytest.raises(InvalidRequestError, match=message):
        post.texts(np.array(tokens, dtype=np.int32), np.array(lengths, dtype=np.int32), None, None)


def test_a_padded_vocabulary_s_ids_past_the_tokenizer_decode_to_no_text(tokenizer_dir, tmp_path, pre):
    """A checkpoint whose config has more rows than the tokenizer has ids (Qwen2, Phi-3): the model may generate
    one mid-stream; it adds no text, as in HF's decode, instead of failing the stream. Past the rows: refused."""
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    known = len(pre.tokenizer)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": known + 64}))
    post = Postprocessor(tmp_path)
    ids = pre.encode_query(TEXT)
    stream = [*ids[:3], known, *ids[3:], known + 63]
    pieces = []
    for i, token in enumerate(stream):
        context = np.array(stream[max(0, i - 8) : i], dtype=np.int32).reshape(1, 1, -1)
        final = np.array([[i == len(stream) - 1]])
        pieces.append(post.texts(np.array([[[token]]], dtype=np.int32), np.array([[1]]), context, final)[0])
    assert b"".join(pieces).decode("utf-8") == TEXT == pre.tokenizer.decode(stream)
    past = rf"outside the model's vocabulary \[0, {known + 64}\): \[{known + 64}\]"
    with pytest.raises(InvalidRequestError, match=past):
        post.texts(np.array([[[5, known + 64]]], dtype=np.int32), np.array([[2]]), None, None)


@pytest.mark.parametrize("config", ['{"vocab_size": "many"}', '{"vocab_size": -5}', '{"vocab_size": 12.5}', "{}"])
def test_a_config_without_a_usable_vocab_size_leaves_the_tokenizer_s(tokenizer_dir, tmp_path, pre, config):
    """(A config.json that is not JSON fails the tokenizer's own loading first.)"""
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    (tmp_path / "config.json").write_text(config)
    assert Postprocessor(tmp_path).vocab_size == len(pre.tokenizer)


def test_ids_past_the_sequence_length_are_not_checked(post):
    out = post.texts(np.array([[[5, -1, -1]]], dtype=np.int32), np.array([[1]]), None, None)  # -1: padding
    assert out.shape == (1,)


def test_texts_with_context_stream_the_exact_text(post, pre):
    """The ensemble's streaming path: one token per response, stream_context_ids as tensorrt_llm sends them."""
    ids = pre.encode_query(TEXT)
    pieces = []
    for i, token in enumerate(ids):
        context = np.array(ids[max(0, i - 8) : i], dtype=np.int32).reshape(1, 1, -1)
        final = np.array([[i == len(ids) - 1]])
        pieces.append(post.texts(np.array([[[token]]], dtype=np.int32), np.array([[1]]), context, final)[0])
    assert "".join(p.decode("utf-8") for p in pieces) == TEXT  # each response is valid UTF-8 on its own


def test_prompt_bytes_limit_is_checked_before_tokenizing(pre):
    limited = Preprocessor(pre.tokenizer.name_or_path, max_prompt_bytes=8)
    assert limited.encode_query(b"def f():")
    with pytest.raises(InvalidRequestError, match=r"text_input is 9 bytes, more than the limit \(8\)"):
        limited.encode_query("def f(): ")


def test_word_lists_have_a_size_limit_checked_before_tokenizing(pre):
    with pytest.raises(InvalidRequestError, match=r"stop_words is 1000000 bytes, more than the limit \(4096\)"):
        pre.word_lists([[b"x" * 1_000_000]], 1, "stop_words")


def test_empty_words_mean_no_words(pre):
    assert pre.word_lists([[b""]], 1, "bad_words").tolist() == [[[0], [-1]]]


def test_a_decoder_only_model_has_no_decoder_input(pre):
    ids, lengths = pre.no_decoder_input(None, 2)
    assert ids.shape == (2, 0) and lengths.tolist() == [[0], [0]]
    assert pre.no_decoder_input(np.array([[b""]], dtype=object), 1)[0].shape == (1, 0)
    with pytest.raises(InvalidRequestError, match="decoder_text_input .* is for encoder-decoder models"):
        pre.no_decoder_input(np.array([[b"hello"]], dtype=object), 1)
