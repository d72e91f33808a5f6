"""Triton adapter for the detokenizer step; the logic lives in backend.postprocess."""
import json

import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path
import triton_python_backend_utils as pb_utils

from backend.postprocess import Postprocessor

# Optional inputs passed through unchanged as OUT_<name>, so that every ensemble output of one streamed step
# arrives in one response.
_PASS_THROUGH = (
    "CUM_LOG_PROBS", "OUTPUT_LOG_PROBS", "CONTEXT_LOGITS", "GENERATION_LOGITS", "BATCH_INDEX", "SEQUENCE_INDEX",
    "NUM_INPUT_TOKENS", "NUM_OUTPUT_TOKENS", "KV_CACHE_ALLOC_NEW_BLOCKS", "KV_CACHE_REUSED_BLOCKS",
    "KV_CACHE_ALLOC_TOTAL_BLOCKS", "ARRIVAL_TIME_NS", "FIRST_SCHEDULED_TIME_NS", "FIRST_TOKEN_TIME_NS",
    "LAST_TOKEN_TIME_NS",
)


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.post = Postprocessor(config["parameters"]["tokenizer_dir"]["string_value"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=self._process(r)) for r in requests]

    def _process(self, request):
        text = self.post.texts(
            _input(request, "TOKENS_BATCH"),
            _input(request, "SEQUENCE_LENGTH"),
            _input(request, "STREAM_CONTEXT_IDS"),
            _input(request, "STREAM_FINAL"),
        )
        outputs = [pb_utils.Tensor("OUTPUT", text)]
        for name in _PASS_THROUGH:
            value = _input(request, name)
            if value is not None:
                outputs.append(pb_utils.Tensor(f"OUT_{name}", value))
        return outputs
