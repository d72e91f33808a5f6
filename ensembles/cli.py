"""`python -m ensembles {render,serve,canary,keys}`: render the model repository, serve it with tritonserver, roll
out canary versions (ensembles/canary_cli.py), mint tenants' API keys (ensembles/keys_cli.py)."""
from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from dataclasses import fields
from pathlib import Path

from backend.serving.cpu_placement import CpuSplit, parse_cpu_list
from ensembles import artifacts
from ensembles.render import REPO_ROOT, RepoSpec, render
from ensembles.server import ServerOptions
from ensembles.stack import DEFAULT_TRITON_HTTP_PORT, LOOPBACK, FrontOptions, FrontProcess
from ensembles.supervisor import Supervisor, SupervisorOptions

DEFAULT_REPO_OUT = REPO_ROOT / "build" / "model_repository"
# RepoSpec fields settable from the command line (--max-batch-size 8 ...).
_TUNABLE = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block",
            "max_tokens_in_paged_kv_cache", "batch_scheduler_policy", "engine_device", "engine_threads",
            "engine_adaptive_threads", "exclude_input_in_output", "enable_kv_cache_reuse", "tenant_header",
            "max_prompt_bytes", "decoupled_mode", "logits_datatype", "stop_by_request_id", "engine_cpus",
            "bls_instance_count", "router_instance_count", "cuda_graph_mode", "stream_interval")



