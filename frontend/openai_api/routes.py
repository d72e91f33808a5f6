"""The OpenAI API's routes. Handlers find the shared Serving in `request.app.state.serving` (set at start-up)."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from frontend.json_guard import check_list_lengths, parse_json, read_body
from frontend.openai_api.auth import Authenticator
from frontend.openai_api.chat import create_chat_completion
from frontend.openai_api.completions import create_completion
from frontend.openai_api.context import Serving
from frontend.openai_api.errors import OpenAIError, bad_request
from frontend.openai_api.generation import Caller
from frontend.openai_api.protocol import ChatCompletionRequest, CompletionRequest

VERSION = "0.1.0"


def validation_error(exc: ValidationError | RequestValidationError) -> OpenAIError:
    """pydantic's first error as a 400 naming the field (dotted path without pydantic's internal segments)."""
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not str(p).startswith(("function-", "union["))]
    param = ".".join(loc) or None
    return bad_request(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param)


async def _parse(request: Request, model: type[BaseModel], serving: Serving) -> BaseModel:
    limits = serving.config.json_limits
    body = parse_json(await read_body(request.stream(), limits.max_body_bytes), limits)
    check_list_lengths(body, serving.config.max_list_items)  # before pydantic's per-element errors
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


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
    except asyncio.CancelledError:
        if not watcher.done():
            raise  # this handler itself is being cancelled (shutdown), not the client gone
        return Response(status_code=499)  # nobody reads it: the client went away (nginx's "client closed")
    finally:
        watcher.cancel()


def _serving(request: Request) -> Serving:
    return request.app.state.serving


def v1_router(auth: Authenticator) -> APIRouter:
    router = APIRouter()

    def upstream_headers(request: Request) -> dict[str, str]:
        """Authenticate (401) and name the tenant toward Triton."""
        claimed = request.headers.get(auth.tenant_header)
        tenant, key = auth.identify(request.headers.get("authorization"), claimed)
        return auth.upstream_headers(tenant, key)

    async def generate(request: Request, body_model: type, create: Callable) -> Response:
        headers = upstream_headers(request)  # before the body is read
        serving = _serving(request)
        req = await _parse(request, body_model, serving)
        request_id = request.headers.get("x-request-id")
        caller = Caller(headers=headers, timeout_ms=req.timeout_ms, user=req.user)
        if request_id and len(request_id) <= 128:
            caller = Caller(request_id, headers, req.timeout_ms, req.user)
        return await _until_disconnect(request, create(serving, req, caller))

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, CompletionRequest, create_completion)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, ChatCompletionRequest, create_chat_completion)

    @router.get("/v1/models")
    async def models(request: Request) -> dict:
        upstream_headers(request)
        return {"object": "list", "data": [_serving(request).model_card()]}

    @router.get("/v1/models/{model:path}")
    async def model(request: Request, model: str) -> dict:
        upstream_headers(request)
        _serving(request).check_model(model)
        return _serving(request).model_card()

    @router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(path: str) -> Response:
        raise OpenAIError(404, f"no route /v1/{path[:64]} on this server (routes: /v1/models, /v1/completions, "
                          "/v1/chat/completions)")

    return router


def service_router() -> APIRouter:
    """Unauthenticated: health (for probes), version, the API's own metrics."""
    router = APIRouter()

    @router.api_route("/health", methods=["GET", "HEAD"])
    @router.api_route("/ping", methods=["GET", "POST"])
    async def health(request: Request) -> Response:
        """200 when Triton is live and the model ready; 503 otherwise (empty body, as vLLM)."""
        serving = _serving(request)
        try:
            ready = await serving.client.is_server_live() and await serving.client.is_model_ready(serving.config.model)
        except Exception:  # any transport failure means "not ready"; the reason is not the prober's business
            ready = False
        return Response(status_code=200 if ready else 503)

    @router.get("/version")
    async def version() -> dict:
        return {"version": VERSION}

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(_serving(request).metrics.exposition(), media_type="text/plain; version=0.0.4")

    return router
