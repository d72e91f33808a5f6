"""The postprocessing step: output token ids -> text, streaming-correct (see backend.serving.detokenizer)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from backend.serving.detokenizer import decode_delta
from backend.serving.preprocess import load_tokenizer


class Postprocessor:
    def __init__(self, tokenizer_dir: str | Path) -> None:
        self.tokenizer = load_tokenizer(tokenizer_dir)

    def texts(
        self,
        tokens: np.ndarray,  # (B, beams, T) output ids of this response
        lengths: np.ndarray,  # (B, beams) valid tokens in each row
        context: np.ndarray | None,  # (B, beams, W) ids already sent before these (streaming), or None
        final: np.ndarray | None,  # (B, 1) whether this is the request's last response; None: it is
    ) -> np.ndarray:
        """(B, beams) UTF-8 bytes: the text these tokens add."""
        B, beams = tokens.shape[:2]
        out = np.empty((B, beams), dtype=object)
        for b in range(B):
            is_final = True if final is None else bool(final[b].reshape(-1)[0])
            for k in range(beams):
                new = tokens[b, k, : int(lengths[b, k])].tolist()
                ctx = context[b, k].tolist() if context is not None and context.size else []
                out[b, k] = decode_delta(self.tokenizer, ctx, new, is_final).encode("utf-8")
        return out
