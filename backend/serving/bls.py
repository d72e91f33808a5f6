"""tensorrt_llm_bls's logic (no Triton import): the ensemble's three steps in one model.

A request's inputs become tensorrt_llm's exactly as the ensemble maps them (tokenized in-process by the same
Preprocessor), and each tensorrt_llm response becomes one client response: text_output decoded in its stream
context by the same Postprocessor (so streamed text concatenates to the non-streamed text), plus every other
client-facing output as tensorrt_llm returned it. model_repository/tensorrt_llm_bls/1/model.py moves these arrays
in and out of pb_utils and calls tensorrt_llm.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from backend.errors import InvalidRequestError
from backend.serving.postprocess import Postprocessor
from backend.serving.preprocess import Preprocessor

# Client input -> tensorrt_llm input, for what passes through unchanged (the ensemble's tensorrt_llm step).
LLM_INPUTS = {
    "exclude_input_in_output": "exclude_input_in_output", "top_k": "runtime_top_k", "top_p": "runtime_top_p",
    "temperature": "temperature", "length_penalty": "len_penalty", "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens", "min_length": "min_length", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "seed": "seed", "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits", "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics", "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens", "beam_width": "beam_width",
    "num_return_sequences": "num_return_sequences", "stream": "streaming", "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights", "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type", "guided_decoding_guide": "guided_decoding_guide",
    "prompt_embedding_table": "prompt_embedding_table", "prompt_vocab_size": "prompt_vocab_size",
    "num_top_log_probs": "num_top_log_probs",
}
# tensorrt_llm outputs only our models read: token ids and the streaming detokenizer's context, the request key.
INTERNAL_OUTPUTS = ("output_ids", "sequence_length", "stream_context_ids", "stream_final", "request_key")
# Client outputs made here from those, not asked of tensorrt_llm.
DERIVED_OUTPUTS = ("text_output", "output_token_ids")
# Inputs this engine does not implement: refused, naming them, when set.
_REFUSED_IF_SET = ("embedding_bias_words", "embedding_bias_weights", "prompt_table_extra_id")


def _set(arrays: Mapping[str, np.ndarray], name: str) -> bool:
    value = arrays.get(name)
    return value is not None and value.size > 0 and bool(np.any(value))


def llm_inputs(pre: Preprocessor, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The client's inputs ([B, ...] each) -> tensorrt_llm's; raises InvalidRequestError naming the input."""
    if _set(arrays, "num_draft_tokens") or _set(arrays, "use_draft_logits"):
        raise InvalidRequestError("num_draft_tokens / use_draft_logits (draft-target speculative decoding) are not "
                                  "supported by this engine: there is no draft model")
    for name in _REFUSED_IF_SET:
        if arrays.get(name) is not None and arrays[name].size:
            raise InvalidRequestError(f"{name} is not supported by this engine")
    query, max_tokens = arrays.get("text_input"), arrays.get("max_tokens")
    if query is None or query.size == 0:
        raise InvalidRequestError("text_input is required")
    batch = query.shape[0]
    if max_tokens is None or max_tokens.size != batch:
        raise InvalidRequestError("max_tokens is required: one value per batch row")
    pre.no_decoder_input(arrays.get("decoder_text_input"), batch)
    ids, lengths = pre.encode_queries(query.reshape(batch, -1)[:, 0].tolist())
    out = {
        "input_ids": ids,
        "input_lengths": lengths,
        "request_output_len": max_tokens.reshape(batch, 1).astype(np.int32),
        "bad_words_list": pre.word_lists(arrays.get("bad_words"), batch, "bad_words"),
        "stop_words_list": pre.word_lists(arrays.get("stop_words"), batch, "stop_words"),
        "end_id": _or_default(arrays.get("end_id"), batch, pre.end_id),
        "pad_id": _or_default(arrays.get("pad_id"), batch, pre.pad_id),
    }
    for name, llm_name in LLM_INPUTS.items():
        if arrays.get(name) is not None:
            out[llm_name] = arrays[name]
    return out


def _or_default(value: np.ndarray | None, batch: int, default: int) -> np.ndarray:
    return value.reshape(batch, 1).astype(np.int32) if value is not None else np.full((batch, 1), default, np.int32)


def client_outputs(post: Postprocessor, llm: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One tensorrt_llm response -> one client response (text_output 1-D, one entry per returned sequence)."""
    text = post.texts(llm["output_ids"], llm["sequence_length"], llm.get("stream_context_ids"), llm.get("stream_final"))
    out = {"text_output": text, "output_token_ids": post.token_ids(llm["output_ids"], llm["sequence_length"])}
    out.update({name: value for name, value in llm.items() if name not in INTERNAL_OUTPUTS})
    return out
