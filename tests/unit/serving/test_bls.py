"""tensorrt_llm_bls's logic: client inputs -> tensorrt_llm's exactly as the ensemble maps them, and each
tensorrt_llm response -> the client's outputs; its config has the ensemble's inputs and outputs."""
from __future__ import annotations

import re

import numpy as np
import pytest

from backend.errors import InvalidRequestError
from backend.serving.bls import INTERNAL_OUTPUTS, LLM_INPUTS, client_outputs, llm_inputs
from backend.serving.postprocess import Postprocessor
from backend.serving.preprocess import Preprocessor
from ensembles.render import TEMPLATES


@pytest.fixture(scope="module")
def pre(tokenizer_dir) -> Preprocessor:
    return Preprocessor(tokenizer_dir)


def _names(config: str, section: str) -> set[str]:
    block = re.search(rf"^{section} \[\n(.*?)^\]", config, re.MULTILINE | re.DOTALL).group(1)
    return set(re.findall(r'name: "(\w+)"', block))


def test_bls_config_has_the_ensembles_inputs_and_outputs():
    ensemble = (TEMPLATES / "ensemble" / "config.pbtxt").read_text()
    bls = (TEMPLATES / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert _names(bls, "input") == _names(ensemble, "input") | {"num_draft_tokens", "use_draft_logits"}
    assert _names(bls, "output") == _names(ensemble, "output")


def test_the_renaming_is_the_ensembles():
    ensemble = (TEMPLATES / "ensemble" / "config.pbtxt").read_text()
    step = ensemble[ensemble.index('model_name: "tensorrt_llm"'): ensemble.index('model_name: "postprocessing"')]
    mapped = {client: llm for llm, client in re.findall(r'input_map \{ key: "(\w+)" value: "(\w+)" \}', step)
              if not client.startswith("_")}
    assert LLM_INPUTS == mapped


def test_inputs_are_tokenized_and_renamed(pre):
    arrays = {"text_input": np.array([[b"def f"]], dtype=object), "max_tokens": np.array([[7]], dtype=np.int32),
              "top_k": np.array([[3]], dtype=np.int32), "stream": np.array([[True]]),
              "stop_words": np.array([[b"\n"]], dtype=object)}
    out = llm_inputs(pre, arrays)
    assert out["input_ids"].tolist() == [pre.encode_query("def f")]
    assert out["request_output_len"].tolist() == [[7]] and out["runtime_top_k"].tolist() == [[3]]
    assert out["streaming"].tolist() == [[True]] and out["end_id"].tolist() == [[pre.end_id]]
    assert out["stop_words_list"].shape[:2] == (1, 2)


@pytest.mark.parametrize("extra, message", [
    ({"num_draft_tokens": np.array([[2]], dtype=np.int32)}, "num_draft_tokens"),
    ({"use_draft_logits": np.array([True])}, "use_draft_logits"),
    ({"embedding_bias_words": np.array([[b"x"]], dtype=object)}, "embedding_bias_words"),
    ({"prompt_table_extra_id": np.array([[1]], dtype=np.uint64)}, "prompt_table_extra_id"),
    ({"decoder_text_input": np.array([[b"x"]], dtype=object)}, "decoder-only"),
    ({"max_tokens": None}, "max_tokens is required"),
])
def test_refusals_name_the_input(pre, extra, message):
    arrays = {"text_input": np.array([[b"def f"]], dtype=object), "max_tokens": np.array([[7]], dtype=np.int32),
              **extra}
    with pytest.raises(InvalidRequestError, match=message):
        llm_inputs(pre, {k: v for k, v in arrays.items() if v is not None})


def test_outputs_keep_what_the_client_sees(tokenizer_dir, pre):
    ids = pre.encode_query("import os")
    llm = {"output_ids": np.array([[ids]], dtype=np.int32), "sequence_length": np.array([[len(ids)]], dtype=np.int32),
           "stream_context_ids": np.zeros((1, 1, 0), dtype=np.int32), "stream_final": np.array([[True]]),
           "request_key": np.array([[1]], dtype=np.uint64), "num_output_tokens": np.array([[2]], dtype=np.int32)}
    out = client_outputs(Postprocessor(tokenizer_dir), llm)
    assert out["text_output"].tolist() == [b"import os"]
    assert set(out) == {"text_output", "output_token_ids", "num_output_tokens"} and not set(out) & set(INTERNAL_OUTPUTS)
    assert out["output_token_ids"].tolist() == [ids]
