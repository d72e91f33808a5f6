"""Forwarding a request to Triton's HTTP endpoint (loopback) and its response back, streamed unbuffered.

Headers pass through except the hop-by-hop ones; the body Triton gets is the one the front validated (decompressed
when the client compressed it). The response body is relayed as raw bytes chunk by chunk, so generate_stream's
Server-Sent Events and Triton's compressed or binary-extension responses reach the client as Triton wrote them.
"""
from __future__ import annotations

import zlib

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from frontend.json_guard import JsonBodyError

# RFC 9110 hop-by-hop headers, plus those the front recomputes (host, length, encoding of a decompressed body).
_DROP_REQUEST = frozenset({"host", "connection", "keep-alive", "proxy-connection", "te", "trailer",
                           "transfer-encoding", "upgrade", "content-length", "content-encoding"})
_DROP_RESPONSE = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                            "upgrade"})
# Content-Encoding values Triton 2.51 accepts on requests -> zlib wbits for decoding them.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The request body without its Content-Encoding, never inflating past max_bytes (a zip bomb stops there)."""
    if not encoding or encoding.lower() == "identity":
        return body
    wbits = _WBITS.get(encoding.lower())
    if wbits is None:
        raise JsonBodyError(f"unsupported Content-Encoding {encoding[:32]!r} (gzip, deflate or none)", status=415)
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise JsonBodyError(f"request body is not valid {encoding}: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise JsonBodyError(f"decompressed request body is larger than the limit ({max_bytes} bytes)", status=413)
    return out


def request_headers(request: Request, extra: dict[str, str] | None = None) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
    # httpx would otherwise ask Triton for gzip on the client's behalf, and the compressed body would be relayed
    # to a client that never said it could read one.
    headers.setdefault("accept-encoding", "identity")
    headers.update(extra or {})
    return headers


async def forward(client: httpx.AsyncClient, request: Request, path: str, body: bytes,
                  extra_headers: dict[str, str] | None = None) -> Response:
    """Send (method, path, body) to Triton and stream its answer back."""
    upstream = client.build_request(request.method, path, params=request.query_params, content=body,
                                    headers=request_headers(request, extra_headers))
    try:
        response = await client.send(upstream, stream=True)
    except httpx.TransportError as exc:
        return Response(f'{{"error":"tritonserver is not reachable: {type(exc).__name__}"}}', status_code=503,
                        media_type="application/json")
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}
    return StreamingResponse(response.aiter_raw(), status_code=response.status_code, headers=headers,
                             background=BackgroundTask(response.aclose))
