"""Triton adapter for the tokenizer step; the logic lives in backend.serving.preprocess."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.errors import InvalidRequestError
from backend.serving.parameters import ModelParameters, PreprocessingConfig
from backend.serving.preprocess import Preprocessor


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        params = ModelParameters.from_model_config(json.loads(args["model_config"]))
        config = PreprocessingConfig.from_parameters(params)
        self.pre = Preprocessor(config.tokenizer_dir, add_special_tokens=config.add_special_tokens,
                                max_prompt_bytes=config.max_prompt_bytes)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._process(request)))
            except InvalidRequestError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses

    def _process(self, request):
        query = _input(request, "QUERY")  # (B, 1) bytes
        batch = query.shape[0]
        ids, lengths = self.pre.encode_queries(query.reshape(batch, -1)[:, 0].tolist())
        end_id = _input(request, "END_ID")
        pad_id = _input(request, "PAD_ID")
        bias = _input(request, "EMBEDDING_BIAS_WORDS")
        if bias is not None and bias.size:
            raise InvalidRequestError("embedding_bias_words is not supported by this engine")
        outputs = {
            "INPUT_ID": ids,
            "REQUEST_INPUT_LEN": lengths,
            "BAD_WORDS_IDS": self.pre.word_lists(_input(request, "BAD_WORDS_DICT"), batch, "bad_words"),
            "STOP_WORDS_IDS": self.pre.word_lists(_input(request, "STOP_WORDS_DICT"), batch, "stop_words"),
            "EMBEDDING_BIAS": np.zeros((batch, 0), dtype=np.float32),
            "REQUEST_OUTPUT_LEN": _input(request, "REQUEST_OUTPUT_LEN").astype(np.int32),
            "OUT_END_ID": end_id if end_id is not None else np.full((batch, 1), self.pre.end_id, dtype=np.int32),
            "OUT_PAD_ID": pad_id if pad_id is not None else np.full((batch, 1), self.pre.pad_id, dtype=np.int32),
        }
        return [pb_utils.Tensor(name, value) for name, value in outputs.items()]
