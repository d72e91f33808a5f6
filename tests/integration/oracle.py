"""HF transformers greedy generation: what our server must reproduce token for token."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _cached(model, prompt_ids: tuple[int, ...], max_new_tokens: int, eos_id: int) -> tuple[int, ...]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id)
    tokens = out[0, len(prompt_ids):].tolist()
    # As TensorRT-LLM (and our engine): generation stops at end_id, which is not part of the output.
    return tuple(tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens)


def hf_greedy(hf, prompt: str, max_new_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids) under HF greedy decoding."""
    model, tok = hf
    prompt_ids = tuple(tok.encode(prompt, add_special_tokens=False))
    return list(prompt_ids), list(_cached(model, prompt_ids, max_new_tokens, tok.eos_token_id))


def hf_text(hf, prompt: str, max_new_tokens: int) -> str:
    _, out = hf_greedy(hf, prompt, max_new_tokens)
    return hf[1].decode(out, skip_special_tokens=True)
