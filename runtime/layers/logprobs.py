"""Log-probabilities of given tokens under rows of logits (prompt log-probabilities)."""

from __future__ import annotations

import torch

from quantkit.runtime.layers.sampler import greedy


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                   num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [R, V] float32, targets [R] -> (log P(target) [R], argmax [R], ids and log P of the num_top most
    likely tokens [R, num_top]). A float32 log-softmax, then a gather: lm-eval's HFLM's arithmetic, so scores
    agree to rounding."""
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, targets[:, None]).squeeze(1)
    num_top = min(num_top, logits.shape[-1])
    if num_top:
        top_logprobs, top_ids = logprobs.topk(num_top, dim=-1)
    else:
        top_logprobs, top_ids = logprobs.new_empty(len(logits), 0), targets.new_empty(len(logits), 0)
    return chosen, greedy(logits), top_ids, top_logprobs
