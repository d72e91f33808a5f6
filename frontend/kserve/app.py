"""The public KServe v2 HTTP surface: every /v2 route of Triton's HTTP API, forwarded to Triton on loopback after
the body passed the front's limits (json_guard) and, for infer / generate, the model's declared inputs (validate).

Routes: health, server and model metadata / config / stats, infer (JSON or tritonclient's binary tensor extension:
header Inference-Header-Content-Length), generate and generate_stream (SSE passed through unbuffered), repository
index / load / unload, shared memory, trace and logging (Triton enforces the admin header on those; it passes
through). Errors the front raises are Triton's shape: {"error": "<message>"}.
"""
from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from frontend.json_guard import JsonBodyError, JsonLimits, parse_json, read_body
from frontend.kserve.forward import decompress, forward
from frontend.kserve.model_inputs import SignatureCache, UpstreamError
from frontend.kserve.validate import KNOWN_PARAMETERS, RequestError, validate_generate, validate_infer

BINARY_HEADER = "inference-header-content-length"  # tritonclient's binary tensor extension
_METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]


@dataclass(frozen=True)
class KServeConfig:
    triton_http_url: str  # Triton's own HTTP endpoint, e.g. http://127.0.0.1:8003 (bound to loopback)
    limits: JsonLimits = field(default_factory=JsonLimits)
    parameters: frozenset[str] = KNOWN_PARAMETERS  # request parameters allowed besides the model's inputs

    def __post_init__(self) -> None:
        if not self.triton_http_url.startswith(("http://", "https://")):
            raise ValueError(f"triton_http_url must be an http(s) URL, got {self.triton_http_url!r}")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(config: KServeConfig) -> FastAPI:
    state: dict[str, object] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # No read timeout: a generation may stream for minutes; Triton ends it (max_tokens, timeout_ms, cancel).
        client = httpx.AsyncClient(base_url=config.triton_http_url, timeout=httpx.Timeout(10.0, read=None),
                                   limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))
        state["client"] = client
        state["signatures"] = SignatureCache(lambda path: _get(client, path))
        yield
        await client.aclose()

    app = FastAPI(title="tritonllm KServe v2 front", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    async def _body(request: Request) -> bytes:
        raw = await read_body(request.stream(), config.limits.max_body_bytes)
        return decompress(raw, request.headers.get("content-encoding"), config.limits.max_body_bytes)

    @app.exception_handler(JsonBodyError)
    async def _json_error(request: Request, exc: JsonBodyError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(UpstreamError)
    async def _upstream_error(request: Request, exc: UpstreamError) -> Response:
        return Response(exc.body, status_code=exc.status, media_type=exc.content_type or None)

    async def generate_route(request: Request) -> Response:
        model, version = request.path_params["model"], request.path_params.get("version")
        body = parse_json(await _body(request), config.limits)
        validate_generate(body, await state["signatures"].get(model, version), config.parameters,
                          stream=request.url.path.endswith("/generate_stream"))
        return await forward(state["client"], request, request.url.path, _compact(body))

    async def infer_route(request: Request) -> Response:
        model, version = request.path_params["model"], request.path_params.get("version")
        body = await _body(request)
        json_size = _json_size(request, len(body))
        header = parse_json(body[:json_size], config.limits)
        validate_infer(header, await state["signatures"].get(model, version), len(body) - json_size,
                       config.parameters)
        return await forward(state["client"], request, request.url.path, body)

    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.add_route(f"{prefix}/generate", generate_route, methods=["POST"])
        app.add_route(f"{prefix}/generate_stream", generate_route, methods=["POST"])
        app.add_route(f"{prefix}/infer", infer_route, methods=["POST"])

    @app.api_route("/v2", methods=_METHODS)
    @app.api_route("/v2/{path:path}", methods=_METHODS)
    async def other_route(request: Request) -> Response:
        body = await _body(request)
        if body.strip():
            parse_json(body, config.limits)  # repository / shared-memory / trace / logging bodies are small JSON
        return await forward(state["client"], request, request.url.path, body)

    return app


async def _get(client: httpx.AsyncClient, path: str) -> tuple[int, bytes, str]:
    try:
        response = await client.get(path)
    except httpx.TransportError as exc:
        return 503, f'{{"error":"tritonserver is not reachable: {type(exc).__name__}"}}'.encode(), "application/json"
    return response.status_code, response.content, response.headers.get("content-type", "")


def _json_size(request: Request, body_size: int) -> int:
    """Where the JSON header ends: the whole body, or the binary extension's Inference-Header-Content-Length."""
    value = request.headers.get(BINARY_HEADER)
    if value is None:
        return body_size
    if not (value.isascii() and value.isdigit()) or int(value) > body_size:  # "²" is a digit to str.isdigit
        raise JsonBodyError(f"{BINARY_HEADER} must be an integer within the body size ({body_size}), got "
                            f"{value[:32]!r}")
    return int(value)


def _compact(body: object) -> bytes:
    """The validated body, as compact JSON: exactly what was checked is what Triton parses."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
