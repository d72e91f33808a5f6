"""Raw gRPC stream calls: the tensorrt_llm model directly (token ids in, token ids out), as tensorrtllm_backend's
clients do, and arbitrary (malformed) tensors for the bad-input tests."""
from __future__ import annotations

import queue
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient

_DTYPES = {np.int32: "INT32", np.int64: "INT64", np.bool_: "BOOL", np.uint64: "UINT64", np.float32: "FP32",
           np.object_: "BYTES"}


def tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(value.shape), _DTYPES[value.dtype.type])
    inp.set_data_from_numpy(value)
    return inp


def _enqueue(responses: queue.Queue, result, error) -> None:
    responses.put((result, error))


def stream_infer(url: str, model: str, inputs: list[grpcclient.InferInput],
                 timeout_s: float = 120.0, model_version: str = "") -> list[grpcclient.InferResult]:
    """Every response of one request, up to the final one; raises the server's error."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    results = []
    try:
        client.start_stream(callback=partial(_enqueue, responses))
        client.async_stream_infer(model, inputs, model_version=model_version, enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=timeout_s)
            if error is not None:
                raise error
            results.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return results
    finally:
        client.stop_stream()
        client.close()


def generate_ids(url: str, prompt_ids: list[int], max_tokens: int, streaming: bool, end_id: int,
                 model_version: str = "", **extra: np.ndarray) -> list[list[int]]:
    """The output_ids of each tensorrt_llm response, in order (one list when not streaming)."""
    inputs = {
        "input_ids": np.array([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "streaming": np.array([[streaming]], dtype=bool),
        **extra,
    }
    results = stream_infer(url, "tensorrt_llm", [tensor(k, v) for k, v in inputs.items()], model_version=model_version)
    return [r.as_numpy("output_ids").reshape(-1).tolist() for r in results if r.as_numpy("output_ids") is not None]
