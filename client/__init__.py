"""Clients of the tritonllm ensemble (same tensor contract as tensorrtllm_backend's inflight_batcher_llm)."""

from client.errors import GenerationError
from client.grpc_client import GrpcLLMClient
from client.http_client import HttpLLMClient
from client.request import GenerationRequest
from client.response import TextChunk

__all__ = ["GenerationError", "GenerationRequest", "GrpcLLMClient", "HttpLLMClient", "TextChunk"]
