"""Provoke the Python backend's BLS lock-order deadlock (docs/canary.md, "Limits") through the canary router: 16
streams of short streamed requests, a canary started and promoted or rolled back every cycle, optionally with busy
processes taking the cores (the deadlock needs a stream's reader to wait for the GIL, which contention makes likely).
A cycle whose requests stop being served for `--stall-s` is a hang: the probe kills the server, says so, exits 3.

    .venv/bin/python perf/probes/bls_deadlock.py --cycles 30 --hogs 2

On main at 43812f3 (2026-11-26, 2 busy processes): three runs hung at cycles 3, 4 and 7.
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
from ensembles.canary import CanaryController  # noqa: E402
from ensembles.server import TritonServer  # noqa: E402
from tests.integration import test_canary as canary_test  # noqa: E402  (its server, and its Load of 16 streams)
from tests.integration.stub_deaths import StubDeaths  # noqa: E402


def _cycle(srv: TritonServer, control: CanaryController, deaths: StubDeaths, cycle: int,
           stall_s: float) -> str | None:
    """A canary started under load, then promoted (odd cycles) or rolled back; an error line, or None."""
    stable = control.table().stable
    canary = 3 if stable != 3 else 2
    survivor = canary if cycle % 2 else stable
    with canary_test.Load(srv.grpc_url, deaths) as load:
        try:
            control.start(version=canary, weight=50)
            canary_test._wait_for_requests(load, canary, 20, timeout_s=stall_s)
            (control.promote if cycle % 2 else control.rollback)()
            canary_test._wait_for_requests(load, survivor, 40, timeout_s=stall_s)
        except TimeoutError as exc:
            srv.stop(timeout_s=0)  # its process group killed: the hung streams would hold the Load's threads
            return f"hung: {exc}; served per version {dict(load.done)}"
    if load.failures:
        return f"failed requests: {load.failures[:3]}"
    print(f"{time.strftime('%H:%M:%S')} cycle {cycle} ({'promote' if cycle % 2 else 'rollback'}): served per "
          f"version {dict(load.done)}", flush=True)
    return None


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
            error = _cycle(srv, control, deaths, cycle, args.stall_s)
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
