"""The launcher <-> model channel for shutdown and restarts: a folder the launcher names in TRITONLLM_CONTROL_DIR.

Triton 2.51 gives a Python model no way to hear about a drain (its own SIGINT path stops every model's scheduler
first, which strands decoupled ensemble streams), so the launcher (ensembles/supervisor.py) and the tensorrt_llm
model talk through two kinds of small files, each replaced atomically:

- `state.json`, written by the launcher: {"phase": "serving" | "draining" | "aborting", "reason": "..."}.
  draining: refuse new requests (UNAVAILABLE), let in-flight ones finish; aborting: also fail the in-flight ones
  with the reason (the grace period ended, or the server is restarting after a dead model process).
- `inflight-<model>-<pid>.json`, written by each model process: {"inflight": <rows admitted and not finished>}.
  The launcher sums the files of processes still alive.

No Triton import: the model's watcher thread and the launcher both use this module.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CONTROL_DIR_ENV = "TRITONLLM_CONTROL_DIR"
PHASES = ("serving", "draining", "aborting")


@dataclass(frozen=True)
class ServerPhase:
    phase: str = "serving"
    reason: str = ""

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}")

    @property
    def admitting(self) -> bool:
        return self.phase == "serving"


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class ControlDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def set_phase(self, phase: ServerPhase) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.path / "state.json", {"phase": phase.phase, "reason": phase.reason})

    def phase(self) -> ServerPhase:
        """The launcher's last word; serving when it has said nothing (or the file is unreadable)."""
        try:
            data = json.loads((self.path / "state.json").read_text())
            return ServerPhase(str(data["phase"]), str(data.get("reason", "")))
        except (OSError, ValueError, KeyError, TypeError):
            return ServerPhase()

    def report_inflight(self, model: str, count: int, phase: str = "serving") -> None:
        """This model process's rows in flight, and the phase it has seen (its acknowledgement)."""
        _write_atomic(self.path / f"inflight-{model}-{os.getpid()}.json", {"inflight": count, "phase": phase})

    def _reports(self, alive: Callable[[int], bool]) -> list[dict]:
        out = []
        for path in self.path.glob("inflight-*.json"):
            try:
                pid = int(path.stem.rsplit("-", 1)[1])
                report = json.loads(path.read_text())
                count = int(report["inflight"])
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                continue
            if alive(pid):
                out.append({"inflight": count, "phase": str(report.get("phase", "serving"))})
        return out

    def inflight(self, alive: Callable[[int], bool]) -> int:
        """Rows in flight in the model processes that are still alive."""
        return sum(r["inflight"] for r in self._reports(alive))

    def acknowledged(self, phase: str, alive: Callable[[int], bool]) -> bool:
        """Every live model process has seen `phase` (so none admits a request the phase refuses)."""
        return all(r["phase"] == phase for r in self._reports(alive))

    def clear_inflight(self) -> None:
        for path in self.path.glob("inflight-*.json"):
            path.unlink(missing_ok=True)


class PhaseWatcher:
    """In a model process: polls the launcher's phase, reports this process's in-flight count, and calls on_abort
    once when the phase turns to aborting. Without a control folder (no launcher) it always admits."""

    def __init__(self, control: ControlDir | None, model: str, inflight: Callable[[], int],
                 on_abort: Callable[[str], None], period_s: float = 0.1) -> None:
        self.control = control
        self.model = model
        self.inflight = inflight
        self.on_abort = on_abort
        self.period_s = period_s
        self.current = ServerPhase()
        self._stop = threading.Event()
        self._thread = None
        if control is not None:
            self._thread = threading.Thread(target=self._run, name="tritonllm-phase", daemon=True)
            self._thread.start()

    @classmethod
    def from_env(cls, model: str, inflight: Callable[[], int], on_abort: Callable[[str], None]) -> "PhaseWatcher":
        folder = os.environ.get(CONTROL_DIR_ENV)
        return cls(ControlDir(folder) if folder else None, model, inflight, on_abort)

    def refusal(self) -> str:
        return f"server is not admitting new requests: {self.current.reason}; retry on another replica or later"

    def _run(self) -> None:
        reported = None
        while not self._stop.wait(self.period_s):
            phase = self.control.phase()
            if phase.phase == "aborting" and self.current.phase != "aborting":
                self.on_abort(phase.reason)
            self.current = phase
            count = self.inflight()
            if (count, phase.phase) != reported:
                self.control.report_inflight(self.model, count, phase.phase)
                reported = (count, phase.phase)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
