"""Bounded JSON parsing for request bodies: a body the front accepts is small, shallow, plain JSON.

Why: tritonserver 2.51's HTTP JSON parser crashes (SIGSEGV) on a 400 KB body of 200,000 nested `[`, wraps integers
around INT32, and spends 40 s of CPU on 100,000 unknown fields. The front parses every JSON body itself first,
within these limits, so nothing unbounded reaches Triton:

- size: the body is read up to `max_body_bytes` (the caller stops reading there, see `read_body`);
- nesting: Python's C scanner refuses deep nesting with RecursionError at about the interpreter's recursion limit
  (1,000) without growing the C stack unboundedly; the parsed value is then checked against `max_depth`;
- keys: at most `max_keys` object keys in the whole document, no duplicate key in an object;
- numbers: NaN / Infinity literals are refused (not JSON), integers keep their exact value (range checks later);
- strings: an escaped lone surrogate (`"\\ud800"`: valid JSON, no UTF-8 encoding) is refused: every string is
  re-encoded toward Triton or the tokenizer, where it would fail as a 500.

`check_list_lengths` bounds arrays for bodies whose fields are validated one element at a time (the OpenAI API's:
pydantic builds one error per bad element, 3 million of them for a 6 MB body: seconds of the event loop's time).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, AsyncIterable


class JsonBodyError(ValueError):
    """The body is not acceptable JSON; the message says why (HTTP 400). `status` 413 for a body over the size."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class JsonLimits:
    max_body_bytes: int = 16 * 1024 * 1024  # infer bodies carry tensors; an LLM request is far smaller
    max_depth: int = 32  # the deepest legitimate body (infer's nested `data` arrays) is a few levels
    max_keys: int = 1024  # object keys in the whole document

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_depth", "max_keys"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


async def read_body(chunks: AsyncIterable[bytes], max_bytes: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes max_bytes: never buffers more than that."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise JsonBodyError(f"request body is larger than the limit ({max_bytes} bytes)", status=413)
        parts.append(chunk)
    return b"".join(parts)


class _KeyCounter:
    """object_pairs_hook: counts keys across the document, refuses duplicates, builds plain dicts."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.count = 0

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.count += len(pairs)
        if self.count > self.max_keys:
            raise JsonBodyError(f"JSON body has more than {self.max_keys} object keys")
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise JsonBodyError(f"JSON body has the key {duplicate[:64]!r} twice in one object")
        return obj


def _refuse_constant(name: str) -> Any:
    raise JsonBodyError(f"JSON body holds {name}, which is not JSON (numbers must be finite)")


def _depth(value: Any, max_depth: int) -> int:
    """Nesting depth of a parsed value (a scalar is 0), walked iteratively; stops past max_depth."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            depth += 1
            if depth > max_depth:
                return depth
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


# A \uD800-\uDFFF escape (surrogate): JSON allows them, paired or not; only a body holding one needs the walk.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _strings(value: Any):
    """Every string in a parsed value, keys included, walked iteratively."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _refuse_lone_surrogates(value: Any) -> None:
    for text in _strings(value):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JsonBodyError(f"JSON body holds a lone surrogate escape (\\u{ord(text[exc.start]):04x}) in a "
                                f"string: not a Unicode character (pair it, or send the character itself)") from None


def check_list_lengths(value: Any, max_items: int) -> None:
    """JsonBodyError naming the first array (by its path) with more than max_items elements."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            stack.extend((child, f"{path}.{key}" if path else str(key)) for key, child in node.items())
        elif isinstance(node, list):
            if len(node) > max_items:
                raise JsonBodyError(f"{path or 'the body'} holds {len(node)} items; at most {max_items} per array")
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node) if isinstance(child, (dict, list)))


def parse_json(body: bytes, limits: JsonLimits) -> Any:
    """Parse `body` as UTF-8 JSON within `limits` (raises JsonBodyError naming the problem)."""
    if len(body) > limits.max_body_bytes:
        raise JsonBodyError(f"request body is larger than the limit ({limits.max_body_bytes} bytes)", status=413)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonBodyError(f"request body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value = json.loads(text, object_pairs_hook=_KeyCounter(limits.max_keys), parse_constant=_refuse_constant)
    except RecursionError:
        raise JsonBodyError(f"JSON body is nested more than {limits.max_depth} levels deep") from None
    except json.JSONDecodeError as exc:
        raise JsonBodyError(f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's int digit limit
        if isinstance(exc, JsonBodyError):
            raise
        raise JsonBodyError(f"malformed JSON body: {exc}") from None
    if _depth(value, limits.max_depth) > limits.max_depth:
        raise JsonBodyError(f"JSON body is nested more than {limits.max_depth} levels deep")
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(value)
    return value
