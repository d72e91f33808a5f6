"""`python -m frontend`: the public HTTP front of a running tritonserver (started by `python -m ensembles serve`).

    python -m frontend --triton-http-url http://127.0.0.1:8003 --triton-grpc-url 127.0.0.1:8001 \\
        --http-port 8000 --openai-port 9000 --tokenizer-dir DIR [--chat-template FILE] [--limits-file FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from frontend.json_guard import JsonLimits
from frontend.kserve.app import KServeConfig
from frontend.kserve.app import create_app as create_kserve_app
from frontend.kserve.validate import KNOWN_PARAMETERS
from frontend.server import Listener, serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m frontend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="0.0.0.0", help="address the public ports bind (default all)")
    p.add_argument("--http-port", type=int, default=8000, help="KServe v2 HTTP proxy port; 0: off")
    p.add_argument("--openai-port", type=int, default=9000, help="OpenAI-compatible API port; 0: off")
    p.add_argument("--triton-http-url", default="http://127.0.0.1:8003", help="Triton's own (loopback) HTTP")
    p.add_argument("--triton-grpc-url", default="127.0.0.1:8001", help="Triton's gRPC, for the OpenAI API")
    p.add_argument("--max-body-bytes", type=int, default=JsonLimits.max_body_bytes)
    p.add_argument("--max-json-depth", type=int, default=JsonLimits.max_depth)
    p.add_argument("--max-json-keys", type=int, default=JsonLimits.max_keys)
    p.add_argument("--allow-parameter", action="append", default=[], metavar="NAME",
                   help="a request parameter to accept besides the known ones (repeatable)")
    from frontend.openai_api.config import add_arguments

    add_arguments(p)
    return p


def listeners(args: argparse.Namespace) -> list[Listener]:
    limits = JsonLimits(args.max_body_bytes, args.max_json_depth, args.max_json_keys)
    out = []
    if args.http_port:
        kserve = KServeConfig(args.triton_http_url, limits, KNOWN_PARAMETERS | frozenset(args.allow_parameter))
        out.append(Listener("KServe v2 HTTP (proxy to Triton)", create_kserve_app(kserve), args.host, args.http_port))
    if args.openai_port:
        from frontend.openai_api.app import create_app as create_openai_app
        from frontend.openai_api.config import config_from_args

        config = config_from_args(args, limits)
        out.append(Listener("OpenAI-compatible API", create_openai_app(config), args.host, args.openai_port))
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per forwarded request otherwise
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        apps = listeners(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(apps))
    return 0
