"""The chat template and generation config travel with every artifact: converted, quantized and sharded checkpoint
directories carry the tokenizer files, tokenizer_config.json with its chat_template, and generation_config.json
(all eos ids, default sampling), for the chat endpoint."""
from __future__ import annotations

import json

from transformers import AutoTokenizer

from build_engines.family_fixtures import CHAT_TEMPLATE
from build_engines.quantize.apply import quantize_checkpoint
from build_engines.shard import shard_checkpoint


def test_artifacts_carry_chat_template_and_generation_config(family_checkpoint, tmp_path):
    hf_dir, ckpt = family_checkpoint("llama3")
    quantized = quantize_checkpoint(ckpt, tmp_path / "int8", "int8_wo", progress=False)
    sharded = shard_checkpoint(quantized, tmp_path / "tp2", 2, 1)
    source_generation = json.loads((hf_dir / "generation_config.json").read_text())
    for artifact in (ckpt, quantized, sharded):
        assert json.loads((artifact / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
        generation = json.loads((artifact / "generation_config.json").read_text())
        assert generation == source_generation and generation["eos_token_id"] == [0]
        tok = AutoTokenizer.from_pretrained(str(artifact))
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
        assert text == "<|user|>hi<|endoftext|><|assistant|>"
