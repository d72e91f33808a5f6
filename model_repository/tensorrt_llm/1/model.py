"""Triton adapter for the in-flight-batched LLM: requests go to the engine's thread, responses stream back.

Each request gets its responses through its response sender, from the engine thread; execute() returns at once.
Decoupled (`decoupled_mode` true) it streams; otherwise it sends exactly one response per request (KServe unary
inference; backend/serving/response_group.py). The engine, its scheduler and the tensor contract live in backend/
(unit-tested without Triton).
"""
import dataclasses
import json
import secrets
from pathlib import Path

import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.engine.interface import RequestOutput
from backend.engine.llm_engine import LLMEngine
from backend.engine.sequence import FinishReason, Request
from backend.engine.trtllm_executor import TrtllmExecutorEngine, is_engine_dir
from backend.errors import InvalidRequestError, UnavailableError
from backend.formats.versions import artifact_for
from backend.policy.admission import AdmissionController, Lease, RowCost
from backend.policy.api_keys import AuthenticationError
from backend.policy.request_context import request_context
from backend.policy.tenants import load_limits
from backend.serving import stream_errors
from backend.serving.cancel_watch import CancelWatch, Watched
from backend.serving.engine_loop import EngineLoop
from backend.serving.lifecycle import PhaseWatcher
from backend.serving.metric_owners import MetricOwners
from backend.serving.parameters import read_model_config
from backend.serving.pb_release import release_at_finalize, send_tensors
from backend.serving.response_group import ResponseGroup, RowError
from backend.serving.send_queue import SendQueue
from backend.serving.stream_acks import open_board
from backend.serving.tenant_metrics import TenantMetrics
from backend.serving.triton_io import RowStream, parse_request
from backend.serving.triton_metrics import NoMetrics, TritonMetrics

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error_response(error: RowError):
    code = getattr(pb_utils.TritonError, error.code)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message, code))


def _send_error(sender, message: str, code) -> None:
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=_FINAL)


def _ignore(exc):
    """A metrics update that failed (logged by the SendQueue) must not touch any request."""


def _sender_send(sender, sends, watched, on_error, request_key, errors_in_stream):
    """ResponseGroup's send callback over a Triton response sender: the send itself runs on the SendQueue's thread
    (backend/serving/send_queue.py), in order, while the engine thread goes on. The final send finishes `watched`
    on that thread, before any later cancellation poll there (backend/serving/cancel_watch.py says why).
    errors_in_stream: an error goes as a stream_error response (backend/serving/stream_errors.py)."""

    def send(response, final: bool, on_sent) -> None:
        def deliver():
            flags = _FINAL if final else 0
            try:
                if isinstance(response, RowError) and errors_in_stream:
                    tensors = stream_errors.error_tensors(response.code, response.message, request_key)
                    send_tensors(pb_utils, sender, [pb_utils.Tensor(n, v) for n, v in tensors.items()], flags)
                elif isinstance(response, RowError):
                    sender.send(_error_response(response), flags=flags)
                elif response is None:
                    sender.send(None, flags=flags)
                else:  # the tensors held through the send (backend/serving/pb_release.py)
                    send_tensors(pb_utils, sender, [pb_utils.Tensor(n, v) for n, v in response.items()], flags)
            finally:
                if on_sent is not None:
                    on_sent()
                if final:
                    watched.finish()

        sends.submit(deliver, on_error)

    return send


