"""Sequence: one request's token ids, block table, progress counters, status and timings.

The scheduler and block manager read and move these integers; only the model runner makes tensors.
"""

from __future__ import annotations

import time
from enum import Enum, auto

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

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size:(index + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
