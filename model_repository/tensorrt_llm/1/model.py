"""Triton adapter for the in-flight-batched LLM: requests go to the engine's thread, responses stream back.

Decoupled: each request gets its responses through its response sender, from the engine thread; execute()
returns at once. The engine, its scheduler and the tensor contract live in backend/ (unit-tested without Triton).
"""
import json
import secrets
import threading
from pathlib import Path

import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.engine.interface import RequestOutput
from backend.engine.llm_engine import LLMEngine
from backend.engine.sequence import FinishReason, Request
from backend.engine.trtllm_executor import TrtllmExecutorEngine, is_engine_dir
from backend.errors import InvalidRequestError
from backend.formats.versions import artifact_for
from backend.policy.admission import AdmissionController, Lease, RowCost
from backend.policy.request_context import request_context
from backend.policy.tenants import load_limits
from backend.serving.engine_loop import EngineLoop
from backend.serving.parameters import ModelParameters, ServingConfig
from backend.serving.tenant_metrics import TenantMetrics
from backend.serving.triton_io import RowStream, parse_request
from backend.serving.triton_metrics import NoMetrics, TritonMetrics

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _send_error(sender, message: str, code) -> None:
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=_FINAL)


class _ResponseGroup:
    """The rows of one Triton request share its sender; the last row to finish sends the FINAL flag."""

    def __init__(self, sender, rows: int, on_done) -> None:
        self.sender = sender
        self.remaining = rows
        self.on_done = on_done
        self.lock = threading.Lock()

    def send(self, response, row_done: bool) -> None:
        with self.lock:
            if row_done:
                self.remaining -= 1
            last = self.remaining == 0
            if response is None and not last:
                return
            self.sender.send(response, flags=_FINAL if last else 0)
        if last:
            self.on_done()


