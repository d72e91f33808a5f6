"""Triton adapter for the detokenizer step; the logic lives in backend.serving.postprocess."""
import collections
import json

import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.errors import InvalidRequestError
from backend.serving import stream_errors
from backend.serving.cancel_watch import CancelPolls
from backend.serving.parameters import read_model_config
from backend.serving.pb_release import release_at_finalize
from backend.serving.postprocess import Postprocessor
from backend.serving.stop_request import stop_inputs, stop_version
from backend.serving.stream_acks import AckWriter

# Optional inputs passed through unchanged as OUT_<name>, so that every ensemble output of one streamed step
# arrives in one response.
_PASS_THROUGH = (
    "CUM_LOG_PROBS", "OUTPUT_LOG_PROBS", "TOP_LOG_PROBS", "TOP_LOG_PROBS_IDS", "CONTEXT_LOGITS", "GENERATION_LOGITS", "BATCH_INDEX", "SEQUENCE_INDEX",
    "NUM_INPUT_TOKENS", "NUM_OUTPUT_TOKENS", "KV_CACHE_ALLOC_NEW_BLOCKS", "KV_CACHE_REUSED_BLOCKS",
    "KV_CACHE_ALLOC_TOTAL_BLOCKS", "ARRIVAL_TIME_NS", "FIRST_SCHEDULED_TIME_NS", "FIRST_TOKEN_TIME_NS",
    "LAST_TOKEN_TIME_NS", "ACCEPTANCE_RATE", "TOTAL_ACCEPTED_DRAFT_TOKENS", "TOTAL_DRAFT_TOKENS", "SERVED_VERSION",
)


def _inputs(request):
    """name -> array of the inputs the request carries (one pass: get_input_tensor_by_name scans them all per call,
    29 calls a streamed token here)."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


class TritonPythonModel:
    def initialize(self, args):
        config = read_model_config(json.loads(args["model_config"]), args["model_name"], "postprocessing")
        self.post = Postprocessor(config.tokenizer_dir, config.skip_special_tokens)
        self.stopped = collections.deque(maxlen=4096)  # request keys already stopped
        # is_cancelled() per streamed token was one IPC round trip per token: ask at most every 0.1 s per stream.
        self.polls = CancelPolls(period_s=0.1)
        # Where `stop` goes: the LLM model (the version named by SERVED_VERSION in a canary repository).
        self.stop_model = config.stop_model
        self.acks = AckWriter()

    def finalize(self):
        release_at_finalize(self)  # and the process's exit skips collecting torch's and transformers' objects

    def execute(self, requests):
        return [self._handle(request, _inputs(request)) for request in requests]

    def _handle(self, request, given):
        """Polls the stream's cancellation, builds its response, then acks it as taken: the stream's next tokens may
        come (backend/serving/stream_acks.py)."""
        final, key = given.get("STREAM_FINAL"), given.get("REQUEST_KEY")
        if key is not None:
            key_id = int(key.reshape(-1)[0])
            # A final response's engine request is over (always so when not decoupled): nothing to stop.
            if final is None or bool(final.reshape(-1)[0]):
                self.polls.forget(key_id)
            elif self.polls.due(key_id) and request.is_cancelled():  # an IPC round trip
                self._stop_engine_request(key, given.get("SERVED_VERSION"))
        response = self._respond(given)
        if (ack := given.get("STREAM_ACK")) is not None:
            self.acks.ack(ack)
        return response

    def _respond(self, given):
        try:
            if (error := given.get(stream_errors.POSTPROCESSING_INPUT)) is not None:
                code, message = stream_errors.read(error)  # tensorrt_llm's error for the request: its last response
                error = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
                return pb_utils.InferenceResponse(error=error)
            return pb_utils.InferenceResponse(output_tensors=self._process(given))
        except InvalidRequestError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))

    def _stop_engine_request(self, key, served_version=None):
        """Triton marks only the ensemble's new composing requests cancelled, not tensorrt_llm's in-flight one: the
        first cancelled response of a stream tells it to stop (the anchor's `stop`, by request_key). In a canary
        repository the stop goes to the tensorrt_llm version that served the stream (the router's served_version),
        not through the router, whose instances may all be busy forwarding streams."""
        if key is None or int(key.reshape(-1)[0]) in self.stopped:
            return
        self.stopped.append(int(key.reshape(-1)[0]))
        stop = pb_utils.InferenceRequest(model_name=self.stop_model,
                                         inputs=[pb_utils.Tensor(k, v) for k, v in stop_inputs(key).items()],
                                         requested_output_names=[], model_version=stop_version(served_version))
        for response in stop.exec(decoupled=True):
            if response.has_error():
                pb_utils.Logger.log_warn(f"stopping a cancelled request failed: {response.error().message()}")

    def _process(self, given):
        text = self.post.texts(
            given.get("TOKENS_BATCH"),
            given.get("SEQUENCE_LENGTH"),
            given.get("STREAM_CONTEXT_IDS"),
            given.get("STREAM_FINAL"),
        )
        tokens = Postprocessor.token_ids(given.get("TOKENS_BATCH"), given.get("SEQUENCE_LENGTH"))
        outputs = [pb_utils.Tensor("OUTPUT", text), pb_utils.Tensor("OUT_TOKEN_IDS", tokens)]
        for name in _PASS_THROUGH:
            value = given.get(name)
            if value is not None:
                outputs.append(pb_utils.Tensor(f"OUT_{name}", value))
        return outputs
