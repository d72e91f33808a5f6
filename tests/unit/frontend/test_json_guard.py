"""Bounded JSON parsing: size, nesting, keys, duplicates, non-JSON constants, encodings; refusals name the problem."""
from __future__ import annotations

import asyncio
import time

import pytest

from frontend.json_guard import JsonBodyError, JsonLimits, check_list_lengths, parse_json, read_body

LIMITS = JsonLimits(max_body_bytes=1 << 20, max_depth=8, max_keys=16)


def test_plain_bodies_parse_with_exact_integers():
    assert parse_json(b'{"a": [1, 2, {"b": 18446744073709551616}], "c": "\xc3\xa9"}', LIMITS) == {
        "a": [1, 2, {"b": 2**64}], "c": "é"}


@pytest.mark.parametrize("body, message", [
    (b"[" * 200_000 + b"]" * 200_000, "nested more than 8 levels"),  # RecursionError in the C scanner
    (b"[" * 9 + b"]" * 9, "nested more than 8 levels"),  # within the recursion limit, over ours
    (b'{"a": 1, "a": 2}', "key 'a' twice"),
    (b'{"a": NaN}', "not JSON"),
    (b'{"a": Infinity}', "not JSON"),
    (b'{"a": 1', "malformed JSON body"),
    (b"\xff", "not UTF-8"),
    (b'{"n": ' + b"9" * 5000 + b"}", "malformed JSON body"),  # past Python's int digit limit
    (b"{" + b",".join(b'"k%d": 0' % i for i in range(17)) + b"}", "more than 16 object keys"),
])
def test_refusals_name_the_problem(body, message):
    with pytest.raises(JsonBodyError, match=message) as err:
        parse_json(body, LIMITS)
    assert err.value.status == 400


def test_deep_nesting_is_refused_quickly():
    start = time.perf_counter()
    with pytest.raises(JsonBodyError):
        parse_json(b'{"x":' + b"[" * 200_000 + b"]" * 200_000 + b"}", JsonLimits())
    assert time.perf_counter() - start < 1.0  # measured ~1 ms: the scanner stops at its recursion limit


def test_size_limit_is_413():
    with pytest.raises(JsonBodyError, match="larger than the limit") as err:
        parse_json(b"[" + b"0," * 600_000 + b"0]", LIMITS)
    assert err.value.status == 413


def test_read_body_stops_at_the_limit():
    async def chunks(n):
        for _ in range(n):
            yield b"x" * 1000

    assert asyncio.run(read_body(chunks(3), 3000)) == b"x" * 3000
    with pytest.raises(JsonBodyError) as err:
        asyncio.run(read_body(chunks(5), 3000))
    assert err.value.status == 413


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_depth must be >= 1"):
        JsonLimits(max_depth=0)


@pytest.mark.parametrize("body", [b'{"text_input": "\\ud800x"}', b'{"a": ["ok", "\\uDFFF"]}', b'{"\\ud83d": 1}',
                                  b'["\\ude00\\ud83d"]'])  # low before high: two lone halves
def test_lone_surrogate_escapes_are_refused(body):
    """Valid JSON, but no UTF-8 encodes them: the string would fail as a 500 where it is sent on."""
    with pytest.raises(JsonBodyError, match="lone surrogate"):
        parse_json(body, LIMITS)


def test_a_surrogate_pair_is_one_character():
    assert parse_json(b'{"t": "\\ud83d\\ude00 \\u00e9"}', LIMITS) == {"t": "\U0001F600 \u00e9"}


def test_list_lengths_are_bounded_naming_the_path():
    check_list_lengths({"prompt": ["a"] * 4, "messages": [{"content": [1, 2]}]}, 4)
    with pytest.raises(JsonBodyError, match=r"^prompt holds 5 items; at most 4"):
        check_list_lengths({"prompt": ["a"] * 5}, 4)
    with pytest.raises(JsonBodyError, match=r"^messages\[1\]\.content holds 6 items"):
        check_list_lengths({"messages": [{"content": []}, {"content": [0] * 6}]}, 4)
    with pytest.raises(JsonBodyError, match=r"^the body holds 5 items"):
        check_list_lengths([0] * 5, 4)


def test_a_huge_list_is_refused_quickly():
    started = time.monotonic()
    with pytest.raises(JsonBodyError, match="3000000 items"):
        check_list_lengths({"prompt": [0] * 3_000_000}, 4096)
    assert time.monotonic() - started < 0.5
