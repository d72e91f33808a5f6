"""Provoke the Python backend's BLS lock-order deadlock (backend/serving/bls_exclusion.py) through the canary router:
16 streams of short streamed requests, a canary started and promoted or rolled back every cycle, optionally with
busy processes taking the cores (the deadlock needs a stream's reader to wait for the GIL, which contention makes
likely). A cycle whose requests stop being served for `--stall-s` is a hang: the probe says so and exits 3.

    .venv/bin/python perf/probes/bls_deadlock.py --cycles 30 --hogs 2

Main at 43812f3 (before the exclusion): three runs hung at cycles 3, 4 and 7; with it, 40 cycles and no hang
(2026-11-26, 2 busy processes; docs/canary.md, "Limits").
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ensembles import artifacts  # noqa: E402
from tests.integration import test_canary as canary_test  # noqa: E402  (its cycle under its Load of 16 streams)
from tests.integration.stub_deaths import StubDeaths  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside the server (0: none)")
    parser.add_argument("--stall-s", type=float, default=60.0, help="no progress this long: a hang")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bls-deadlock-"))
    srv, control = canary_test.start_canary_server(artifacts.demo(), root)
    deaths = StubDeaths(srv.proc.pid)
    hogs = canary_test.busy_processes(args.hogs)
    try:
        for cycle in range(args.cycles):
            error = canary_test.canary_cycle(srv, control, deaths, cycle, args.stall_s)
            if error:
                print(f"{time.strftime('%H:%M:%S')} cycle {cycle}: {error} (server log: {root}/tritonserver.log)",
                      flush=True)
                return 3
        print(f"{args.cycles} cycles, no hang ({args.hogs} busy processes beside)")
        return 0
    finally:
        for hog in hogs:
            hog.kill()
        deaths.close()
        control.close()
        srv.stop()


if __name__ == "__main__":
    raise SystemExit(main())
