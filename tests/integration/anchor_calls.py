"""The calls tensorrtllm_backend's own clients make (inflight_batcher_llm/client/end_to_end_grpc_client.py,
inflight_batcher_llm_client.py, tools/inflight_batcher_llm/end_to_end_test.py at c2e65b8), made here in our own
code: the same models, tensor names, dtypes, shapes and default values, and the responses read the way they read
them (text_output[0].decode(), sequence_length[0][0], perf outputs [0][0], batch/sequence_index [0][0] or 0)."""
from __future__ import annotations

import queue
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

PERF_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


def tensor(module, name: str, value: np.ndarray):
    t = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    t.set_data_from_numpy(value)
    return t


def _one(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def e2e_inputs(prompt: str, output_len: int, streaming: bool, **extra) -> dict[str, np.ndarray]:
    """end_to_end_grpc_client.py's inputs with its defaults: temperature 1.0, beam 1, exclude_input_in_output
    False, stream as given; no top_k / top_p (greedy)."""
    inputs = {"text_input": np.array([[prompt]], dtype=object), "max_tokens": _one(output_len, np.int32),
              "stream": _one(streaming, bool), "beam_width": _one(1, np.int32), "temperature": _one(1.0, np.float32),
              "exclude_input_in_output": _one(False, bool)}
    inputs.update(extra)
    return inputs


def direct_inputs(prompt_ids: list[int], output_len: int, streaming: bool, end_id: int, pad_id: int,
                  **extra) -> dict[str, np.ndarray]:
    """inflight_batcher_llm_client.py's inputs to tensorrt_llm: runtime_top_k 1, runtime_top_p 0.0 (filter off),
    temperature 1.0, beam 1, end / pad ids from the tokenizer."""
    inputs = {"input_ids": np.array([prompt_ids], dtype=np.int32), "input_lengths": _one(len(prompt_ids), np.int32),
              "request_output_len": _one(output_len, np.int32), "beam_width": _one(1, np.int32),
              "temperature": _one(1.0, np.float32), "streaming": _one(streaming, bool),
              "end_id": _one(end_id, np.int32), "pad_id": _one(pad_id, np.int32),
              "runtime_top_k": _one(1, np.int32), "runtime_top_p": _one(0.0, np.float32)}
    inputs.update(extra)
    return inputs


def _enqueue(results: queue.Queue, result, error) -> None:
    results.put((result, error))


def grpc_stream(url: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
                request_id: str = "", timeout_s: float = 120.0) -> list:
    """start_stream + one async_stream_infer + stop_stream, then drain: the e2e client's transport, both modes.
    Returns the results (errors raised); tritonclient skips the flag-only final, as the anchor's clients do."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=partial(_enqueue, results))
    requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    client.async_stream_infer(model, [tensor(grpcclient, k, v) for k, v in inputs.items()], outputs=requested,
                              request_id=request_id, enable_empty_final_response=True)
    got = []
    try:
        while True:
            result, error = results.get(timeout=timeout_s)
            if error is not None:
                raise error
            if result.as_numpy("text_output") is not None or result.as_numpy("output_ids") is not None:
                got.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()
        client.close()


def infer(url: str, model: str, inputs: dict[str, np.ndarray], protocol: str = "http",
          outputs: list[str] | None = None, **kwargs):
    """Unary KServe inference (HTTP /infer or gRPC ModelInfer), as end_to_end_test.py calls every model."""
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(url)
    try:
        requested = [module.InferRequestedOutput(n) for n in outputs] if outputs else None
        return client.infer(model, [tensor(module, k, v) for k, v in inputs.items()], outputs=requested, **kwargs)
    finally:
        client.close()


def text_of(result) -> str:
    """How every anchor client reads the text: text_output[0].decode() (text_output is 1-D)."""
    return result.as_numpy("text_output")[0].decode("utf-8")


def index_of(result, name: str) -> int:
    """batch_index / sequence_index as the clients read them: [0][0], or 0 when absent."""
    value = result.as_numpy(name)
    return 0 if value is None else int(value[0][0])


def chain(url: str, prompt: str, output_len: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """end_to_end_test.py's hand-made chain, unary over HTTP: preprocessing -> tensorrt_llm (with its
    decoder_input_ids) -> postprocessing. Returns OUTPUT and the preprocessing outputs."""
    pre = infer(url, "preprocessing", {"QUERY": np.array([[prompt]], dtype=object),
                                       "BAD_WORDS_DICT": np.array([[""]], dtype=object),
                                       "STOP_WORDS_DICT": np.array([[""]], dtype=object),
                                       "REQUEST_OUTPUT_LEN": _one(output_len, np.int32)})
    names = ("INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "DECODER_INPUT_ID", "OUT_END_ID", "OUT_PAD_ID")
    got = {n: pre.as_numpy(n) for n in names}
    llm = infer(url, "tensorrt_llm", {"input_ids": got["INPUT_ID"], "decoder_input_ids": got["DECODER_INPUT_ID"],
                                      "input_lengths": got["REQUEST_INPUT_LEN"],
                                      "request_output_len": got["REQUEST_OUTPUT_LEN"], "end_id": got["OUT_END_ID"],
                                      "pad_id": got["OUT_PAD_ID"]})
    post = infer(url, "postprocessing", {"TOKENS_BATCH": llm.as_numpy("output_ids").astype(np.int32),
                                         "SEQUENCE_LENGTH": llm.as_numpy("sequence_length")})
    return post.as_numpy("OUTPUT"), got


def l0_ensemble(url: str, model: str, prompt: str, output_len: int) -> np.ndarray:
    """end_to_end_test.py's ensemble call: empty word lists as [[""]], text_output requested."""
    result = infer(url, model, {"text_input": np.array([[prompt]], dtype=object),
                                "max_tokens": _one(output_len, np.int32),
                                "bad_words": np.array([[""]], dtype=object),
                                "stop_words": np.array([[""]], dtype=object)}, outputs=["text_output"])
    return result.as_numpy("text_output")
