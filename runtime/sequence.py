"""Sequence: one request's token ids, block table, progress counters, status and timings.

The scheduler and block manager read and move these integers; only the model runner makes tensors.
"""

from __future__ import annotations

import time
from enum import Enum, auto

from quantkit.runtime.logprobs import TokenLogprob
from quantkit.runtime.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(self, request_id: str, token_ids: list[int], params: SamplingParams, prompt: str | None = None):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of the full blocks, in order (survive preemption)
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None  # "stop", "length" or "abort"
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.num_cached_prompt_tokens: int | None = None  # prefix-cache hit on first admission
        self.num_preemptions = 0
        self.output_text = ""
        self.num_streamed_chars = 0
        # Incremental detokenization (runtime/detokenizer.py): text of output tokens [0, read_offset) is
        # final; tokens from prefix_offset on are decoded again each step.
        self.stable_text = ""
        self.prefix_offset = 0
        self.read_offset = 0
        self.generator = None  # torch.Generator of a seeded request, made by the model runner
        self.output_logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
        # Prompt log-probabilities (params.prompt_logprobs): positions prompt_logprobs_from, ... in order, filled
        # in by the forward passes that compute the position before each.
        self.prompt_logprobs: list[TokenLogprob] | None = None if params.prompt_logprobs is None else []
        self.prompt_logprobs_from = min(max(params.prompt_logprobs_from, 1), self.num_prompt_tokens)
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def next_scored_position(self) -> int | None:
        """The prompt position whose log-probability comes next; None when none is asked for or left."""
        if self.prompt_logprobs is None:
            return None
        position = self.prompt_logprobs_from + len(self.prompt_logprobs)
        return position if position < self.num_prompt_tokens else None

    @property
    def num_cacheable_tokens(self) -> int:
        """Leading tokens whose K/V may come from the prefix cache instead of a forward. Never the last token:
        its logits pick the next one. While prompt log-probabilities are pending, not the position before the
        next scored token either: a cache hit skips that position's forward, so its logits would never exist.
        Capping the hit there (rather than turning prefix caching off for these requests) keeps the reuse that
        matters for scoring: a multiple-choice question's answers share the question, computed once."""
        limit = self.num_tokens - 1
        pending = self.next_scored_position
        return limit if pending is None else min(limit, pending - 1)

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size:(index + 1) * block_size]

    def append_token(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        self.token_ids.append(token_id)
        if self.output_logprobs is not None:
            self.output_logprobs.append(logprob)
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
