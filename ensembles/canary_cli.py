"""`python -m ensembles canary {status,start,set-weight,promote,rollback,compare}`: see docs/canary.md.

Exit codes: 0 done; 2 refused (unknown version, weight outside [0, 100], no canary running, bad thresholds file,
server error). `compare` prints the verdict and exits 0 (promote), 3 (hold) or 4 (rollback), for scripts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import requests

from ensembles.canary import CanaryController, CanaryError, ControlOptions
from ensembles.canary_compare import Thresholds, parse_metrics, verdict, version_stats
from ensembles.render import REPO_ROOT
from ensembles.server import ADMIN_HEADER

_VERDICT_EXIT = {"promote": 0, "hold": 3, "rollback": 4}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ensembles canary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("TRITON_HTTP_URL", "localhost:8000"),
                        help="Triton HTTP endpoint (host:port)")
    parser.add_argument("--model-repository", type=Path, default=REPO_ROOT / "build" / "model_repository",
                        help="the repository the server serves (rendered with --canary)")
    parser.add_argument("--admin-key", default=os.environ.get("TRITONLLM_ADMIN_KEY"),
                        help="key for the restricted model-control API (env TRITONLLM_ADMIN_KEY)")
    parser.add_argument("--admin-header", default=ADMIN_HEADER, help="header the admin key is sent in")
    parser.add_argument("--drain-s", type=float, default=1.0, help="promote/rollback: wait before unloading")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="routing table, loaded and installed versions (JSON)")
    start = sub.add_parser("start", help="load version N beside the stable one and send it W%% of requests")
    start.add_argument("--version", type=int, required=True)
    start.add_argument("--weight", type=int, required=True)
    weight = sub.add_parser("set-weight", help="send W%% of requests to the canary")
    weight.add_argument("weight", type=int)
    sub.add_parser("promote", help="the canary becomes stable (100%%); the old stable is unloaded")
    sub.add_parser("rollback", help="the stable version gets 100%%; the canary is unloaded")
    compare = sub.add_parser("compare", help="canary vs stable from the metrics endpoint, and a verdict")
    compare.add_argument("--metrics-url", default=os.environ.get("TRITON_METRICS_URL", "http://localhost:8002/metrics"))
    compare.add_argument("--thresholds", type=Path, help="TOML file with a [canary] table (defaults otherwise)")
    return parser


def _compare(controller: CanaryController, args) -> int:
    limits = Thresholds.load(args.thresholds) if args.thresholds else Thresholds()
    table = controller.table()
    if table.canary is None:
        raise CanaryError(f"no canary running (stable version {table.stable}): nothing to compare")
    try:
        samples = parse_metrics(requests.get(args.metrics_url, timeout=10).text)
    except requests.RequestException as exc:
        raise CanaryError(f"cannot read metrics from {args.metrics_url}: {exc}") from exc
    stable, canary = version_stats(samples, table.stable), version_stats(samples, table.canary)
    result = verdict(stable, canary, limits)
    report = {"verdict": result.decision, "reasons": list(result.reasons),
              "stable": {**stable.__dict__, "error_rate": stable.error_rate},
              "canary": {**canary.__dict__, "error_rate": canary.error_rate}}
    print(json.dumps(report, indent=2))
    return _VERDICT_EXIT[result.decision]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        opts = ControlOptions(args.url, args.model_repository, args.admin_key, args.admin_header, args.drain_s)
        controller = CanaryController(opts)
        if args.command == "compare":
            return _compare(controller, args)
        if args.command == "start":
            controller.start(args.version, args.weight)
        elif args.command == "set-weight":
            controller.set_weight(args.weight)
        elif args.command == "promote":
            controller.promote()
        elif args.command == "rollback":
            controller.rollback()
        print(json.dumps(controller.status(), indent=2))
        return 0
    except (CanaryError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
