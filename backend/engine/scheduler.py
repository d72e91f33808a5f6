"""In-flight batching: which sequences run this step and how many tokens each processes.

Every step: running sequences decode one token each; the rest of the token budget (max_num_tokens) goes to
prefill, FCFS: sequences still in prefill continue their prompt (chunked), then waiting requests are admitted
while the batch has room and their KV fits. Finished sequences leave at once, so new requests join without
waiting for the batch to drain.

KV policies (the anchor's batch_scheduler_policy):
- guaranteed_no_evict: admit only when the blocks for prompt + max_tokens can be reserved; nothing is preempted.
- max_utilization: admit when the next chunk fits; when a running sequence needs a block and none is free, the
  most recently admitted sequence is preempted (its blocks freed, its tokens recomputed later, none lost).

Priorities (tenant tiers): waiting requests are admitted by priority level, FCFS within a level. With
priority_aging_s set, a waiting request gains one level per priority_aging_s seconds it has waited, so a lower
tier is served late under a higher tier's overload, never starved (measured: the strict order left batch-tier
streams without a first token for 300 s in a 10-minute soak, perf/SOAK.md). Preempted sequences go first.

A running sequence whose rope regime changed since its K/V were computed (longrope crossing its original length,
rope_regime.py) drops them and is prefilled again, as a whole, in the new regime (its cached prefix reused).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig, SchedulerPolicy
from backend.engine.scheduler_output import ScheduledSeq, SchedulerOutput
from backend.engine.sequence import SeqStatus, Sequence


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.config = config
        self.blocks = blocks
        self.clock_ns = clock_ns  # the clock of Request.arrival_time_ns
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preempted = 0

    @property
    def guaranteed(self) -> bool:
        return self.config.policy is SchedulerPolicy.GUARANTEED_NO_EVICT

    def add(self, seq: Sequence) -> None:
        """Queue by priority (higher first), FCFS within a priority level."""
        priority = seq.request.priority
        position = next((i for i, w in enumerate(self.waiting) if w.request.priority < priority), len(self.waiting))
        self.waiting.insert(position, seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_tokens
        batch: list[ScheduledSeq] = []
        preempted_before = self.num_preempted
        # Decode first (one token each), then continue prefills, in admission order.
        for seq in sorted(self.running, key=lambda s: s.in_prefill):
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted earlier in this loop
            if self.blocks.regime.recompute_needed(seq.kv_regime, seq.num_tokens) and not self._restart(seq):
                continue  # waits again: its new regime's blocks could not be promised now
            n = 1 if not seq.in_prefill else self._chunk(seq, budget)
            if n == 0 or not self._make_room(seq, n):
                continue
            batch.append(self._take(seq, n))
            budget -= n
        preempted = self.num_preempted != preempted_before
        self._age_waiting()
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_batch_size:
            n = self._admit(self.waiting[0], budget)
            if n == 0:
                break  # FCFS: a request at the head that does not fit is not overtaken (no starvation)
            seq = self.waiting.popleft()
            self.blocks.note_admitted(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            batch.append(self._take(seq, n))
            budget -= n
        # A sequence preempted after it was scheduled this step sits out the step (KV pressure: no admissions).
        return SchedulerOutput([item for item in batch if item.seq.status is SeqStatus.RUNNING])

    def _age_waiting(self) -> None:
        """Reorder the queue by aged priority (level + whole priority_aging_s periods waited), then arrival;
        preempted sequences (already started once) stay first. Stable: strict order is kept without aging."""
        aging_s = self.config.priority_aging_s
        if aging_s is None or len(self.waiting) < 2:
            return
        now, period_ns = self.clock_ns(), aging_s * 1e9

        def key(seq: Sequence) -> tuple[bool, float, int]:
            waited = max(0, now - seq.request.arrival_time_ns)
            return (not seq.num_preemptions, -(seq.request.priority + waited // period_ns),
                    seq.request.arrival_time_ns)

        self.waiting = deque(sorted(self.waiting, key=key))

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Tokens of seq to process now if it can be admitted (its cached prefix taken), else 0."""
        self.blocks.match_prefix(seq)
        n = self._chunk(seq, budget)
        fits = self.blocks.can_reserve(seq) if self.guaranteed else self.blocks.can_grow(seq, seq.num_computed_tokens + n)
        if n == 0 or not fits:
            self._release(seq)
            return 0
        if self.guaranteed:
            self.blocks.reserve(seq)
        return n

    def _chunk(self, seq: Sequence, budget: int) -> int:
        remaining = seq.num_tokens - seq.num_computed_tokens
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_context else 0

    def _make_room(self, seq: Sequence, n: int) -> bool:
        """max_utilization: preempt the newest sequences until seq's next n tokens have slots (seq itself, if it is
        the newest: older requests keep going first)."""
        while not self.blocks.can_grow(seq, seq.num_computed_tokens + n):
            newest = self.running[-1]
            self._preempt(newest)
            if newest is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's KV; it waits at the head and recomputes its tokens (generated ones kept)."""
        self.running.remove(seq)
        self._release(seq)
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        seq.num_preemptions += 1
        self.num_preempted += 1

    def _release(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.kv_regime = None

    def _restart(self, seq: Sequence) -> bool:
        """Drop a running sequence's K/V and prefill it again from its cached prefix, keeping its place. Under
        guaranteed_no_evict it needs its promise again (the blocks it freed cover it unless another sequence shares
        them); if that cannot be given it is preempted instead (False)."""
        self._release(seq)
        self.blocks.match_prefix(seq)
        if self.guaranteed and not self.blocks.can_reserve(seq):
            self._preempt(seq)
            return False
        if self.guaranteed:
            self.blocks.reserve(seq)
        return True

    def _take(self, seq: Sequence, n: int) -> ScheduledSeq:
        self.blocks.ensure_slots(seq, seq.num_computed_tokens + n)
        seq.kv_regime = self.blocks.regime.sequence_tag(seq.num_tokens)
        return ScheduledSeq.of(seq, n)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or cancelled sequence and free its KV blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
