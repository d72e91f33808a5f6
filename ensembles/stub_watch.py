"""Which Python-backend model processes (stubs) of a tritonserver died without Triton noticing.

Measured on the embedded tritonserver 2.51: after `kill -9` of a model's triton_python_backend_stub, Triton never
reaps it (it stays a zombie child of tritonserver), the model stays READY in /v2/repository/index,
/v2/models/<m>/ready and /v2/health/ready keep answering 200, the dead model's in-flight requests hang and every new
one fails ("Stub process '<m>_0_0' is not healthy"); the Python backend's stub restart is not implemented in 2.51.
When Triton unloads a model itself it waits for the stub (waitpid), so a stub that stays a zombie for two polls in
a row is one that died on its own. psutil reads /proc; no Triton import.
"""
from __future__ import annotations

from pathlib import Path

import psutil

STUB_BINARY = "triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region_"
_COMM = STUB_BINARY[:15]  # the kernel's process name is cut at 15 characters; it stays readable for a zombie


def _model_of(cmdline: list[str]) -> str:
    """`<repo>/<model>/<version>/model.py` (the stub's first argument) -> '<model> v<version>'."""
    parts = Path(cmdline[1]).parts if len(cmdline) > 1 else ()
    return f"{parts[-3]} v{parts[-2]}" if len(parts) >= 3 else "a Python model"


class StubWatch:
    def __init__(self, server_pid: int, zombie_polls: int = 2) -> None:
        self.server = psutil.Process(server_pid)
        self.zombie_polls = zombie_polls
        self.stubs: dict[int, tuple[psutil.Process, str]] = {}  # pid -> (process, model)
        self.shm_regions: set[str] = set()  # the stubs' shared-memory regions (argument 2), under /dev/shm
        self._zombie_seen: dict[int, int] = {}
        self._record_new()

    def _record_new(self) -> None:
        try:
            children = self.server.children()
        except psutil.Error:
            return
        for child in children:
            if child.pid in self.stubs:
                continue
            try:
                if not child.name().startswith(_COMM):
                    continue
                cmdline = child.cmdline()  # empty once a zombie: the model is then unknown
            except psutil.ZombieProcess:
                cmdline = []
            except psutil.Error:
                continue
            self.stubs[child.pid] = (child, _model_of(cmdline))
            if len(cmdline) > 2 and cmdline[2].startswith(SHM_PREFIX):
                self.shm_regions.add(cmdline[2])

    def dead(self) -> list[str]:
        """One line per stub that died on its own ('the tensorrt_llm v1 model process (pid 123) died')."""
        self._record_new()
        found = []
        for pid, (proc, model) in list(self.stubs.items()):
            try:
                zombie = proc.is_running() and proc.status() == psutil.STATUS_ZOMBIE
                gone = not proc.is_running()
            except psutil.NoSuchProcess:
                zombie, gone = False, True
            if gone:  # reaped by Triton: a model it unloaded
                del self.stubs[pid]
                self._zombie_seen.pop(pid, None)
                continue
            seen = self._zombie_seen[pid] = self._zombie_seen.get(pid, 0) + 1 if zombie else 0
            if seen >= self.zombie_polls:
                found.append(f"the {model} model process (pid {pid}) died")
        return found

    def alive(self, pid: int) -> bool:
        """For in-flight accounting: a process that exists and is not a zombie."""
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def pids(self) -> list[int]:
        return list(self.stubs)

    def remove_shm_regions(self, shm_dir: Path = Path("/dev/shm")) -> None:
        """After the server was killed: the regions its stubs used, which only a clean stop removes (1 MiB each)."""
        for name in self.shm_regions:
            if "/" not in name:
                (shm_dir / name).unlink(missing_ok=True)
