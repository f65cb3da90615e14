"""Perplexity over whole token sequences, one sequence at a time (no padding to mask)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def negative_log_likelihood(model, token_ids: list[list[int]]) -> tuple[float, int]:
    """Sum of next-token NLL over every predicted position, and the count of positions."""
    total, count = 0.0, 0
    for ids in token_ids:
        if len(ids) < 2:
            continue
        inputs = torch.tensor([ids])
        logits = model(inputs).logits[0, :-1].float()
        total += float(F.cross_entropy(logits, inputs[0, 1:], reduction="sum"))
        count += len(ids) - 1
    return total, count


def perplexity(model, token_ids: list[list[int]]) -> float:
    total, count = negative_log_likelihood(model, token_ids)
    return math.exp(total / count)
