"""The postprocessing step: output token ids -> text, streaming-correct (see backend.serving.detokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from backend.errors import InvalidRequestError
from backend.serving.detokenizer import decode_delta
from backend.serving.preprocess import load_tokenizer


def model_vocab_size(tokenizer_dir: str | Path) -> int | None:
    """vocab_size of the HF config beside the tokenizer (the rows of the model's embedding and LM head), or None.
    Checkpoints often pad it past the tokenizer's ids (Qwen2: 151,936 rows for 151,665 ids; Phi-3: 32,064 for
    32,011), and the model may generate any of its rows."""
    try:
        value = json.loads((Path(tokenizer_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


class Postprocessor:
    def __init__(self, tokenizer_dir: str | Path, skip_special_tokens: bool = True) -> None:
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.skip_special_tokens = skip_special_tokens  # the anchor's postprocessing parameter (default true)
        # ids this step takes: the model's rows where its config says (those past the tokenizer's ids decode to no
        # text, as HF's decode and the anchor's postprocessing make of them; refused, one such generated id failed
        # its stream mid-way), else the tokenizer's
        self.vocab_size = max(len(self.tokenizer), model_vocab_size(tokenizer_dir) or 0)

    def texts(
        self,
        tokens: np.ndarray,  # (B, beams, T) output ids of this response
        lengths: np.ndarray,  # (B, beams) valid tokens in each row
        context: np.ndarray | None,  # (B, beams, W) ids already sent before these (streaming), or None
        final: np.ndarray | None,  # (B, 1) whether this is the request's last response; None: it is
    ) -> np.ndarray:
        """(B * beams,) UTF-8 bytes: the text these tokens add, one entry per (batch row, beam), flat as the
        anchor's OUTPUT (one sequence gives shape [1]; clients read text_output[0])."""
        self._check(tokens, lengths, context)
        B, beams = tokens.shape[:2]
        out = np.empty(B * beams, dtype=object)
        for b in range(B):
            is_final = True if final is None else bool(final[b].reshape(-1)[0])
            for k in range(beams):
                new = tokens[b, k, : int(lengths[b, k])].tolist()
                ctx = context[b, k].tolist() if context is not None and context.size else []
                text = decode_delta(self.tokenizer, ctx, new, is_final, self.skip_special_tokens)
                out[b * beams + k] = text.encode("utf-8")
        return out

    def _check(self, tokens: np.ndarray, lengths: np.ndarray, context: np.ndarray | None) -> None:
        """Refuse what cannot be decoded, naming the input (INVALID_ARG), before the tokenizer sees it."""
        if tokens.ndim != 3:
            raise InvalidRequestError(f"TOKENS_BATCH must have shape [batch, beams, tokens], got {list(tokens.shape)}")
        if lengths.shape != tokens.shape[:2]:
            raise InvalidRequestError(f"SEQUENCE_LENGTH must have shape {list(tokens.shape[:2])} (one length per "
                                      f"TOKENS_BATCH row), got {list(lengths.shape)}")
        if lengths.size and (lengths.min() < 0 or lengths.max() > tokens.shape[2]):
            raise InvalidRequestError(f"SEQUENCE_LENGTH values must be in [0, {tokens.shape[2]}] (the TOKENS_BATCH "
                                      f"width), got {lengths.reshape(-1).tolist()[:8]}")
        valid = np.arange(tokens.shape[2]) < lengths[..., None]  # (B, beams, T): the ids that are decoded
        self._check_ids("TOKENS_BATCH", tokens[valid])
        if context is not None and context.size:
            self._check_ids("STREAM_CONTEXT_IDS", context.reshape(-1))

    def _check_ids(self, name: str, ids: np.ndarray) -> None:
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise InvalidRequestError(f"{name} holds token ids outside the model's vocabulary "
                                      f"[0, {self.vocab_size}): {bad[:5].tolist()}")

    @staticmethod
    def token_ids(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(B, T) int32: beam 0's ids of each row (what `texts` decodes), padded with -1 past its length."""
        B, width = tokens.shape[0], tokens.shape[-1]
        out = np.full((B, width), -1, dtype=np.int32)
        for b in range(B):
            n = int(lengths[b].reshape(-1)[0])
            out[b, :n] = tokens[b, 0, :n]
        return out
