"""A non-driver rank: `python -m backend.model.parallel.worker CKPT --rank N ...`, started by driver.py.

Loop: wait for the driver's wake-up byte on stdin, receive the step's inputs by broadcast, run this rank's part.
Stdin is the lifeline: 'q' (finalize) or end-of-file (the driver's process died) ends the worker. Between
steps a worker therefore waits on a pipe, not inside a collective, so an idle server never hits a timeout.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from backend.formats.rank_layout import RankPosition
from backend.model.config import load_model_config
from backend.model.host_memory import retain_freed_memory
from backend.model.parallel.comm import init_rank, rank_device, receive_step, rendezvous
from backend.model.parallel.rank_model import RankModel

STEP, QUIT = b"s", b"q"
log = logging.getLogger("tritonllm.parallel.worker")


def serve(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as the in-process engine does (backend/model/host_memory.py)
    cfg = load_model_config(args.ckpt_dir)
    pos = RankPosition(args.rank, cfg.mapping.tp_size, cfg.mapping.pp_size)
    device = rank_device(torch.device(args.device), pos.rank)
    store = rendezvous(pos, args.port, args.timeout)
    store.set(f"up{pos.rank}", "1")
    tp_group = init_rank(pos, store, device, args.timeout)
    model = RankModel(args.ckpt_dir, cfg, pos, tp_group, args.num_blocks, args.block_size, device)
    store.set(f"loaded{pos.rank}", "1")  # the driver's constructor returns once every rank posted this
    lifeline = sys.stdin.buffer
    while lifeline.read(1) == STEP:
        model.execute(receive_step(device))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.model.parallel.worker", description=__doc__)
    p.add_argument("ckpt_dir", type=Path)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-blocks", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"[rank {args.rank}] %(levelname)s %(message)s")
    try:
        serve(args)
    except (ConnectionError, RuntimeError) as exc:  # the driver went away mid-step: nothing left to serve
        log.error("rank %d stops: %s", args.rank, exc)
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
