"""Triton adapter for the canary router: picks a version of the LLM model per request (backend.policy.canary_router) and
streams that version's responses back unchanged, plus `served_version` (the version that served it).

One request at a time per instance, on the thread Triton calls execute() on: a stream holds its instance until its
final response, and the router's instance_group count (router_instance_count) is how many requests it forwards at
once; the others wait in Triton's queue. Never an exec() beside a thread reading another call's responses: in
Triton 2.51's Python backend that can deadlock the whole model process (docs/canary.md, "Limits").
A `stop` request goes to every served version (the one serving its request_key answers it; no instance knows
which, each forwarding one request at a time). Postprocessing and tensorrt_llm_bls send theirs straight to the
version that served the stream (ensembles/canary_render.py), never queued behind the streams this model forwards.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.policy.canary_router import (
    Router,
    RoutingError,
    RoutingFile,
    RoutingTable,
    expected_finals,
    pinned_version,
    routing_key,
)
from backend.serving.metric_owners import MetricOwners
from backend.serving.parameters import read_model_config
from backend.serving.pb_release import BlsHold, release_at_finalize, send_tensors
from backend.serving.request_copy import copy_request
from backend.serving.router_forwarding import Forwarding, Outcome
from backend.serving.router_metrics import RouterMetrics, StreamTiming

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_ROUTER_INPUTS = ("session_id", "pin_version")  # ours; every other input goes to the LLM as it came


def _error(message, code=None):
    code = pb_utils.TritonError.INTERNAL if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        router = read_model_config(config, args["model_name"], "router")
        self.llm = router.llm_model
        self.input_names = [i["name"] for i in config["input"]]
        self.llm_outputs = [o["name"] for o in config["output"] if o["name"] != "served_version"]
        # Not decoupled (decoupled_mode false): one response per request, every sequence in it (one final).
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.routing = RoutingFile(router.routing_file, Router(RoutingTable({1: 100}, stable=1)))
        self.routing.refresh()
        if self.routing.last_error:
            raise pb_utils.TritonModelException(f"router: {self.routing.last_error}")
        self.held = BlsHold()  # finished BLS response iterators, let go of 30 s later on a thread holding the GIL
        self.metrics = RouterMetrics(pb_utils, self.llm)  # per-version figures (backend/serving/router_metrics.py)
        # Another copy of the router (a reload) shares these metrics in Triton: backend/serving/metric_owners.py.
        self.metric_owners = MetricOwners(args["model_repository"], args["model_version"])

    def execute(self, requests):
        for request in requests:  # one by one, each to its final response (the module docstring says why)
            arrays, params = copy_request(pb_utils, request, self.input_names)
            self._serve(request.get_response_sender(), arrays, params)
        return None

    def _serve(self, sender, arrays, params):
        try:
            self._route(sender, arrays, params)
        except RoutingError as exc:
            self._send(sender, _error(str(exc), pb_utils.TritonError.INVALID_ARG))
        except Exception as exc:  # never leave a client without its final response
            self._send(sender, _error(f"router: {exc}"))

    def _route(self, sender, arrays, params):
        inputs = [pb_utils.Tensor(name, arrays[name]) for name in self.input_names
                  if name in arrays and name not in _ROUTER_INPUTS]
        stop = arrays.get("stop")
        if stop is not None and bool(stop.reshape(-1)[0]):
            return self._stop(inputs, sender)
        session, pin_input = arrays.get("session_id"), arrays.get("pin_version")
        key = routing_key(params, None if session is None else session.reshape(-1)[0].decode())
        pin = pinned_version(params, None if pin_input is None else int(pin_input.reshape(-1)[0]))
        finals = (expected_finals(arrays["input_ids"].shape[0], arrays.get("num_return_sequences"))
                  if self.decoupled else 1)
        streaming = arrays.get("streaming")
        timed = finals == 1 and streaming is not None and bool(streaming.reshape(-1)[0])  # TTFT / ITL measurable
        unavailable = frozenset()
        while True:
            version = self.routing.refresh().choose(key, pin, unavailable)
            if self._forward(inputs, version, finals, sender, retry_allowed=pin is None, timed=timed, params=params):
                return
            unavailable |= {version}  # unloaded between the choice and the call (a promotion): choose again

    def _forward(self, inputs, version, finals, sender, retry_allowed, timed, params):
        """Stream version's responses to sender; False (nothing sent) when the version is gone and a retry may help."""
        timing = StreamTiming(start=time.monotonic())
        self.metrics.started(version)
        outcome = Outcome.GONE  # not counted when retried on another version
        try:
            outcome = self._stream(inputs, version, Forwarding(finals, retry_allowed), sender, timing, params)
            return outcome is not Outcome.GONE
        except Exception:
            outcome = Outcome.ERROR
            raise
        finally:
            self.metrics.finished(version, outcome, timing if timed and outcome is Outcome.OK else None)

    def _stream(self, inputs, version, fwd, sender, timing, params):
        """The forwarding itself (backend/serving/router_forwarding.py decides what each response becomes). The
        request's parameters go along: the credentials and tenant tensorrt_llm decides the tenant from."""
        llm_request = pb_utils.InferenceRequest(model_name=self.llm, model_version=version, inputs=inputs,
                                                requested_output_names=self.llm_outputs, parameters=params)
        served = np.full((1, 1), version, dtype=np.int32)
        responses = None
        try:
            responses = llm_request.exec(decoupled=self.decoupled)
            for response in (responses if self.decoupled else [responses]):
                if fwd.complete:
                    continue  # the version's own empty final after the last one forwarded
                if response.has_error():
                    outcome = fwd.on_error(lambda: self._gone(version))
                    if outcome is Outcome.ERROR:
                        self._send(sender, response)
                    return outcome
                # Copies: the BLS response's memory goes with it, the forwarded response must outlive it.
                arrays = {t.name(): np.array(t.as_numpy(), copy=True) for t in response.output_tensors()}
                final = fwd.on_tensors(arrays)
                if final is None:
                    continue
                if "sequence_length" in arrays:
                    timing.on_tokens(int(arrays["sequence_length"].reshape(-1)[0]), time.monotonic())
                tensors = [pb_utils.Tensor(name, value) for name, value in arrays.items()]
                # the tensors held through the send (backend/serving/pb_release.py)
                send_tensors(pb_utils, sender, tensors + [pb_utils.Tensor("served_version", served)],
                             _FINAL if final else 0)
        except pb_utils.TritonModelException:
            if fwd.on_error(lambda: self._gone(version)) is Outcome.GONE:
                return Outcome.GONE
            raise
        finally:
            self._hold(responses)
        if fwd.needs_final():
            self._send(sender, None if self.decoupled else pb_utils.InferenceResponse([]))
        return Outcome.ERROR if fwd.failed else Outcome.OK

    def _stop(self, inputs, sender):
        for version in self.routing.refresh().table.versions:
            stop = pb_utils.InferenceRequest(model_name=self.llm, model_version=version, inputs=inputs,
                                             requested_output_names=[])
            responses = None
            try:
                responses = stop.exec(decoupled=self.decoupled)
                for response in (responses if self.decoupled else [responses]):
                    if response.has_error():
                        pb_utils.Logger.log_warn(f"router: stop on version {version}: {response.error().message()}")
            except pb_utils.TritonModelException as exc:
                pb_utils.Logger.log_warn(f"router: stop on version {version}: {exc}")
            finally:
                self._hold(responses)
        self._send(sender, None if self.decoupled else pb_utils.InferenceResponse([]))

    def _hold(self, responses):
        """A decoupled call's response iterator is let go of later, never here (backend/serving/pb_release.py)."""
        if self.decoupled and responses is not None:
            self.held.keep(responses)

    def _gone(self, version):
        return not pb_utils.is_model_ready(self.llm, str(version))

    def _send(self, sender, response, flags=_FINAL):
        sender.send(response, flags=flags)

    def finalize(self):
        if not self.metric_owners.finish(self.metrics):  # kept while another copy of the router writes them
            self.metrics.close()
        release_at_finalize(self)  # now, while the stub can still take what the releases do
