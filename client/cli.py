"""`python -m client "prompt" --max-tokens 64 [--protocol grpc|http] [--no-stream] ...`: print the
generated text as it arrives. Exit code 1, with the error on stderr, when generation fails."""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from typing import Iterator, Sequence

from client.errors import GenerationError
from client.grpc_client import GrpcLLMClient
from client.http_client import HttpLLMClient
from client.request import GenerationRequest
from client.response import TextChunk

# (flag, type, help) of the sampling options; each flag's dest is a GenerationRequest field.
SAMPLING_FLAGS: list[tuple[str, type, str]] = [
    ("--temperature", float, "sampling temperature"),
    ("--top-k", int, "sample from the k most likely tokens (0 = off)"),
    ("--top-p", float, "nucleus sampling probability mass, in (0, 1]"),
    ("--seed", int, "random seed"),
    ("--end-id", int, "end-of-sequence token id (default: the tokenizer's)"),
    ("--pad-id", int, "padding token id"),
    ("--min-tokens", int, "generate at least this many tokens"),
    ("--repetition-penalty", float, "repetition penalty (> 0, 1 = off)"),
    ("--presence-penalty", float, "presence penalty"),
    ("--frequency-penalty", float, "frequency penalty"),
    ("--length-penalty", float, "length penalty"),
]
OPTION_DESTS = [flag[2:].replace("-", "_") for flag, _, _ in SAMPLING_FLAGS] + [
    "stop_words", "bad_words", "exclude_input_in_output"
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritonllm-client", description=__doc__)
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="default grpc")
    parser.add_argument("--no-stream", action="store_true", help="wait for the whole text instead of streaming")
    parser.add_argument("--url", help="server address (default: localhost:8001 for grpc, "
                        "http://localhost:8000 for http)")
    parser.add_argument("--model", default="ensemble", help="model name (default ensemble)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the whole request")
    for flag, kind, text in SAMPLING_FLAGS:
        parser.add_argument(flag, type=kind, help=text)
    parser.add_argument("--stop-word", dest="stop_words", action="append", metavar="TEXT",
                        help="stop at this text (repeatable)")
    parser.add_argument("--bad-word", dest="bad_words", action="append", metavar="TEXT",
                        help="never generate this text (repeatable)")
    parser.add_argument("--exclude-input", dest="exclude_input_in_output", action="store_const", const=True,
                        help="leave the prompt out of the output")
    return parser


def request_from_args(args: argparse.Namespace) -> GenerationRequest:
    """The request the parsed arguments describe (raises ValueError when invalid)."""
    return GenerationRequest(
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        stream=not args.no_stream,
        **{name: getattr(args, name) for name in OPTION_DESTS},
    )


def stream_chunks(args: argparse.Namespace, req: GenerationRequest) -> Iterator[TextChunk]:
    """The chunks of `req` over the chosen protocol."""
    if args.protocol == "grpc":
        yield from GrpcLLMClient(args.url or "localhost:8001", args.model, args.timeout).generate(req)
        return
    client = HttpLLMClient(args.url or "http://localhost:8000", args.model, args.timeout)
    if req.stream:
        yield from client.generate_stream(req)
    else:
        yield client.complete(req)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        req = request_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        print_chunks(stream_chunks(args, req))
    except GenerationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def print_chunks(chunks: Iterator[TextChunk]) -> None:
    """Write each chunk's text as it arrives; end the line however the stream ends. Closing the
    iterator on the way out cancels the request when it ends early (an error, Ctrl-C)."""
    try:
        with closing(chunks):
            for chunk in chunks:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    finally:
        print(flush=True)