class _RowSink:
    """engine_loop.OutputSink for one batch row."""

    def __init__(self, group: _ResponseGroup, stream: RowStream, metrics: TritonMetrics, lease: Lease) -> None:
        self.group = group
        self.stream = stream
        self.metrics = metrics
        self.lease = lease  # admission ticket (released when the row ends) and deadline

    def emit(self, output: RequestOutput) -> None:
        self.lease.on_output(bool(output.new_token_ids), output.finished, output.num_output_tokens)
        if output.finished:
            self.metrics.observe_finished(output)
        if output.finish_reason is FinishReason.CANCELLED and self.lease.timed_out:
            error = pb_utils.TritonError(self.lease.timeout_message(), pb_utils.TritonError.UNAVAILABLE)
            self.group.send(pb_utils.InferenceResponse(error=error), row_done=True)
            return
        if output.finish_reason is FinishReason.CANCELLED and self.group.sender.is_cancelled():
            error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
            self.group.send(pb_utils.InferenceResponse(error=error), row_done=True)
            return
        tensors = self.stream.on_output(output)
        response = None
        if tensors is not None:
            response = pb_utils.InferenceResponse([pb_utils.Tensor(n, v) for n, v in tensors.items()])
        self.group.send(response, row_done=output.finished)

    def fail(self, error: Exception) -> None:
        self.lease.on_fail()
        code = pb_utils.TritonError.INVALID_ARG if isinstance(error, InvalidRequestError) else pb_utils.TritonError.INTERNAL
        self.group.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), code)), row_done=True)

    def cancelled(self) -> bool:
        return self.group.sender.is_cancelled() or self.lease.expired()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_names = [i["name"] for i in config["input"]]
        self.serving = ServingConfig.from_parameters(ModelParameters.from_model_config(config))
        # A version folder with an artifact.json serves its own build (backend/formats/versions.py).
        artifact = artifact_for(Path(args["model_repository"]), int(args["model_version"]))
        engine_dir = artifact.engine_dir if artifact else self.serving.engine_dir
        # A trtllm-build engine dir (rank*.engine) runs on TensorRT-LLM's executor; a checkpoint on our engine.
        engine_cls = TrtllmExecutorEngine if is_engine_dir(engine_dir) else LLMEngine
        self.engine = engine_cls(engine_dir, self.serving.engine)
        name, version = args["model_name"], args["model_version"]
        self.metrics = TritonMetrics(pb_utils, name, version) if self.serving.publish_metrics else NoMetrics()
        self.tenancy = self.serving.tenancy
        self.admission = AdmissionController(load_limits(self.tenancy.limits_file))
        self.tenant_metrics = (TenantMetrics(pb_utils, name, version) if self.serving.publish_metrics
                               else NoMetrics())
        self.loop = EngineLoop(self.engine, self.serving.cancellation_check_period_s, on_stats=self._publish)
        # Triton request id -> engine request ids, for the anchor's `stop` input.
        self.by_triton_id = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            if inputs.get("stop") is not None and bool(inputs["stop"].reshape(-1)[0]):
                self._stop(request.request_id(), inputs.get("request_key"), sender)
                continue
            try:
                rows = parse_request(inputs, self.serving.exclude_input_in_output)
                context = request_context(request.parameters(), self.tenancy.tenant_header)
            except InvalidRequestError as exc:
                _send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
                continue
            leases = self._admit(context, rows, sender)
            if leases:
                self._submit(request.request_id(), sender, rows, leases)
        return None

    def _admit(self, context, rows, sender):
        """The rows' leases, or None after refusing the request at once (never queued; docs/rate_limiting.md)."""
        admission = self.admission.admit(context.tenant_id, [RowCost(len(r.prompt_ids), r.sampling.max_tokens)
                                                             for r in rows])
        self.tenant_metrics.observe(admission)
        if not admission.admitted:
            self.loop.wake()  # the engine thread publishes the refusal's count, also when idle
            code = pb_utils.TritonError.INVALID_ARG if admission.permanent else pb_utils.TritonError.UNAVAILABLE
            _send_error(sender, admission.error_message(), code)
            return None
        return [Lease(self.admission, ticket, context.timeout_ms) for ticket in admission.tickets]

    def _publish(self, stats):
        self.metrics.update(stats)
        self.tenant_metrics.update(self.admission.snapshot())

    def _submit(self, triton_id, sender, rows, leases):
        # Engine request ids are random 63-bit keys, sent back as `request_key` so a later request can stop them.
        keys = [secrets.randbits(63) for _ in rows]
        ids = [str(key) for key in keys]
        if triton_id:
            self.by_triton_id[triton_id] = ids
        group = _ResponseGroup(sender, len(rows), lambda: self._forget(triton_id, ids))
        for engine_id, key, row, lease in zip(ids, keys, rows, leases):
            tenant = lease.ticket.tenant  # tier -> scheduler priority; salted tenants share no cached blocks
            request = Request(engine_id, row.prompt_ids, row.sampling, cache_salt=tenant.cache_salt,
                              priority=tenant.priority)
            self.loop.submit(request, _RowSink(group, RowStream(row, key), self.metrics, lease))

    def _forget(self, triton_id, ids):
        if triton_id and self.by_triton_id.get(triton_id) is ids:
            del self.by_triton_id[triton_id]

    def _stop(self, triton_id, request_key, sender):
        """The anchor's `stop`: end the requests sent with this Triton request id, or the one with this
        `request_key` (how postprocessing stops a request whose ensemble request was cancelled)."""
        ids = self.by_triton_id.pop(triton_id, []) if triton_id else []
        if request_key is not None:
            ids = ids + [str(int(k)) for k in request_key.reshape(-1)]
        for engine_id in ids:
            self.loop.cancel(engine_id)
        sender.send(None, flags=_FINAL)

    def finalize(self):
        self.loop.shutdown()
        self.engine.close()  # a parallel engine's worker processes exit here
        self.metrics = self.tenant_metrics = None  # metric families are released with this model
