"""Streamed throughput of tensorrt_llm_bls beside the ensemble, same server, same load: N gRPC streams, each sending
its next request when the last one ended (closed loop), demo model, 128-token prompts cut from held-out
standard-library source, exactly --new-tokens new tokens per request (min_tokens = max_tokens). A measurement, not a
test: what serving one request at a time per BLS instance (model_repository/tensorrt_llm_bls/1/model.py) costs
against the ensemble, at a chosen instance count.

    .venv/bin/python perf/probes/bls_throughput.py --streams 16 --bls-instance-count 4 16 --rounds 2

Run from an older checkout (PYTHONPATH=<that checkout>) it renders that checkout's models; a RepoSpec without
bls_instance_count (before 2026-11-26) is run once, as it is.
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import dataclasses
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ensembles import artifacts  # noqa: E402
from ensembles.render import ENSEMBLE_MODELS, RepoSpec, render  # noqa: E402
from ensembles.server import ServerOptions, TritonServer, free_ports  # noqa: E402
from tests.integration.anchor_calls import e2e_inputs, tensor  # noqa: E402


def prompts(tokenizer_dir: Path, count: int, length: int) -> list[str]:
    """count prompts of `length` tokens, cut from a standard-library module the demo recipe does not train on."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = tok(Path(threading.__file__).read_text())["input_ids"]
    return [tok.decode(ids[i * length:(i + 1) * length]) for i in range(count)]


def one_stream(url: str, model: str, texts: list[str], new_tokens: int, tokens: list[int], errors: list[str]) -> None:
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        for text in texts:
            inputs = e2e_inputs(text, new_tokens, True, min_tokens=np.array([[new_tokens]], dtype=np.int32))
            client.async_stream_infer(model, [tensor(grpcclient, k, v) for k, v in inputs.items()],
                                      enable_empty_final_response=True)
            while True:
                result, error = responses.get(timeout=600)
                if error is not None:
                    errors.append(str(error))
                    break
                if result.as_numpy("text_output") is not None:
                    tokens[0] += 1
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
    finally:
        client.stop_stream()
        client.close()


def measure(url: str, model: str, texts: list[str], streams: int, per_stream: int, new_tokens: int) -> float:
    """Streamed responses (one token each) per second over the whole closed loop."""
    counts = [[0] for _ in range(streams)]
    errors: list[str] = []
    threads = [threading.Thread(target=one_stream, args=(url, model, texts[i * per_stream:(i + 1) * per_stream],
                                                         new_tokens, counts[i], errors)) for i in range(streams)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"{model}: {len(errors)} failed requests, first: {errors[0]}")
    return sum(c[0] for c in counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--per-stream", type=int, default=2, help="requests each stream sends, one after another")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--bls-instance-count", type=int, nargs="+", default=[4])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    demo = artifacts.demo()
    texts = prompts(demo.tokenizer_dir, args.streams * args.per_stream, 128)
    counts = args.bls_instance_count if "bls_instance_count" in {f.name for f in dataclasses.fields(RepoSpec)} \
        else [None]
    for count in counts:
        root = Path(tempfile.mkdtemp(prefix="bls-throughput-"))
        spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=16,
                        **({} if count is None else {"bls_instance_count": count}))
        repo = render(spec, root / "model_repository", ENSEMBLE_MODELS)
        srv = TritonServer(ServerOptions(repo, *free_ports(3)), log_path=root / "tritonserver.log")
        srv.start(ready_timeout_s=300, models=ENSEMBLE_MODELS)
        try:
            measure(srv.grpc_url, "ensemble", texts[:4], 4, 1, 8)  # warm-up
            measure(srv.grpc_url, "tensorrt_llm_bls", texts[:4], 4, 1, 8)
            for r in range(args.rounds):
                for model in ("ensemble", "tensorrt_llm_bls"):
                    rate = measure(srv.grpc_url, model, texts, args.streams, args.per_stream, args.new_tokens)
                    print(f"{time.strftime('%H:%M:%S')} bls_instance_count {count}, round {r}, {model}: "
                          f"{rate:.0f} tok/s ({args.streams} streams; load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
