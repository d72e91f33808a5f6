"""Where each tensor-parallel / pipeline-parallel rank sits, by TensorRT-LLM 1.2.x's rules (tensorrt_llm/mapping.py).

Ranks are laid out tp-fastest: rank = pp_rank * tp_size + tp_rank, so the ranks of one pipeline stage are
consecutive and form its tensor-parallel group. Both the sharder (build_engines/shard.py) and the parallel
runtime (backend/model/parallel/) use these definitions, so a rank file and the rank that loads it agree.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankPosition:
    """One rank of a tp_size x pp_size world."""

    rank: int
    tp_size: int
    pp_size: int

    def __post_init__(self) -> None:
        if self.tp_size < 1 or self.pp_size < 1:
            raise ValueError(f"tp_size and pp_size must be >= 1, got {self.tp_size}, {self.pp_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside the world of {self.world_size} ranks")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def prev_stage_rank(self) -> int:
        """The rank with the same tp_rank one stage earlier (sends this rank its input hidden states)."""
        return self.rank - self.tp_size

    @property
    def next_stage_rank(self) -> int:
        return self.rank + self.tp_size

    def stage_ranks(self, pp_rank: int | None = None) -> list[int]:
        """The tensor-parallel group of a stage (this rank's by default)."""
        stage = self.pp_rank if pp_rank is None else pp_rank
        return list(range(stage * self.tp_size, (stage + 1) * self.tp_size))

    def layers(self, num_layers: int) -> range:
        return pp_layers(num_layers, self.pp_size, self.pp_rank)


def pp_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Global layer indices of a stage: as torch.tensor_split, the first num_layers % pp_size stages get one extra."""
    if pp_size > num_layers:
        raise ValueError(f"pp_size ({pp_size}) exceeds the number of layers ({num_layers}): every stage needs one")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


def padded_vocab(vocab_size: int, tp_size: int) -> int:
    """lm_head rows after padding the vocabulary to a multiple of tp_size (TRT-LLM's pad_vocab_size)."""
    return -(-vocab_size // tp_size) * tp_size


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: split when tp divides them, one (replicated) when tp exceeds them."""
    return max(num_kv_heads // tp_size, 1)


def check_tp(num_heads: int, num_kv_heads: int, tp_size: int) -> None:
    """Raise ValueError naming the tp sizes that work when tp_size cannot split these attention heads."""
    ok = (num_heads % tp_size == 0
          and (num_kv_heads % tp_size == 0 if tp_size <= num_kv_heads else tp_size % num_kv_heads == 0))
    if not ok:
        valid = [t for t in range(1, num_heads + 1) if num_heads % t == 0
                 and (num_kv_heads % t == 0 if t <= num_kv_heads else t % num_kv_heads == 0)]
        raise ValueError(f"tp_size {tp_size} cannot split {num_heads} attention heads / {num_kv_heads} KV heads "
                         f"evenly; tp sizes that work: {valid}")
