"""The launcher <-> model control folder: phases, in-flight counts of live processes, the model's watcher."""
from __future__ import annotations

import os
import time

import pytest

from backend.serving.lifecycle import ControlDir, PhaseWatcher, ServerPhase


def test_phase_round_trip_and_default(tmp_path):
    control = ControlDir(tmp_path / "ctl")
    assert control.phase() == ServerPhase("serving")  # nothing written yet: serving
    control.set_phase(ServerPhase("draining", "shutting down on SIGTERM"))
    assert control.phase() == ServerPhase("draining", "shutting down on SIGTERM")
    assert not control.phase().admitting
    (tmp_path / "ctl" / "state.json").write_text("{broken")
    assert control.phase().admitting
    with pytest.raises(ValueError, match="phase must be one of"):
        ServerPhase("paused")


def test_inflight_sums_the_files_of_live_processes_only(tmp_path):
    control = ControlDir(tmp_path)
    control.report_inflight("tensorrt_llm", 3)  # this process
    (tmp_path / "inflight-tensorrt_llm-999999.json").write_text('{"inflight": 5}')  # a dead process
    (tmp_path / "inflight-x-bad.json").write_text("{}")
    assert control.inflight(lambda pid: pid == os.getpid()) == 3
    assert control.inflight(lambda pid: True) == 8
    control.clear_inflight()
    assert control.inflight(lambda pid: True) == 0


def _until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.01)
    return predicate()


def test_watcher_refuses_when_draining_and_aborts_once(tmp_path):
    control, aborts, count = ControlDir(tmp_path), [], [2]
    watcher = PhaseWatcher(control, "tensorrt_llm", lambda: count[0], aborts.append, period_s=0.01)
    try:
        assert watcher.current.admitting
        assert _until(lambda: control.inflight(lambda pid: True) == 2)
        assert control.acknowledged("serving", lambda pid: True)
        control.set_phase(ServerPhase("draining", "shutting down on SIGTERM"))
        # The acknowledgement is written only after the watcher refuses: the launcher turns readiness false then.
        assert _until(lambda: control.acknowledged("draining", lambda pid: True))
        assert not watcher.current.admitting
        assert "not admitting new requests: shutting down on SIGTERM" in watcher.refusal()
        control.set_phase(ServerPhase("aborting", "the grace period ended"))
        count[0] = 0
        assert _until(lambda: aborts == ["the grace period ended"] and control.inflight(lambda pid: True) == 0)
        time.sleep(0.1)
        assert aborts == ["the grace period ended"]  # once
    finally:
        watcher.close()


def test_without_a_launcher_the_watcher_always_admits(monkeypatch):
    monkeypatch.delenv("TRITONLLM_CONTROL_DIR", raising=False)
    watcher = PhaseWatcher.from_env("m", lambda: 0, lambda reason: None)
    assert watcher.current.admitting and watcher._thread is None
    watcher.close()
