"""Provoke the Python backend's BLS lock-order deadlock (docs/canary.md, "Limits") through the canary router: 16
streams of short streamed requests, a canary started and promoted or rolled back every cycle, optionally with busy
processes taking the cores (the deadlock needs a stream's reader to wait for the GIL, which contention makes likely).
A cycle whose requests stop being served for `--stall-s` is a hang: the probe kills the server, says so, exits 3.

    .venv/bin/python perf/probes/bls_deadlock.py --cycles 30 --hogs 2

On main at 43812f3 (2026-11-26, 2 busy processes): three runs hung at cycles 3, 4 and 7. With the router and
tensorrt_llm_bls serving one request at a time per instance (2026-11-26, 11:30-11:38 UTC): 30 cycles, no hang.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ensembles import artifacts  # noqa: E402
# test_canary's server, and its canary cycle under 16 streams
from tests.integration import test_canary as canary_test  # noqa: E402
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
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        for cycle in range(args.cycles):
            error = canary_test.canary_cycle(srv, control, deaths, cycle, args.stall_s)
            if error is None:
                print(f"{time.strftime('%H:%M:%S')} cycle {cycle} ({'promote' if cycle % 2 else 'rollback'}): served",
                      flush=True)
            else:
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