def _bool(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
    return value.lower() == "true"


def _arg_type(annotation: str):
    return _bool if annotation == "bool" else int if "int" in annotation else str


_ARG_TYPES = {f.name: _arg_type(str(f.type)) for f in fields(RepoSpec)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ensembles", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("render", "write a servable model repository"),
                            ("serve", "render (unless --model-repository) and run tritonserver in the foreground")):
        p = sub.add_parser(name, help=help_text)
        src = p.add_mutually_exclusive_group()
        src.add_argument("--demo", action="store_true", help="the demo model (trained and cached on first use)")
        src.add_argument("--hf", type=Path, help="a Hugging Face checkpoint directory (Llama, Mistral, Qwen2/3, "
                                                 "Gemma 2, Phi-3: docs/families.md)")
        src.add_argument("--engine-dir", type=Path, help="a TensorRT-LLM-layout checkpoint (with --tokenizer-dir)")
        p.add_argument("--tokenizer-dir", type=Path)
        p.add_argument("--out", type=Path, default=DEFAULT_REPO_OUT, help="where the repository is rendered")
        p.add_argument("--limits-file", type=Path, help="tenants' rate limits (TOML/YAML; docs/rate_limiting.md)")
        p.add_argument("--canary", action="store_true",
                       help="with the canary router before the LLM model (docs/canary.md); "
                            "serve: explicit model control")
        for field_name in _TUNABLE:
            p.add_argument(f"--{field_name.replace('_', '-')}", dest=field_name, default=None,
                           type=_ARG_TYPES[field_name], metavar=field_name.upper())
        if name == "serve":
            p.add_argument("--model-repository", type=Path, help="serve this repository as it is")
            p.add_argument("--http-port", type=int, default=int(os.environ.get("TRITON_HTTP_PORT", 8000)),
                           help="public HTTP (the front's KServe v2 proxy)")
            p.add_argument("--triton-http-port", type=int, default=DEFAULT_TRITON_HTTP_PORT,
                           help="Triton's own HTTP, bound to 127.0.0.1 (the front forwards to it)")
            p.add_argument("--openai-port", type=int, default=int(os.environ.get("TRITONLLM_OPENAI_PORT", 9000)),
                           help="OpenAI-compatible API (docs/front.md)")
            p.add_argument("--no-openai", action="store_true", help="no OpenAI-compatible API")
            p.add_argument("--chat-template", type=Path, help="jinja chat template file (default: the tokenizer's)")
            p.add_argument("--served-model-name", help="the model id OpenAI clients use (default: ensemble)")
            p.add_argument("--grpc-port", type=int, default=int(os.environ.get("TRITON_GRPC_PORT", 8001)))
            p.add_argument("--metrics-port", type=int, default=int(os.environ.get("TRITON_METRICS_PORT", 8002)))
            p.add_argument("--log-verbose", type=int, default=0)
            p.add_argument("--admin-key", default=os.environ.get("TRITONLLM_ADMIN_KEY"),
                           help="key for model load/unload, shared memory, trace and logging APIs (header "
                                "x-admin-key); default $TRITONLLM_ADMIN_KEY, else a random one, printed")
            _supervisor_args(p)
    return parser


def _supervisor_args(p: argparse.ArgumentParser) -> None:
    """Shutdown and restart behaviour (ensembles/supervisor.py, docs/operations.md)."""
    p.add_argument("--health-port", type=int, default=int(os.environ.get("TRITONLLM_HEALTH_PORT", 8004)),
                   help="the launcher's readiness/liveness endpoint (/v2/health/ready, /v2/health/live); 0: none")
    p.add_argument("--shutdown-grace-s", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: how long in-flight requests may take before they are failed")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts of tritonserver after a dead model process within --restart-window-s; more: "
                        "exit 3 (0: exit 3 at the first one, for a service manager to restart)")
    p.add_argument("--restart-window-s", type=float, default=600.0)


def _artifacts(args) -> artifacts.ModelArtifacts:
    if args.hf:
        return artifacts.from_hf(args.hf)
    if args.engine_dir:
        if not args.tokenizer_dir:
            raise SystemExit("--engine-dir needs --tokenizer-dir")
        return artifacts.ModelArtifacts(args.engine_dir, args.tokenizer_dir)
    return artifacts.demo()


def _render(args) -> Path:
    model = _artifacts(args)
    overrides = {k: getattr(args, k) for k in _TUNABLE if getattr(args, k) is not None}
    if args.limits_file:
        overrides["limits_file"] = args.limits_file.resolve()
    spec = RepoSpec(engine_dir=model.engine_dir, tokenizer_dir=model.tokenizer_dir, **overrides)
    if args.canary:
        from ensembles.canary_render import render_canary

        return render_canary(spec, args.out)
    return render(spec, args.out)


def admin_key(given: str | None) -> str:
    """The key guarding Triton's admin APIs: --admin-key / $TRITONLLM_ADMIN_KEY, else a random one, printed."""
    if given:
        return given
    key = secrets.token_urlsafe(24)
    print(f"admin key (HTTP header x-admin-key, gRPC triton-grpc-protocol-x-admin-key; model load/unload, shared "
          f"memory, trace, logging): {key}", file=sys.stderr, flush=True)
    return key


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["canary"]:
        from ensembles.canary_cli import main as canary_main

        return canary_main(argv[1:])
    if argv[:1] == ["keys"]:
        from ensembles.keys_cli import main as keys_main

        return keys_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        repo = args.model_repository if getattr(args, "model_repository", None) else _render(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "render":
        print(repo)
        return 0
    tenant_header = args.tenant_header or "x-tenant-id"
    try:
        opts = ServerOptions(repo, args.triton_http_port, args.grpc_port, args.metrics_port, args.log_verbose,
                             admin_key=admin_key(args.admin_key), tenant_header=tenant_header,
                             model_control_mode="explicit" if args.canary else "none", http_address=LOOPBACK,
                             cpus=server_cpus_of(repo))
        front = FrontOptions(http_port=args.http_port, openai_port=None if args.no_openai else args.openai_port,
                             tokenizer_dir=args.tokenizer_dir or tokenizer_dir_of(repo), chat_template=args.chat_template,
                             limits_file=args.limits_file or limits_file_of(repo),
                             served_model_name=args.served_model_name, tenant_header=tenant_header)
        sup = SupervisorOptions(shutdown_grace_s=args.shutdown_grace_s, max_restarts=args.max_restarts,
                                restart_window_s=args.restart_window_s, health_port=args.health_port or None)
        _distinct_ports(opts, front, sup)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"serving {repo}: HTTP :{front.http_port} (the front: KServe v2), gRPC :{opts.grpc_port}, metrics "
          f":{opts.metrics_port}" + (f", OpenAI :{front.openai_port}" if front.openai_port else "")
          + f", health :{sup.health_port}; Triton's own HTTP {LOOPBACK}:{opts.http_port}", file=sys.stderr, flush=True)
    # tritonserver and the front run as children: the launcher restarts them when a model process or the front
    # dies, and on SIGTERM / Ctrl-C drains in-flight requests before stopping them (docs/operations.md).
    supervisor = Supervisor(opts, sup, front=FrontProcess(front, opts))
    supervisor.install_signal_handlers()
    return supervisor.run()


def _distinct_ports(opts: ServerOptions, front: FrontOptions, sup: SupervisorOptions) -> None:
    ports = {"--http-port": front.http_port, "--grpc-port": opts.grpc_port, "--metrics-port": opts.metrics_port,
             "--triton-http-port": opts.http_port, "--openai-port": front.openai_port, "--health-port": sup.health_port}
    used = [(flag, port) for flag, port in ports.items() if port]
    for i, (flag, port) in enumerate(used):
        clash = [other for other, p in used[i + 1:] if p == port]
        if clash:
            raise ValueError(f"{flag} and {clash[0]} are both {port}: every port must differ")


def _rendered_parameter(repo: Path, model: str, key: str) -> Path | None:
    """A path parameter of a rendered model's config.pbtxt (None when absent or empty)."""
    config = Path(repo) / model / "config.pbtxt"
    if not config.is_file():
        return None
    match = re.search(r'key: "' + key + r'" value: \{ string_value: "([^"]*)" \}', config.read_text())
    return Path(match.group(1)) if match and match.group(1) else None


def server_cpus_of(repo: Path) -> frozenset[int] | None:
    """The CPUs left to tritonserver when the repository's engine has CPUs of its own (engine_cpus), else None."""
    engine = _rendered_parameter(repo, "tensorrt_llm", "engine_cpus")
    if engine is None:
        return None
    cpus = parse_cpu_list(str(engine))
    return CpuSplit(cpus, frozenset(os.sched_getaffinity(0)) - cpus).rest


def tokenizer_dir_of(repo: Path) -> Path | None:
    return _rendered_parameter(repo, "preprocessing", "tokenizer_dir")


def limits_file_of(repo: Path) -> Path | None:
    return _rendered_parameter(repo, "tensorrt_llm", "limits_file")
