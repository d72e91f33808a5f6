"""Server-Sent Events parsing, for Triton's generate_stream endpoint (`data: {json}` events)."""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator


def parse_sse(lines: Iterable[bytes | str]) -> Iterator[str]:
    """Yield the data of each event in a stream of lines (line endings optional).

    WHATWG rules, as far as data goes: an event ends at a blank line; its `data:` lines are joined
    with newlines (one space after the colon dropped); comments (`:...`) and other fields are skipped.
    A last event without its closing blank line is still yielded.
    """
    data: list[str] = []
    for raw in lines:
        line = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
            data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def parse_sse_json(lines: Iterable[bytes | str]) -> Iterator[dict[str, Any]]:
    """The events of `parse_sse`, each decoded as a JSON object."""
    for data in parse_sse(lines):
        event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError(f"expected a JSON object in the event stream, got {data!r}")
        yield event
