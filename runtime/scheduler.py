"""One token budget per step, no prefill or decode phase (vLLM v1's rule).

Each sequence has num_computed_tokens catching up with num_tokens. Running sequences get
min(remaining, budget) tokens first, then waiting ones, which may start from a prefix-cache hit and
may be chunked. When blocks run out the most recently admitted running sequence is preempted by
recompute: its blocks are freed and it returns to the head of the queue. Integers only.
"""

from __future__ import annotations

from collections import deque

from quantkit.runtime.block_manager import BlockManager
from quantkit.runtime.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to compute this step) pairs, in batch order."""
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate(seq, seq.num_computed_tokens + n):
                preempted = True
                victim = self.running.pop()
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n
                i += 1
                continue
            break
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.block_manager.match_prefix(seq)
            computed = len(hits) * self.block_manager.block_size
            n = min(seq.num_tokens - computed, budget)
            if not self.block_manager.allocate(seq, computed + n, hits):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = computed
            self.block_manager.prefix_queries += seq.num_tokens
            self.block_manager.prefix_hits += computed
            if seq.num_cached_prompt_tokens is None:
                seq.num_cached_prompt_tokens = computed
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free_blocks(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """After the forward: the scheduled tokens' K/V are in the cache."""
        for seq, n in scheduled:
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free_blocks(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
