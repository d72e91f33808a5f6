"""Rank 0 of a sharded checkpoint, inside the engine: ModelRunner's interface (run(StepInputs) -> logits, close())
over tp_size x pp_size ranks, the others being worker processes it starts (backend/model/parallel/worker.py).

Per step: the engine (in this process) hands the StepInputs of its batch; the driver wakes every worker (one byte on its
stdin), broadcasts the step's StepInputs, runs its own shard, and gets the logits (from the last pipeline stage
when pp > 1) to sample here. A worker that dies fails the step with a RuntimeError naming it (the engine loop
then fails the requests in flight) and every later step at once; close() (the model's finalize) stops them.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from backend.formats.checkpoint import rank_file
from backend.formats.rank_layout import RankPosition
from backend.model.config import ModelConfig
from backend.model.parallel.comm import broadcast_step, init_rank, rank_device, rendezvous
from backend.model.parallel.rank_model import RankModel
from backend.model.parallel.worker import QUIT, STEP
from backend.model.step_inputs import StepInputs

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]


class ParallelModelRunner:
    def __init__(self, ckpt_dir: Path, cfg: ModelConfig, num_blocks: int, block_size: int, device: torch.device,
                 worker_threads: int = 1, timeout_s: float = 300.0) -> None:
        self.pos = RankPosition(0, cfg.mapping.tp_size, cfg.mapping.pp_size)
        self.device = rank_device(device, 0)
        self._broken: str | None = None
        self.workers: list[subprocess.Popen] = []
        missing = [f for f in (rank_file(r) for r in range(self.pos.world_size)) if not (Path(ckpt_dir) / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{ckpt_dir}: mapping {cfg.mapping} needs one file per rank; missing {missing}")
        store = rendezvous(self.pos, 0, timeout_s)  # port 0: the store binds a free port, no race
        # Absolute: the workers run in the repository root, not in this process's working directory.
        args = [str(Path(ckpt_dir).resolve()), "--port", str(store.port), "--device", device.type, "--num-blocks", str(num_blocks),
                "--block-size", str(block_size), "--threads", str(worker_threads), "--timeout", str(timeout_s)]
        self.workers = [_spawn(rank, args, worker_threads) for rank in range(1, self.pos.world_size)]
        log.info("parallel engine: tp %d x pp %d, workers pids %s", self.pos.tp_size, self.pos.pp_size,
                 [w.pid for w in self.workers])
        try:
            self._await(store, "up", timeout_s)  # a worker that fails to start fails this at once, not at timeout
            tp_group = init_rank(self.pos, store, self.device, timeout_s)
            self.model = RankModel(ckpt_dir, cfg, self.pos, tp_group, num_blocks, block_size,
                                   self.device)
            self._await(store, "loaded", timeout_s)
        except Exception as exc:
            self.close()
            raise RuntimeError(f"starting the {self.pos.world_size}-rank parallel engine failed: {exc}; "
                               f"workers: {self._worker_states()}") from exc

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Logits (S, vocab) for the sequences that sample, in batch order (as ModelRunner.run)."""
        if self._broken is None and any(w.poll() is not None for w in self.workers):
            self._broken = f"a parallel worker exited: {self._worker_states()}"
        if self._broken is not None:
            raise RuntimeError(f"the parallel engine is down ({self._broken}); reload the model")
        try:
            for worker in self.workers:
                worker.stdin.write(STEP)
                worker.stdin.flush()
            broadcast_step(inputs, self.device)
            return self.model.execute(inputs)
        except (RuntimeError, OSError) as exc:  # a rank died or timed out mid-step: fail fast from now on
            self._await_an_exit(1.0)
            self._broken = f"step failed: {exc}; workers: {self._worker_states()}"
            self._stop_workers(grace_s=0.0)
            raise RuntimeError(f"the parallel engine is down ({self._broken}); reload the model") from exc

    def _await(self, store: dist.Store, stage: str, timeout_s: float) -> None:
        """Wait until every worker posted `{stage}{rank}`; raise as soon as one has exited."""
        keys = [f"{stage}{rank}" for rank in range(1, self.pos.world_size)]
        deadline = time.monotonic() + timeout_s
        while not store.check(keys):
            if any(w.poll() is not None for w in self.workers):
                raise RuntimeError(f"a worker exited before it was {stage} (its error is in the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not {stage} after {timeout_s:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the workers (they get 'q' and leave their loop) and leave the process group."""
        self._stop_workers(grace_s=10.0)
        if dist.is_initialized():
            dist.destroy_process_group()

    def _stop_workers(self, grace_s: float) -> None:
        for worker in self.workers:
            if worker.stdin.closed:
                continue  # stopped before (a failed step, then finalize)
            try:
                worker.stdin.write(QUIT)
                worker.stdin.close()
            except OSError:
                pass  # already gone
        for worker in self.workers:
            try:
                worker.wait(timeout=grace_s) if grace_s else None
            except subprocess.TimeoutExpired:
                pass
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    def _await_an_exit(self, timeout_s: float) -> None:
        """A killed rank's sockets close before its exit can be reaped: rank 0 sees the reset first. Wait briefly
        for a worker to have exited, so the error names the dead rank (a fresh-clone CI run read 'running')."""
        deadline = time.monotonic() + timeout_s
        while all(w.poll() is None for w in self.workers) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _worker_states(self) -> str:
        states = []
        for rank, worker in enumerate(self.workers, start=1):
            code = worker.poll()
            states.append(f"rank {rank} (pid {worker.pid}) " + ("running" if code is None else f"exited {code}"))
        return ", ".join(states)


def _python() -> str:
    """This interpreter's executable. Inside Triton's Python backend sys.executable is the stub, not python."""
    if sys.executable and Path(sys.executable).name.startswith("python"):
        return sys.executable
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.base_exec_prefix) / "bin" / name, shutil.which(name)):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    raise RuntimeError(f"no {name} executable found to start the parallel workers")


def _spawn(rank: int, args: list[str], threads: int) -> subprocess.Popen:
    env = dict(os.environ)
    # The workers import what this process imports (the Triton stub's path was set by tritonllm_env).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in sys.path if p])
    env["OMP_NUM_THREADS"] = str(threads)
    cmd = [_python(), "-m", "backend.model.parallel.worker", *args, "--rank", str(rank)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, cwd=str(REPO_ROOT))
