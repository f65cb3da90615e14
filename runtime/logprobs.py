"""TokenLogprob: what a request learns about one of its prompt tokens (vLLM's SamplingParams.prompt_logprobs).

Plain numbers, made by the model runner from the logits and kept on the Sequence, so scheduler, engine and
outputs never see a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int  # the prompt token at this position
    logprob: float  # log P(token | the tokens before it), float32 log-softmax of the logits
    greedy_token_id: int  # the argmax at this position (its first index, as torch.argmax)
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) of the `prompt_logprobs` most likely tokens

    @property
    def is_greedy(self) -> bool:
        """Whether greedy decoding would have picked this token here (lm-eval's is_greedy)."""
        return self.token_id == self.greedy_token_id
