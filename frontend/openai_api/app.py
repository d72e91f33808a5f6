"""The OpenAI-compatible API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions, /health, /version,
/metrics (routes.py). Bodies are read within the front's JSON limits and validated by pydantic; every error is
OpenAI's error object with its status (errors.py). Upstream is the ensemble over Triton's gRPC streaming API."""
from __future__ import annotations

from contextlib import asynccontextmanager

import tritonclient.grpc.aio as grpcclient
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from frontend.json_guard import JsonBodyError
from frontend.openai_api.auth import Authenticator
from frontend.openai_api.config import OpenAIConfig
from frontend.openai_api.context import Serving
from frontend.openai_api.errors import OpenAIError
from frontend.openai_api.metrics import FrontMetrics, MetricsMiddleware
from frontend.openai_api.routes import VERSION, service_router, v1_router, validation_error
from frontend.openai_api.tokenizer import ModelTokenizer


def create_app(config: OpenAIConfig) -> FastAPI:
    auth = Authenticator.from_limits_file(config.limits_file, config.tenant_header)  # a bad file fails here
    metrics = FrontMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = grpcclient.InferenceServerClient(config.triton_grpc_url)
        app.state.serving = Serving(config, client, ModelTokenizer(config.tokenizer_dir, config.chat_template),
                                    metrics)
        yield
        await client.close()

    app = FastAPI(title="tritonllm OpenAI-compatible API", version=VERSION, lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.include_router(v1_router(auth))
    app.include_router(service_router())

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(JsonBodyError)
    async def _json_error(request: Request, exc: JsonBodyError) -> JSONResponse:
        return OpenAIError(exc.status, str(exc)).response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return OpenAIError(exc.status_code, str(exc.detail)).response()

    return app
