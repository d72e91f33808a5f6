"""What every OpenAI route shares: settings, the Triton gRPC client, the tokenizer, metrics."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import tritonclient.grpc.aio as grpcclient

from frontend.openai_api.config import OpenAIConfig
from frontend.openai_api.errors import model_not_found
from frontend.openai_api.generation import Generation
from frontend.openai_api.metrics import FrontMetrics
from frontend.openai_api.tokenizer import ModelTokenizer


@dataclass
class Serving:
    config: OpenAIConfig
    client: grpcclient.InferenceServerClient
    tokenizer: ModelTokenizer
    metrics: FrontMetrics
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, model: str | None) -> str:
        """The served model id a request names (None: the served one), or 404."""
        if model is not None and model != self.config.model_id:
            raise model_not_found(model)
        return self.config.model_id

    def model_card(self) -> dict:
        """The model as /v1/models lists it (vLLM's extra fields root / parent included)."""
        return {"id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "tritonllm",
                "root": self.config.model_id, "parent": None}

    async def start_all(self, gens: list[Generation]) -> None:
        """Wait for every generation's first response; on any error stop them all and raise it."""
        results = await asyncio.gather(*(g.first() for g in gens), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(g.aclose() for g in gens), return_exceptions=True)
            raise errors[0]

    async def finish_all(self, gens: list[Generation]) -> None:
        """Collect every generation to its end (non-streamed answers); an error stops the others."""
        async def drain(gen: Generation) -> None:
            async for _ in gen.chunks():
                pass

        tasks = [asyncio.create_task(drain(g)) for g in gens]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(g.aclose() for g in gens), return_exceptions=True)
