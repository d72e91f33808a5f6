"""Triton adapter for tensorrt_llm_bls: the ensemble's contract in one model (logic: backend/serving/bls.py).

Each request is served from its own thread (a long stream never blocks the others) through its response sender:
decoupled, one response per tensorrt_llm response then a flag-only final (as the anchor's BLS); not decoupled,
exactly one response. A client that cancels has its tensorrt_llm request stopped by request_key.
"""
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.errors import InvalidRequestError
from backend.serving.bls import DERIVED_OUTPUTS, INTERNAL_OUTPUTS, client_outputs, llm_inputs
from backend.serving.bls_calls import call_gate
from backend.serving.parameters import ModelParameters, PreprocessingConfig
from backend.serving.pb_release import BlsHold, release_at_finalize, send_tensors
from backend.serving.postprocess import Postprocessor
from backend.serving.preprocess import Preprocessor
from backend.serving.request_copy import copy_request

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = ModelParameters.from_model_config(config)
        pre = PreprocessingConfig.from_parameters(params)
        self.pre = Preprocessor(pre.tokenizer_dir, add_special_tokens=pre.add_special_tokens,
                                max_prompt_bytes=pre.max_prompt_bytes)
        self.post = Postprocessor(pre.tokenizer_dir)
        self.llm = params.text("tensorrt_llm_model_name", "tensorrt_llm")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.input_names = [i["name"] for i in config["input"]]
        self.llm_outputs = [o["name"] for o in config["output"] if o["name"] not in DERIVED_OUTPUTS]
        self.llm_outputs += list(INTERNAL_OUTPUTS)
        # One response send at a time; exec() calls outside it, as the router's (model_repository/router/1/model.py
        # says why: a call waiting for room in a full engine held every other stream's sends and stops), at most
        # bls_waiting_calls of them waiting at once (backend/serving/bls_calls.py).
        self.ipc = threading.Lock()
        self.calls = call_gate(params)
        self.lock = threading.Lock()
        self.threads = set()
        self.held = BlsHold()  # finished BLS response iterators, let go of 30 s later on a thread holding the GIL

    def execute(self, requests):
        for request in requests:
            arrays, params = copy_request(pb_utils, request, self.input_names)
            thread = threading.Thread(target=self._serve, args=(request.get_response_sender(), arrays, params),
                                      daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def _serve(self, sender, arrays, params):
        try:
            self._generate(sender, llm_inputs(self.pre, arrays), params)
        except InvalidRequestError as exc:
            self._send(sender, _error(str(exc), pb_utils.TritonError.INVALID_ARG))
        except Exception as exc:  # never leave a client without its final response
            self._send(sender, _error(f"tensorrt_llm_bls: {exc}", pb_utils.TritonError.INTERNAL))
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _generate(self, sender, inputs, params):
        request = pb_utils.InferenceRequest(model_name=self.llm, inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
                                            requested_output_names=self.llm_outputs, parameters=params)
        with self.calls.enter():
            responses = request.exec(decoupled=self.decoupled)
        try:
            self._forward(sender, responses)
        finally:
            self._hold(responses)

    def _forward(self, sender, responses):
        for response in (responses if self.decoupled else [responses]):
            if response.has_error():
                self._send(sender, response)
                return
            llm = {t.name(): np.array(t.as_numpy(), copy=True) for t in response.output_tensors()}
            if not llm:
                continue  # tensorrt_llm's own flag-only final
            if sender.is_cancelled():
                self._stop(llm.get("request_key"))
                self._send(sender, _error("request cancelled", pb_utils.TritonError.CANCELLED))
                return
            out = client_outputs(self.post, llm)
            with self.ipc:  # the tensors held through the send (backend/serving/pb_release.py)
                send_tensors(pb_utils, sender, [pb_utils.Tensor(k, v) for k, v in out.items()],
                             0 if self.decoupled else _FINAL)
        if self.decoupled:
            self._send(sender, None)

    def _stop(self, key):
        """Stop the tensorrt_llm request of a cancelled client (the `stop` input, by its request_key)."""
        if key is None:
            return
        one = np.ones((1, 1), dtype=np.int32)
        inputs = [pb_utils.Tensor("input_ids", one), pb_utils.Tensor("input_lengths", one),
                  pb_utils.Tensor("request_output_len", one), pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool)),
                  pb_utils.Tensor("request_key", key.reshape(1, 1).astype(np.uint64))]
        stop = pb_utils.InferenceRequest(model_name=self.llm, inputs=inputs, requested_output_names=[])
        responses = stop.exec(decoupled=self.decoupled)
        for _ in (responses if self.decoupled else []):
            pass  # its flag-only final
        self._hold(responses)

    def _hold(self, responses):
        """A decoupled call's response iterator is let go of later, never here (backend/serving/pb_release.py)."""
        if self.decoupled:
            self.held.keep(responses)

    def _send(self, sender, response, flags=_FINAL):
        with self.ipc:
            sender.send(response, flags=flags)

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=60)
        release_at_finalize(self)  # now, while the stub can still take what the releases do
