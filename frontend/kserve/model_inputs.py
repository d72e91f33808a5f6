"""A served model's declared inputs and outputs (from Triton's model configuration), which the front validates
request bodies against. Fetched from Triton and cached briefly: a canary reload can change them."""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

# Triton config dtype (TYPE_X) -> KServe datatype name.
_DTYPES = {"TYPE_BOOL": "BOOL", "TYPE_UINT8": "UINT8", "TYPE_UINT16": "UINT16", "TYPE_UINT32": "UINT32",
           "TYPE_UINT64": "UINT64", "TYPE_INT8": "INT8", "TYPE_INT16": "INT16", "TYPE_INT32": "INT32",
           "TYPE_INT64": "INT64", "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_FP64": "FP64",
           "TYPE_STRING": "BYTES", "TYPE_BF16": "BF16"}
# Integer datatypes -> the closed range of values they hold.
INT_RANGES = {f"INT{b}": (-(2 ** (b - 1)), 2 ** (b - 1) - 1) for b in (8, 16, 32, 64)} | {
    f"UINT{b}": (0, 2**b - 1) for b in (8, 16, 32, 64)}
# Float datatypes -> largest finite magnitude (a bigger JSON number would become inf in the tensor).
FLOAT_MAX = {"FP16": 65504.0, "BF16": 3.3895313892515355e38, "FP32": 3.4028234663852886e38, "FP64": math.inf}
# Bytes per element in the binary tensor extension (BYTES: 4-byte length prefix + data each).
ELEMENT_SIZE = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2, "INT32": 4,
                "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}


@dataclass(frozen=True)
class Tensor:
    """One declared input or output: dims as declared (without the batch dim; -1 = any)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class ModelSignature:
    name: str
    batched: bool  # max_batch_size > 0: every tensor has a leading batch dim
    inputs: Mapping[str, Tensor]
    outputs: Mapping[str, Tensor]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelSignature":
        """From Triton's GET /v2/models/{m}/config JSON (dims may arrive as strings: they are int64 in protobuf)."""
        return cls(
            name=str(config.get("name", "")),
            batched=int(config.get("max_batch_size", 0) or 0) > 0,
            inputs={t.name: t for t in map(_tensor, config.get("input", []) or [])},
            outputs={t.name: t for t in map(_tensor, config.get("output", []) or [])},
        )


def _tensor(entry: Mapping[str, Any]) -> Tensor:
    dtype = str(entry.get("data_type", ""))
    return Tensor(name=str(entry["name"]), datatype=_DTYPES.get(dtype, dtype),
                  dims=tuple(int(d) for d in entry.get("dims", []) or []), optional=bool(entry.get("optional")))


class UpstreamError(Exception):
    """Triton answered the config request with an error: pass its status and body on to the client."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"upstream status {status}")
        self.status, self.body, self.content_type = status, body, content_type


# (path) -> (status, body, content type): how the cache asks Triton.
Fetch = Callable[[str], Awaitable[tuple[int, bytes, str]]]


class SignatureCache:
    """ModelSignature per (model, version), refetched after `ttl_s` (models can be reloaded with new configs)."""

    def __init__(self, fetch: Fetch, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch, self._ttl_s, self._clock = fetch, ttl_s, clock
        self._entries: dict[tuple[str, str], tuple[float, ModelSignature]] = {}

    async def get(self, model: str, version: str | None) -> ModelSignature:
        key = (model, version or "")
        hit = self._entries.get(key)
        if hit is not None and self._clock() - hit[0] < self._ttl_s:
            return hit[1]
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/config"
        status, body, content_type = await self._fetch(path)
        if status != 200:
            raise UpstreamError(status, body, content_type)
        signature = ModelSignature.from_config(json.loads(body))
        if len(self._entries) > 256:  # model names come from URLs: never let the cache grow without bound
            self._entries.clear()
        self._entries[key] = (self._clock(), signature)
        return signature
