"""Triton adapter for tensorrt_llm_bls: the ensemble's contract in one model (logic: backend/serving/bls.py).

One request at a time per instance, on the thread Triton calls execute() on, as the anchor's BLS: a request holds its
instance until its final response, and instance_group's count (bls_instance_count) is how many the model serves at
once; the others wait in Triton's queue. Never an exec() beside a thread reading another call's responses: in Triton
2.51's Python backend that can deadlock the whole model process (docs/canary.md, "Limits").
Through the response sender: decoupled, one response per tensorrt_llm response then a flag-only final (as the
anchor's BLS); not decoupled, exactly one response. A client that cancels has its tensorrt_llm request stopped by
request_key, sent to `stop_model` (the LLM model; in a canary repository the version that served the stream, past
the router, whose instances may all be busy forwarding streams).
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.errors import InvalidRequestError
from backend.serving.bls import DERIVED_OUTPUTS, INTERNAL_OUTPUTS, client_outputs, llm_inputs
from backend.serving.parameters import read_model_config
from backend.serving.pb_release import BlsHold, release_at_finalize, send_tensors
from backend.serving.postprocess import Postprocessor
from backend.serving.preprocess import Preprocessor
from backend.serving.request_copy import copy_request
from backend.serving.stop_request import stop_inputs, stop_version

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
SERVED_VERSION = "served_version"  # the canary router's output: the tensorrt_llm version serving the stream


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        bls = read_model_config(config, args["model_name"], "tensorrt_llm_bls")
        pre = bls.pre
        self.pre = Preprocessor(pre.tokenizer_dir, add_special_tokens=pre.add_special_tokens,
                                max_prompt_bytes=pre.max_prompt_bytes)
        self.post = Postprocessor(pre.tokenizer_dir, bls.skip_special_tokens)
        self.llm, self.stop_model = bls.llm_model, bls.stop_model
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.input_names = [i["name"] for i in config["input"]]
        self.llm_outputs = [o["name"] for o in config["output"] if o["name"] not in DERIVED_OUTPUTS]
        self.llm_outputs += list(INTERNAL_OUTPUTS)
        if self.stop_model != self.llm:  # the canary router: it names the version serving each response
            self.llm_outputs.append(SERVED_VERSION)
        self.held = BlsHold()  # finished BLS response iterators, let go of 30 s later on a thread holding the GIL

    def execute(self, requests):
        for request in requests:  # one by one, each to its final response (the module docstring says why)
            arrays, params = copy_request(pb_utils, request, self.input_names)
            self._serve(request.get_response_sender(), arrays, params)
        return None

    def _serve(self, sender, arrays, params):
        try:
            self._generate(sender, llm_inputs(self.pre, arrays), params)
        except InvalidRequestError as exc:
            self._send(sender, _error(str(exc), pb_utils.TritonError.INVALID_ARG))
        except Exception as exc:  # never leave a client without its final response
            self._send(sender, _error(f"tensorrt_llm_bls: {exc}", pb_utils.TritonError.INTERNAL))

    def _generate(self, sender, inputs, params):
        request = pb_utils.InferenceRequest(model_name=self.llm, inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
                                            requested_output_names=self.llm_outputs, parameters=params)
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
                self._stop(llm.get("request_key"), llm.get(SERVED_VERSION))
                self._send(sender, _error("request cancelled", pb_utils.TritonError.CANCELLED))
                return
            llm.pop(SERVED_VERSION, None)
            out = client_outputs(self.post, llm)
            # the tensors held through the send (backend/serving/pb_release.py)
            send_tensors(pb_utils, sender, [pb_utils.Tensor(k, v) for k, v in out.items()],
                         0 if self.decoupled else _FINAL)
        if self.decoupled:
            self._send(sender, None)

    def _stop(self, key, version):
        """Stop the tensorrt_llm request of a cancelled client (the `stop` input, by its request_key), on the
        version that served it when the router said which."""
        if key is None:
            return
        stop = pb_utils.InferenceRequest(model_name=self.stop_model,
                                         inputs=[pb_utils.Tensor(k, v) for k, v in stop_inputs(key).items()],
                                         requested_output_names=[], model_version=stop_version(version))
        responses = stop.exec(decoupled=self.decoupled)
        for _ in (responses if self.decoupled else []):
            pass  # its flag-only final
        self._hold(responses)

    def _hold(self, responses):
        """A decoupled call's response iterator is let go of later, never here (backend/serving/pb_release.py)."""
        if self.decoupled:
            self.held.keep(responses)

    def _send(self, sender, response, flags=_FINAL):
        sender.send(response, flags=flags)

    def finalize(self):
        release_at_finalize(self)  # now, while the stub can still take what the releases do
