"""The OpenAI API's settings: where Triton is, which model it serves under which name, chat template, keys."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from frontend.json_guard import JsonLimits

_HEADER = re.compile(r"^[a-z0-9-]{1,64}$")


@dataclass(frozen=True)
class OpenAIConfig:
    triton_grpc_url: str = "127.0.0.1:8001"
    model: str = "ensemble"  # the Triton model requests go to
    served_model_name: str | None = None  # the id clients use; None: `model`
    tokenizer_dir: Path | None = None  # chat template source; None: chat requests get 400
    chat_template: Path | None = None  # a jinja file that overrides the tokenizer's template
    limits_file: Path | None = None  # API keys (sha256) of tenants; none there: no key needed
    tenant_header: str = "x-tenant-id"  # the gRPC header Triton forwards to the models as the tenant id
    default_max_tokens: int = 512  # chat requests without max_tokens / max_completion_tokens
    # Sequences one completion request may start (prompts x n): 1,000 prompts x n=4 in one ~20 KB request queued
    # 4,000 sequences ahead of everyone else's requests for minutes.
    max_sequences: int = 64
    # Items of any one array in a body (prompt lists, stop lists, message parts): validation errors are built per
    # element, and 3 million of them held the event loop (every stream) for 18 s.
    max_list_items: int = 4096
    json_limits: JsonLimits = field(default_factory=JsonLimits)

    def __post_init__(self) -> None:
        if not _HEADER.match(self.tenant_header):
            raise ValueError(f"tenant_header must be a lower-case header name, got {self.tenant_header!r}")
        for name in ("default_max_tokens", "max_sequences", "max_list_items"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("tokenizer_dir", "chat_template", "limits_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).exists():
                raise ValueError(f"{name} {path} does not exist")

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="ensemble", help="the Triton model OpenAI requests go to")
    p.add_argument("--served-model-name", help="the model id OpenAI clients use (default: --model)")
    p.add_argument("--tokenizer-dir", type=Path, help="the model's tokenizer (its chat template)")
    p.add_argument("--chat-template", type=Path, help="a jinja chat template file (default: the tokenizer's)")
    p.add_argument("--limits-file", type=Path, help="tenants and their API keys (docs/front.md)")
    p.add_argument("--tenant-header", default="x-tenant-id")
    p.add_argument("--default-max-tokens", type=int, default=OpenAIConfig.default_max_tokens)
    p.add_argument("--max-sequences", type=int, default=OpenAIConfig.max_sequences,
                   help="most sequences one completion request may start (prompts x n)")
    p.add_argument("--max-list-items", type=int, default=OpenAIConfig.max_list_items,
                   help="most items in any one JSON array of an OpenAI request body")


def config_from_args(args: argparse.Namespace, limits: JsonLimits) -> OpenAIConfig:
    return OpenAIConfig(triton_grpc_url=args.triton_grpc_url, model=args.model,
                        served_model_name=args.served_model_name, tokenizer_dir=args.tokenizer_dir,
                        chat_template=args.chat_template, limits_file=args.limits_file,
                        tenant_header=args.tenant_header, default_max_tokens=args.default_max_tokens,
                        max_sequences=args.max_sequences, max_list_items=args.max_list_items, json_limits=limits)
