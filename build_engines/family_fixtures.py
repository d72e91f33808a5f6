"""Tiny random-init HF checkpoints with the structure of each supported family (its real config fields, small dims),
with the demo tokenizer, a chat template and a generation_config.json beside them: what the family tests convert,
serve and compare with HF transformers.

Dims are shrunk consistently so each feature is exercised at test lengths: sliding windows of 16 (31 for Phi-3
mini-4k) below the prompts, llama3 bands and yarn ramps that fall inside the head dimension, dynamic NTK's
max_position_embeddings (48) and longrope's original length (32) below what the tests generate. Weights are drawn
from N(0, 0.1) (HF's 0.02 gives near-uniform logits, so greedy ties), norm weights around 1 (Gemma's, stored
zero-centred, around 0), so every norm weight matters.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from build_engines.cache import atomic_dir
from build_engines.tokenizer import copy_tokenizer, endoftext_id

INIT_STD = 0.1
_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False)
_LONG_SHORT = [1.0, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 2.5]
_LONG_LONG = [1.0, 1.3, 1.9, 3.0, 4.7, 7.5, 12.0, 16.0]

# name -> (model_type, config fields over _BASE). Real sizes they stand for: comments.
FIXTURES: dict[str, tuple[str, dict]] = {
    "llama2": ("llama", dict(num_key_value_heads=4, rope_theta=1e4, max_position_embeddings=256)),  # MHA, Llama 2
    "llama2_linear": ("llama", dict(rope_theta=1e4, rope_scaling={"type": "linear", "factor": 2.0})),  # vicuna-16k
    "llama_dynamic": ("llama", dict(max_position_embeddings=48,
                                    rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "llama3": ("llama", dict(head_dim=16, rope_theta=5e5, tie_word_embeddings=True,  # Llama 3.2 1B/3B style
                             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral": ("mistral", dict(head_dim=16, sliding_window=16)),  # v0.1: sliding 4096
    "qwen2": ("qwen2", dict(rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=512,
                            max_window_layers=4, tie_word_embeddings=True)),  # Qwen2.5 <= 3B
    "qwen2_swa": ("qwen2", dict(rope_theta=1e6, use_sliding_window=True, sliding_window=16, max_window_layers=2)),
    "qwen2_yarn": ("qwen2", dict(rope_theta=1e4, max_position_embeddings=128,  # Qwen2.5 > 32k
                                 rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen3": ("qwen3", dict(head_dim=32, rope_theta=1e6, attention_bias=False, use_sliding_window=False,
                            tie_word_embeddings=True)),  # 0.6B: head_dim 128 != hidden / heads
    "gemma2": ("gemma2", dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=16, attn_logit_softcapping=50.0,
                              final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                              hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True, rms_norm_eps=1e-6)),
    "gemma2_capped": ("gemma2", dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=16,
                                     attn_logit_softcapping=1.0, final_logit_softcapping=1.0,
                                     hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
    "phi3_4k": ("phi3", dict(num_key_value_heads=4, max_position_embeddings=64, original_max_position_embeddings=64,
                             sliding_window=31, rope_scaling=None)),  # mini-4k: sliding 2047
    "phi3_128k": ("phi3", dict(num_key_value_heads=4, original_max_position_embeddings=32, sliding_window=2048,
                               rope_scaling={"type": "longrope", "short_factor": _LONG_SHORT,
                                             "long_factor": _LONG_LONG})),  # mini-128k / 3.5-mini
    "phi3_partial": ("phi3", dict(num_key_value_heads=4, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                  original_max_position_embeddings=32,
                                  rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6],
                                                "long_factor": [1.0, 2.0, 4.0, 8.0]})),  # Phi-4-mini style
}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def fixture_config(name: str, tokenizer_dir: Path, **overrides):
    """The HF config object of fixture `name`, sized for the tokenizer (its end-of-text is bos, eos and pad)."""
    model_type, fields = FIXTURES[name]
    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    eot = endoftext_id(tokenizer_dir)
    kwargs = {**_BASE, **fields, "vocab_size": vocab, "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
              **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


@torch.no_grad()
def random_model(config, seed: int = 0, std: float = INIT_STD):
    """A float32 HF model of `config` with every parameter drawn from N(0, std) (norms around 1, or 0 when stored
    zero-centred as Gemma's), from `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
        for name, param in model.named_parameters():
            param.normal_(0.0, std)
            if name.endswith("norm.weight") and config.model_type != "gemma2":
                param.add_(1.0)
    return model.eval()


def make_fixture(name: str, out_dir: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """Write fixture `name` as a HF checkpoint dir (save_pretrained, tokenizer, chat template, generation config)."""
    config = fixture_config(name, tokenizer_dir, **overrides)
    model = random_model(config, seed)
    with atomic_dir(Path(out_dir)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        copy_tokenizer(tokenizer_dir, tmp)
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        eot = config.eos_token_id
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": eot, "eos_token_id": [eot], "do_sample": True, "temperature": 0.6, "top_p": 0.9},
            indent=2) + "\n")
    return Path(out_dir)
