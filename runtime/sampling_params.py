"""SamplingParams: how one request picks its tokens and when it stops."""

from __future__ import annotations

from dataclasses import dataclass, field

from quantkit.errors import QuantkitError


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    seed: int | None = None  # per-request generator; None: the engine's shared generator
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)  # stop strings, cut from the returned text
    stop_token_ids: list[int] = field(default_factory=list)  # kept in token_ids, like EOS
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # Log-probabilities of the sampled tokens under the model's distribution (before temperature and filters):
    # None: none; k >= 0: each output token plus its k most likely alternatives (RequestOutput.logprobs).
    logprobs: int | None = None
    # Log-probabilities of the prompt's own tokens, each given the tokens before it (vLLM's prompt_logprobs):
    # None: none; k >= 0: every position's token plus its k most likely alternatives (RequestOutput.prompt_logprobs).
    prompt_logprobs: int | None = None
    # The first prompt position scored: only positions from here on pay the lm_head and log-softmax over the
    # vocabulary (a loglikelihood request asks for its continuation only). Position 0 has no prefix: never scored.
    prompt_logprobs_from: int = 1

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        self.stop_token_ids = list(self.stop_token_ids)
        if self.temperature < 0:
            raise QuantkitError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise QuantkitError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise QuantkitError(f"top_k must be -1 (off), 0 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise QuantkitError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise QuantkitError(f"logprobs must be None or >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise QuantkitError(f"prompt_logprobs must be None or >= 0, got {self.prompt_logprobs}")
        if self.prompt_logprobs_from < 0:
            raise QuantkitError(f"prompt_logprobs_from must be >= 0, got {self.prompt_logprobs_from}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
