"""Triton adapter for the canary router: picks a version of the LLM model per request (backend.canary_router) and
streams that version's responses back unchanged, plus `served_version` (the version that served it).

Decoupled BLS: each request is forwarded from its own thread, so a long stream never blocks the others.
A `stop` request (postprocessing stopping a cancelled request by request_key) goes to the version that serves
that key, or to every served version when the key is unknown here.
"""
import json
import threading

import numpy as np

import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path
import triton_python_backend_utils as pb_utils

from backend.canary_router import (RoutingError, RoutingFile, Router, RoutingTable, expected_finals, pinned_version,
                                   routing_key)

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_ROUTER_INPUTS = ("session_id", "pin_version")  # ours; every other input goes to the LLM as it came


def _numpy(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _error(message, code=None):
    code = pb_utils.TritonError.INTERNAL if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.llm = params["llm_model"]
        self.forward_inputs = [i["name"] for i in config["input"] if i["name"] not in _ROUTER_INPUTS]
        self.llm_outputs = [o["name"] for o in config["output"] if o["name"] != "served_version"]
        self.routing = RoutingFile(params["routing_file"], Router(RoutingTable({1: 100}, stable=1)))
        self.routing.refresh()
        if self.routing.last_error:
            raise pb_utils.TritonModelException(f"router: {self.routing.last_error}")
        self.served_by_key = {}  # request_key -> version, while its stream runs (for `stop`)
        self.lock = threading.Lock()
        self.threads = set()
        family = pb_utils.MetricFamily(name="tritonllm_router_requests_total", kind=pb_utils.MetricFamily.COUNTER,
                                       description="Requests routed, by served version and outcome (ok, error)")
        self.counter_family, self.counters = family, {}

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self._serve, args=(request,), daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def _serve(self, request):
        sender = request.get_response_sender()
        try:
            self._route(request, sender)
        except RoutingError as exc:
            sender.send(_error(str(exc), pb_utils.TritonError.INVALID_ARG), flags=_FINAL)
        except Exception as exc:  # never leave a client without its final response
            sender.send(_error(f"router: {exc}"), flags=_FINAL)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _route(self, request, sender):
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, n) for n in self.forward_inputs) if t is not None]
        stop = _numpy(request, "stop")
        if stop is not None and bool(stop.reshape(-1)[0]):
            return self._stop(request, inputs, sender)
        params = json.loads(request.parameters() or "{}")
        session = _numpy(request, "session_id")
        pin_input = _numpy(request, "pin_version")
        key = routing_key(params, None if session is None else session.reshape(-1)[0].decode())
        pin = pinned_version(params, None if pin_input is None else int(pin_input.reshape(-1)[0]))
        finals = expected_finals(_numpy(request, "input_ids").shape[0], _numpy(request, "num_return_sequences"))
        unavailable = frozenset()
        while True:
            version = self.routing.refresh().choose(key, pin, unavailable)
            if self._forward(inputs, version, finals, sender, retry_allowed=pin is None):
                return
            unavailable |= {version}  # unloaded between the choice and the call (a promotion): choose again

    def _forward(self, inputs, version, finals, sender, retry_allowed):
        """Stream version's responses to sender; False (nothing sent) when the version is gone and a retry may help."""
        llm_request = pb_utils.InferenceRequest(model_name=self.llm, model_version=version, inputs=inputs,
                                                requested_output_names=self.llm_outputs)
        served = np.full((1, 1), version, dtype=np.int32)
        sent = done = 0
        try:
            for response in llm_request.exec(decoupled=True):
                if done >= finals:
                    continue  # the empty final response after the last one forwarded
                if response.has_error():
                    if sent == 0 and retry_allowed and not pb_utils.is_model_ready(self.llm, str(version)):
                        return False
                    sender.send(response, flags=_FINAL)
                    self._count(version, "error")
                    return True
                tensors = response.output_tensors()
                if not tensors:
                    continue
                done += self._track(tensors, version)
                sender.send(pb_utils.InferenceResponse(tensors + [pb_utils.Tensor("served_version", served)]),
                            flags=_FINAL if done >= finals else 0)
                sent += 1
        except pb_utils.TritonModelException:
            if sent == 0 and retry_allowed and not pb_utils.is_model_ready(self.llm, str(version)):
                return False
            raise
        if done < finals:
            sender.send(None, flags=_FINAL)
        self._count(version, "ok")
        return True

    def _track(self, tensors, version):
        """Remember which version serves each request_key until its final response; 1 when this one is final."""
        by_name = {t.name(): t.as_numpy() for t in tensors}
        final = bool(by_name["stream_final"].reshape(-1)[0]) if "stream_final" in by_name else False
        key = int(by_name["request_key"].reshape(-1)[0]) if "request_key" in by_name else None
        with self.lock:
            if key is not None and final:
                self.served_by_key.pop(key, None)
            elif key is not None:
                self.served_by_key[key] = version
        return int(final)

    def _stop(self, request, inputs, sender):
        key = _numpy(request, "request_key")
        with self.lock:
            known = None if key is None else self.served_by_key.get(int(key.reshape(-1)[0]))
        versions = [known] if known is not None else self.routing.refresh().table.versions
        for version in versions:
            stop = pb_utils.InferenceRequest(model_name=self.llm, model_version=version, inputs=inputs,
                                             requested_output_names=[])
            try:
                for response in stop.exec(decoupled=True):
                    if response.has_error():
                        pb_utils.Logger.log_warn(f"router: stop on version {version}: {response.error().message()}")
            except pb_utils.TritonModelException as exc:
                pb_utils.Logger.log_warn(f"router: stop on version {version}: {exc}")
        sender.send(None, flags=_FINAL)

    def _count(self, version, outcome):
        label = (str(version), outcome)
        with self.lock:
            if label not in self.counters:
                self.counters[label] = self.counter_family.Metric(
                    labels={"model": self.llm, "served_version": label[0], "outcome": outcome})
            counter = self.counters[label]
        counter.increment(1)

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=60)
        self.counters, self.counter_family = {}, None
