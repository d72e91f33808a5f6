"""The `stop` call that ends a cancelled client's tensorrt_llm request (the anchor's `stop` input, by request_key):
its inputs and the model version it goes to. postprocessing sends it when an ensemble stream is cancelled,
tensorrt_llm_bls when its client is; both send it straight to the tensorrt_llm version that served the stream, not
through the canary router, whose instances may all be busy forwarding streams (docs/canary.md)."""
from __future__ import annotations

import numpy as np

# Triton's choice of version: the model's latest (what a repository without a canary serves)
ANY_VERSION = -1


def stop_inputs(request_key: np.ndarray) -> dict[str, np.ndarray]:
    """tensorrt_llm's inputs for a stop: stop=true and the request's key (request_key: any shape holding one
    value), beside the one-token input_ids / input_lengths / request_output_len its config marks required."""
    one = np.ones((1, 1), dtype=np.int32)
    return {"input_ids": one, "input_lengths": one, "request_output_len": one, "stop": np.ones((1, 1), dtype=bool),
            "request_key": np.asarray(request_key).reshape(1, 1).astype(np.uint64)}


def stop_version(served_version: np.ndarray | None) -> int:
    """The version that served the stream (the canary router's served_version output), else ANY_VERSION."""
    return ANY_VERSION if served_version is None else int(np.asarray(served_version).reshape(-1)[0])
