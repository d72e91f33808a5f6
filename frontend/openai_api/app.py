"""The OpenAI-compatible API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions, /health, /version,
/metrics. Bodies are read within the front's JSON limits and validated by pydantic; every error is OpenAI's error
object with its status (errors.py). Upstream is the ensemble over Triton's gRPC streaming API."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Awaitable, Callable

import tritonclient.grpc.aio as grpcclient
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from frontend.json_guard import JsonBodyError, parse_json, read_body
from frontend.openai_api.auth import Authenticator
from frontend.openai_api.chat import create_chat_completion
from frontend.openai_api.completions import create_completion
from frontend.openai_api.config import OpenAIConfig
from frontend.openai_api.context import Serving
from frontend.openai_api.errors import OpenAIError, bad_request
from frontend.openai_api.generation import Caller
from frontend.openai_api.metrics import FrontMetrics
from frontend.openai_api.protocol import ChatCompletionRequest, CompletionRequest
from frontend.openai_api.tokenizer import ModelTokenizer

VERSION = "0.1.0"


def _validation_error(exc: ValidationError | RequestValidationError) -> OpenAIError:
    """pydantic's first error as a 400 naming the field (dotted path without pydantic's internal segments)."""
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not str(p).startswith(("function-", "union["))]
    param = ".".join(loc) or None
    return bad_request(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param)


async def _parse(request: Request, model: type[BaseModel], config: OpenAIConfig) -> BaseModel:
    body = parse_json(await read_body(request.stream(), config.json_limits.max_body_bytes), config.json_limits)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None


async def _until_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Run `work`, cancelling it (and so its Triton request) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    finally:
        watcher.cancel()


class MetricsMiddleware:
    """Counts /v1 requests by route and status and times them to the last byte (a streamed answer included);
    plain ASGI, so streamed chunks pass straight through."""

    def __init__(self, app, metrics: Callable[[], Serving | None]) -> None:
        self.app, self.serving = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        serving = self.serving()
        if scope["type"] != "http" or serving is None or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        route, status = _route(scope["path"]), [500]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        with serving.metrics.track(route):
            try:
                await self.app(scope, receive, send_status)
            finally:
                serving.metrics.count(route, status[0])


def _route(path: str) -> str:
    """A metric label from a path: the known routes, else one bucket (paths come from clients)."""
    if path in ("/v1/completions", "/v1/chat/completions", "/v1/models"):
        return path
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"


def create_app(config: OpenAIConfig) -> FastAPI:
    state: dict[str, Serving] = {}
    auth = Authenticator.from_limits_file(config.limits_file, config.tenant_header)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = grpcclient.InferenceServerClient(config.triton_grpc_url)
        state["serving"] = Serving(config, client, ModelTokenizer(config.tokenizer_dir, config.chat_template),
                                   FrontMetrics())
        yield
        await client.close()

    app = FastAPI(title="tritonllm OpenAI-compatible API", version=VERSION, lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(JsonBodyError)
    async def _json_error(request: Request, exc: JsonBodyError) -> JSONResponse:
        return OpenAIError(exc.status, str(exc)).response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return OpenAIError(exc.status_code, str(exc.detail)).response()

    app.add_middleware(MetricsMiddleware, metrics=lambda: state.get("serving"))

    def _upstream_headers(request: Request) -> dict[str, str]:
        """Authenticate and name the tenant toward Triton."""
        tenant, key = auth.identify(request.headers.get("authorization"), request.headers.get(config.tenant_header))
        return auth.upstream_headers(tenant, key)

    def _caller(request: Request, headers: dict[str, str], req: CompletionRequest | ChatCompletionRequest) -> Caller:
        request_id = request.headers.get("x-request-id")
        if request_id and len(request_id) <= 128:
            return Caller(request_id=request_id, headers=headers, timeout_ms=req.timeout_ms, user=req.user)
        return Caller(headers=headers, timeout_ms=req.timeout_ms, user=req.user)

    async def _generate(request: Request, body_model: type, create: Callable) -> Response:
        headers = _upstream_headers(request)  # 401 before the body is read
        req = await _parse(request, body_model, config)
        return await _until_disconnect(request, create(state["serving"], req, _caller(request, headers, req)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, CompletionRequest, create_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, ChatCompletionRequest, create_chat_completion)

    def _card() -> dict:
        serving = state["serving"]
        return {"id": config.model_id, "object": "model", "created": serving.created, "owned_by": "tritonllm",
                "root": config.model_id, "parent": None}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        _upstream_headers(request)
        return {"object": "list", "data": [_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str) -> dict:
        _upstream_headers(request)
        state["serving"].check_model(model)
        return _card()

    @app.api_route("/health", methods=["GET", "HEAD"])
    @app.api_route("/ping", methods=["GET", "POST"])
    async def health() -> Response:
        """200 when Triton is live and the model ready; 503 otherwise (empty body, as vLLM)."""
        client = state["serving"].client
        try:
            ready = await client.is_server_live() and await client.is_model_ready(config.model)
        except Exception:  # any transport failure means "not ready"; the reason is not the prober's business
            ready = False
        return Response(status_code=200 if ready else 503)

    @app.get("/version")
    async def version() -> dict:
        return {"version": VERSION}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state["serving"].metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(path: str) -> Response:
        raise OpenAIError(404, f"no route /v1/{path[:64]} on this server (routes: /v1/models, /v1/completions, "
                          "/v1/chat/completions)")

    return app
