"""What the engine hands back per request: text, tokens, why it finished, and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from quantkit.runtime.logprobs import TokenLogprob
from quantkit.runtime.sequence import Sequence


@dataclass
class RequestMetrics:
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int
    ttft_ms: float | None  # arrival -> first token
    tpot_ms: float | None  # mean time per output token after the first
    tokens_per_second: float | None  # output tokens / (arrival -> last token)
    preemptions: int

    @classmethod
    def of(cls, seq: Sequence, now: float) -> RequestMetrics:
        first, last = seq.first_token_time, seq.finish_time or now
        ttft = None if first is None else (first - seq.arrival_time) * 1e3
        n = seq.num_output_tokens
        tpot = (last - first) * 1e3 / (n - 1) if first is not None and n > 1 else None
        elapsed = last - seq.arrival_time
        return cls(prompt_tokens=seq.num_prompt_tokens, output_tokens=n,
                   cached_prompt_tokens=seq.num_cached_prompt_tokens or 0, ttft_ms=ttft, tpot_ms=tpot,
                   tokens_per_second=n / elapsed if first is not None and elapsed > 0 else None,
                   preemptions=seq.num_preemptions)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str  # all output text so far (a stop string is cut off)
    token_ids: list[int]  # all output tokens so far (EOS / stop token ids included)
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort"
    stop_reason: int | str | None
    metrics: RequestMetrics
    delta_text: str = ""  # new text since this request's previous output (streaming)
    delta_token_ids: list[int] = field(default_factory=list)
    # With SamplingParams.logprobs: one entry per output token (token_ids).
    logprobs: list[TokenLogprob] | None = None
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None before prompt_logprobs_from (and
    # at position 0, which has no prefix). An aborted request's list may stop short.
    prompt_logprobs: list[TokenLogprob | None] | None = None
