"""The process group of a parallel engine and the step broadcast from the driver (rank 0) to every rank.

Each step the driver broadcasts a StepInputs (backend/model/step_inputs.py) as a 3-int header [T, B, L] then one int64
payload; every rank derives the same AttentionMetadata from it. NCCL (CUDA) needs the tensors on the device,
gloo (CPU) on the host.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from backend.formats.rank_layout import RankPosition
from backend.model.step_inputs import StepInputs


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """cuda: one GPU per rank (round robin over the visible ones); cpu: every rank on the host."""
    if device.type == "cuda":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return device


def rendezvous(pos: RankPosition, port: int, timeout_s: float) -> dist.TCPStore:
    """The key-value store the ranks meet on: rank 0 hosts it (port 0: any free port, see .port), the others
    connect. Ranks also post their progress in it ("up{rank}", "loaded{rank}"), which the driver polls."""
    return dist.TCPStore("127.0.0.1", port, pos.world_size, is_master=pos.rank == 0,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def init_rank(pos: RankPosition, store: dist.Store, device: torch.device, timeout_s: float) -> dist.ProcessGroup:
    """Join the world; return this rank's tensor-parallel group (its stage's ranks).

    timeout_s bounds every collective: a rank that dies mid-step fails the others within it (gloo usually
    notices the closed connection at once)."""
    if dist.is_initialized():
        raise RuntimeError("a parallel engine already runs in this process: one per process (one per Triton "
                           "model instance)")
    dist.init_process_group(backend_for(device), store=store, rank=pos.rank, world_size=pos.world_size,
                            timeout=timedelta(seconds=timeout_s))
    # Every rank creates every group, in the same order (torch.distributed requires it).
    groups = [dist.new_group(pos.stage_ranks(stage)) for stage in range(pos.pp_size)]
    return groups[pos.pp_rank]


def broadcast_step(inputs: StepInputs, device: torch.device) -> None:
    header, payload = inputs.pack()
    dist.broadcast(header.to(device), src=0)
    dist.broadcast(payload.to(device), src=0)


def receive_step(device: torch.device) -> StepInputs:
    header = torch.empty(3, dtype=torch.long, device=device)
    dist.broadcast(header, src=0)
    header = header.cpu()
    payload = torch.empty(StepInputs.payload_size(header), dtype=torch.long, device=device)
    dist.broadcast(payload, src=0)
    return StepInputs.unpack(header, payload.cpu())
