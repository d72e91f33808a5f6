"""Reads the server's Prometheus metrics endpoint."""
from __future__ import annotations

import re
import time
from typing import Callable

import requests


def scrape(metrics_port: int) -> str:
    return requests.get(f"http://localhost:{metrics_port}/metrics", timeout=10).text


def value(text: str, family: str, **labels: str) -> float | None:
    """The sample of `family` whose labels include `labels`, or None."""
    for line in text.splitlines():
        if not line.startswith(family + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{") : line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_until(metrics_port: int, family: str, accept: Callable[[float], bool], timeout_s: float = 30.0,
               **labels: str) -> float | None:
    """Poll (the engine publishes its gauges every 0.2 s) until accept(sample); returns the last value seen."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = value(scrape(metrics_port), family, **labels)
        if seen is not None and accept(seen):
            return seen
        time.sleep(0.1)
    return seen


def wait_for(metrics_port: int, family: str, expected: float, timeout_s: float = 30.0, **labels: str) -> float | None:
    return wait_until(metrics_port, family, lambda v: v == expected, timeout_s, **labels)
