"""Which rope regime a sequence's K/V were computed under: what prefix reuse must match beyond the tokens, and when a
sequence's cache must be recomputed. Plain Python (the scheduler and block manager use it; no model import).

K is stored after RoPE, so a cached block is only reusable by a sequence that would have rotated its keys the same
way (backend/model/rope.py states the per-token rules):
- static kinds (default, linear, llama3, yarn): always; the tag is "".
- dynamic NTK: a token at position p is rotated with s = max(p + 1, prompt_len). A block whose tokens all have
  s <= max_positions uses the plain base: tag "". A prompt block of a longer prompt P used base'(P) for every
  token: tag "P=<P>", shared only with prompts of the same length. Any other block (generated tokens past
  max_positions: one base per token) is not shared (tag None).
- longrope: a sequence's keys are all short while its total length is <= original_max_position_embeddings, all
  long after; tags "short" / "long". A sequence that crosses the threshold is recomputed in the long set
  (recompute_needed), as HF's Phi-3 re-prefills at that step.
"""
from __future__ import annotations

from dataclasses import dataclass

STATIC, DYNAMIC, LONGROPE = "static", "dynamic", "longrope"


@dataclass(frozen=True)
class RopeRegime:
    kind: str = STATIC
    threshold: int = 0  # dynamic: max_position_embeddings; longrope: original_max_position_embeddings

    def __post_init__(self) -> None:
        if self.kind not in (STATIC, DYNAMIC, LONGROPE):
            raise ValueError(f"unknown rope regime kind {self.kind!r}")
        if self.kind != STATIC and self.threshold < 1:
            raise ValueError(f"a {self.kind} rope regime needs a threshold >= 1, got {self.threshold}")

    def sequence_tag(self, total_len: int) -> str:
        """The regime every key of a sequence of this total length is in (longrope's set; "" otherwise)."""
        if self.kind == LONGROPE:
            return "long" if total_len > self.threshold else "short"
        return ""

    def block_tag(self, prompt_len: int, total_len: int, block_end: int) -> str | None:
        """Tag of a full block ending at position block_end (exclusive) of a sequence (None: do not share it)."""
        if self.kind == LONGROPE:
            return self.sequence_tag(total_len)
        if self.kind == DYNAMIC and max(block_end, prompt_len) > self.threshold:
            return f"P={prompt_len}" if block_end <= prompt_len else None
        return ""

    def recompute_needed(self, computed_tag: str | None, total_len: int) -> bool:
        """Whether K/V computed under computed_tag must be recomputed for a sequence now total_len long."""
        return computed_tag is not None and computed_tag != self.sequence_tag(total_len)
