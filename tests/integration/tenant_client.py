"""gRPC calls to the ensemble as a tenant (its API key in the authorization header; other headers, request
parameters), timing the first token."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient

from tests.integration.trtllm_direct import tensor


@dataclass
class Outcome:
    texts: list[str] = field(default_factory=list)
    error: str | None = None
    ttft_s: float | None = None  # request sent -> first response with text
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # the last response's extra outputs

    @property
    def ok(self) -> bool:
        return self.error is None


def _enqueue(responses: queue.Queue, result, error) -> None:
    responses.put((result, error, time.monotonic()))


def generate(url: str, prompt: str | bytes, max_tokens: int, api_key: str | None = None, stream: bool = False,
             parameters: dict | None = None, outputs: tuple[str, ...] = (), timeout_s: float = 180.0,
             headers: dict[str, str] | None = None, model: str = "ensemble", first_text: threading.Event | None = None,
             **extra: np.ndarray) -> Outcome:
    """One ensemble request; the server's error (if any) ends up in Outcome.error, not raised. `first_text` is set
    once the first text arrives: the request is generating (a client's own sign, as fast as the machine)."""
    headers = {**(headers or {}), **({"authorization": f"Bearer {api_key}"} if api_key else {})}
    text = prompt if isinstance(prompt, bytes) else prompt.encode()  # bytes: sent as they are (not UTF-8, say)
    inputs = {"text_input": np.array([[text]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[stream]]), **extra}
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    out = Outcome()
    try:
        client.start_stream(callback=partial(_enqueue, responses), headers=headers or None)
        sent = time.monotonic()
        client.async_stream_infer(model, [tensor(k, v) for k, v in inputs.items()],
                                  enable_empty_final_response=True, parameters=parameters)
        while True:
            result, error, at = responses.get(timeout=timeout_s)
            if error is not None:
                out.error = str(error)
                return out
            text = result.as_numpy("text_output")
            if text is not None and text.size:
                out.texts.append(b"".join(text.reshape(-1)).decode())
                if out.ttft_s is None:
                    out.ttft_s = at - sent
                    if first_text is not None:
                        first_text.set()
            for name in outputs:
                if result.as_numpy(name) is not None:
                    out.outputs[name] = result.as_numpy(name)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()