class _RowSink:
    """engine_loop.OutputSink for one row (a batch row, or one of its num_return_sequences)."""

    def __init__(self, group: ResponseGroup, watched: Watched, stream: RowStream, metrics: TritonMetrics,
                 lease: Lease) -> None:
        self.group = group
        self.watched = watched  # the sender's is_cancelled(), polled off the engine thread (CancelWatch)
        self.stream = stream
        self.metrics = metrics
        self.lease = lease  # admission ticket (released when the row ends) and deadline

    def emit(self, output: RequestOutput) -> None:
        self.lease.on_output(bool(output.new_token_ids), output.finished, output.num_output_tokens)
        if output.finished:
            self.metrics.observe_finished(output)
        try:
            self._send(output)
        finally:
            if output.finished:  # after the final response took its stamp from the row's ack slot
                self.stream.close()

    def _send(self, output: RequestOutput) -> None:
        if output.finish_reason is FinishReason.CANCELLED and self.lease.timed_out:
            self.group.send(RowError(self.lease.timeout_message(), "UNAVAILABLE"), row_done=True)
        elif output.finish_reason is FinishReason.CANCELLED and self.watched.cancelled:
            self.group.send(RowError("request cancelled", "CANCELLED"), row_done=True)
        else:
            self.group.send(self.stream.on_output(output), row_done=output.finished, on_sent=self.stream.sent)

    def fail(self, error: Exception) -> None:
        self.lease.on_fail()
        self.stream.close()
        code = "INTERNAL"
        if isinstance(error, InvalidRequestError):
            code = "INVALID_ARG"
        elif isinstance(error, UnavailableError):
            code = "UNAVAILABLE"
        self.group.send(RowError(str(error), code), row_done=True)

    def cancelled(self) -> bool:
        return self.watched.cancelled or self.lease.expired() or self.group.failed or self.group.abandoned


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_names = [i["name"] for i in config["input"]]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.serving = read_model_config(config, args["model_name"], "tensorrt_llm")
        # A version folder with an artifact.json serves its own build (backend/formats/versions.py).
        artifact = artifact_for(Path(args["model_repository"]), int(args["model_version"]))
        engine_dir = artifact.engine_dir if artifact else self.serving.engine_dir
        # A trtllm-build engine dir (rank*.engine) runs on TensorRT-LLM's executor; a checkpoint on our engine.
        engine_cls = TrtllmExecutorEngine if is_engine_dir(engine_dir) else LLMEngine
        self.tenancy = self.serving.tenancy
        self.admission = AdmissionController(load_limits(self.tenancy.limits_file))
        aging_s = self.admission.limits.engine_priority_aging_s  # tiers' priorities age (no starvation)
        self.engine = engine_cls(engine_dir, dataclasses.replace(self.serving.engine, priority_aging_s=aging_s))
        name, version = args["model_name"], args["model_version"]
        self.metrics = TritonMetrics(pb_utils, name, version) if self.serving.publish_metrics else NoMetrics()
        self.tenant_metrics = (TenantMetrics(pb_utils, name, version) if self.serving.publish_metrics
                               else NoMetrics())
        # Another copy of this version (a reload) shares our metrics in Triton: backend/serving/metric_owners.py.
        self.metric_owners = MetricOwners(args["model_repository"], version) if self.serving.publish_metrics else None
        # Streamed rows' acks from the ensemble's postprocessing (backend/serving/stream_acks.py).
        self.acks = open_board()
        # Round trips to the Triton process (responses, metrics, is_cancelled) stay off the engine thread.
        self.sends = SendQueue()
        # Polls run on the send thread, between sends: none can follow a request's final response.
        self.cancel_watch = CancelWatch(self.serving.cancellation_check_period_s,
                                        run=lambda poll: self.sends.submit(poll, _ignore))
        self.loop = EngineLoop(self.engine, self.serving.cancellation_check_period_s,
                               on_stats=lambda stats: self.sends.submit(lambda: self._publish(stats), _ignore),
                               cpus=self.serving.engine_cpus)
        # request_key -> its engine request ids, for `stop`; Triton request id -> request_key only where the unsafe
        # stop_by_request_id parameter allows stopping by request id.
        self.by_key = {}
        self.by_triton_id = {}
        # The launcher's shutdown / restart phase (backend/serving/lifecycle.py): refuse, or fail what is in flight.
        self.phase = PhaseWatcher.from_env(name, lambda: self.loop.inflight + self.sends.pending,
                                           lambda reason: self.loop.fail_all(UnavailableError(reason)))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._execute_one(request, sender)
            except Exception as exc:  # a bug of ours: this request gets an error, the others in the batch go on
                pb_utils.Logger.log_error(f"tensorrt_llm: request {request.request_id()!r} failed: {exc!r}")
                try:  # no traceback or server paths to the client; the log has the exception
                    _send_error(sender, f"internal error ({type(exc).__name__}) while accepting the request",
                                pb_utils.TritonError.INTERNAL)
                except Exception as send_exc:  # its final response already sent: nothing more to tell it
                    pb_utils.Logger.log_error(f"tensorrt_llm: the error response failed too: {send_exc!r}")
        return None

    def _execute_one(self, request, sender):
        inputs = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        if inputs.get("stop") is not None and bool(inputs["stop"].reshape(-1)[0]):
            self._stop(request.request_id(), inputs.get("request_key"), sender)
            return
        if not self.phase.current.admitting:
            _send_error(sender, self.phase.refusal(), pb_utils.TritonError.UNAVAILABLE)
            return
        try:
            rows = parse_request(inputs, self.serving.exclude_input_in_output, self.decoupled)
            errors_in_stream = stream_errors.wanted(inputs, self.decoupled)
            context = request_context(request.parameters(), self.tenancy.tenant_header,
                                      self.admission.limits.credentials)
        except AuthenticationError as exc:
            self.tenant_metrics.observe_unauthenticated()
            _send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)  # no UNAUTHENTICATED code in 2.51
            return
        except InvalidRequestError as exc:
            _send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
            return
        leases = self._admit(context, rows, sender)
        if leases:
            self._submit(request.request_id(), sender, rows, leases, errors_in_stream)

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

    def _submit(self, triton_id, sender, rows, leases, errors_in_stream):
        # One random 63-bit key per Triton request, returned as `request_key`: only who holds it can `stop` it.
        key = secrets.randbits(63)
        ids = [f"{key}.{i}" for i in range(len(rows))]
        self.by_key[key] = ids
        if triton_id and self.serving.stop_by_request_id:
            self.by_triton_id[triton_id] = key
        pad_id = rows[0].sampling.pad_id
        # A send that fails (the client went away) abandons the group: the engine loop then cancels its rows.
        watched = self.cancel_watch.watch(sender.is_cancelled)
        send = _sender_send(sender, self.sends, watched, lambda exc: group.abandon(), key, errors_in_stream)
        group = ResponseGroup(len(rows), self.decoupled, send, lambda: self._forget(triton_id, key, watched),
                              pad_id=-1 if pad_id is None else pad_id)
        for engine_id, row, lease in zip(ids, rows, leases):
            tenant = lease.ticket.tenant  # tier -> scheduler priority; salted tenants share no cached blocks
            request = Request(engine_id, row.prompt_ids, row.sampling, cache_salt=tenant.cache_salt,
                              priority=tenant.priority)
            stream = RowStream(row, key, ack=self.acks.lease() if row.streaming and self.acks else None,
                               interval=self.serving.stream_interval)
            self.loop.submit(request, _RowSink(group, watched, stream, self.metrics, lease))

    def _forget(self, triton_id, key, watched):
        watched.finish()
        self.by_key.pop(key, None)
        if triton_id and self.by_triton_id.get(triton_id) == key:
            del self.by_triton_id[triton_id]

    def _stop(self, triton_id, request_key, sender):
        """`stop`: end the request whose `request_key` this is (postprocessing stops a cancelled ensemble request
        so). By Triton request id (the anchor's flow) only where the unsafe stop_by_request_id parameter is set:
        a request id is no secret, so anyone could end anyone's stream."""
        if request_key is not None and request_key.size:
            keys = [int(k) for k in request_key.reshape(-1)]
        elif self.serving.stop_by_request_id and triton_id:
            keys = [self.by_triton_id[triton_id]] if triton_id in self.by_triton_id else []
        else:
            _send_error(sender, "stop needs request_key: the key returned with the request's responses (stopping "
                        "by request id is off; the tensorrt_llm parameter stop_by_request_id turns it on, unsafely)",
                        pb_utils.TritonError.INVALID_ARG)
            return
        for key in keys:
            for engine_id in self.by_key.get(key, []):
                self.loop.cancel(engine_id)
        # As the anchor: a final response without tensors (unary: an empty response, which must carry one).
        sender.send(None if self.decoupled else pb_utils.InferenceResponse([]), flags=_FINAL)

    def finalize(self):
        self.phase.close()
        self.loop.shutdown()
        self.cancel_watch.close()
        self.sends.close(timeout=10.0)
        self.engine.close()  # a parallel engine's worker processes exit here
        if self.acks is not None:
            self.acks.close()
        if self.metric_owners is not None:  # kept while another copy writes them; else deleted by release_at_finalize
            self.metric_owners.finish(self.metrics, self.tenant_metrics)
        # Senders left in cycles, and the metric families, go now, while the stub can still take it.
        release_at_finalize(self)
