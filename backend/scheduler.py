"""In-flight batching: which sequences run this step and how many tokens each processes.

Every step: running sequences decode one token each; the rest of the token budget (max_num_tokens) goes to
prefill, FCFS: sequences still in prefill continue their prompt (chunked), then waiting requests are admitted
while the batch has room and their KV can be guaranteed. Finished sequences leave at once, so new requests
join without waiting for the batch to drain.
"""
from __future__ import annotations

from collections import deque

from backend.block_manager import BlockManager
from backend.config import EngineConfig
from backend.model_runner import ScheduledSeq
from backend.sequence import Sequence, SeqStatus


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.config.max_num_tokens
        batch: list[ScheduledSeq] = []
        # Decode first (one token each), then continue prefills, in arrival order.
        for seq in sorted(self.running, key=lambda s: s.in_prefill):
            n = 1 if not seq.in_prefill else self._chunk(seq, budget)
            if n == 0:
                continue
            batch.append(self._take(seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.config.max_batch_size:
            seq = self.waiting[0]
            if not self.blocks.can_reserve(seq):
                break  # FCFS: a large request at the head is not overtaken (no starvation)
            n = self._chunk(seq, budget)
            if n == 0:
                break
            self.waiting.popleft()
            self.blocks.reserve(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            batch.append(self._take(seq, n))
            budget -= n
        return batch

    def _chunk(self, seq: Sequence, budget: int) -> int:
        remaining = seq.num_tokens - seq.num_computed_tokens
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_context else 0

    def _take(self, seq: Sequence, n: int) -> ScheduledSeq:
        self.blocks.ensure_slots(seq, seq.num_computed_tokens + n)
        return ScheduledSeq(seq, n)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or cancelled sequence and free its KV blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
