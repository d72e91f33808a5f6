"""Triton adapter for the tokenizer step; the logic lives in backend.serving.preprocess."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils
import tritonllm_env  # noqa: F401 -- rendered beside this model: puts tritonllm's packages on sys.path

from backend.errors import InvalidRequestError
from backend.serving.parameters import read_model_config
from backend.serving.pb_release import release_at_finalize
from backend.serving.preprocess import Preprocessor

# Optional inputs this engine does not implement (refused, naming the ensemble input, rather than ignored).
_REFUSED_IF_SET = (("EMBEDDING_BIAS_WORDS", "embedding_bias_words"), ("EMBEDDING_BIAS_WEIGHTS", "embedding_bias_weights"),
                   ("PROMPT_TABLE_EXTRA_ID", "prompt_table_extra_id"))


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = read_model_config(json.loads(args["model_config"]), args["model_name"], "preprocessing")
        self.pre = Preprocessor(config.tokenizer_dir, add_special_tokens=config.add_special_tokens,
                                max_prompt_bytes=config.max_prompt_bytes)

    def finalize(self):
        release_at_finalize(self)  # and the process's exit skips collecting torch's and transformers' objects

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._process(request)))
            except InvalidRequestError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses

    @staticmethod
    def _output_len(request, batch):
        value = _input(request, "REQUEST_OUTPUT_LEN")
        if value is None or value.size != batch:
            raise InvalidRequestError("max_tokens (REQUEST_OUTPUT_LEN) is required: one value per batch row")
        return value.reshape(batch, 1).astype(np.int32)

    def _process(self, request):
        query = _input(request, "QUERY")  # (B, 1) bytes
        batch = query.shape[0]
        ids, lengths = self.pre.encode_queries(query.reshape(batch, -1)[:, 0].tolist())
        end_id = _input(request, "END_ID")
        pad_id = _input(request, "PAD_ID")
        for name, client_name in _REFUSED_IF_SET:
            value = _input(request, name)
            if value is not None and value.size:
                raise InvalidRequestError(f"{client_name} ({name}) is not supported by this engine")
        decoder_ids, decoder_lengths = self.pre.no_decoder_input(_input(request, "DECODER_QUERY"), batch)
        outputs = {
            "INPUT_ID": ids,
            "REQUEST_INPUT_LEN": lengths,
            "DECODER_INPUT_ID": decoder_ids,
            "REQUEST_DECODER_INPUT_LEN": decoder_lengths,
            "BAD_WORDS_IDS": self.pre.word_lists(_input(request, "BAD_WORDS_DICT"), batch, "bad_words"),
            "STOP_WORDS_IDS": self.pre.word_lists(_input(request, "STOP_WORDS_DICT"), batch, "stop_words"),
            "EMBEDDING_BIAS": np.zeros((batch, 0), dtype=np.float32),
            "REQUEST_OUTPUT_LEN": self._output_len(request, batch),
            "OUT_END_ID": end_id if end_id is not None else np.full((batch, 1), self.pre.end_id, dtype=np.int32),
            "OUT_PAD_ID": pad_id if pad_id is not None else np.full((batch, 1), self.pre.pad_id, dtype=np.int32),
            "ERRORS_IN_STREAM": np.ones((batch, 1), dtype=bool),  # tensorrt_llm's errors go through postprocessing
        }
        return [pb_utils.Tensor(name, value) for name, value in outputs.items()]
