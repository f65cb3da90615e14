"""Perplexity over whole token sequences, one sequence at a time (no padding to mask)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def sequence_nll(model, token_ids: list[list[int]]) -> tuple[list[float], list[int]]:
    """Each sequence's summed next-token NLL and its count of predicted positions (sequences shorter
    than 2 tokens predict nothing and are left out)."""
    nll, counts = [], []
    for ids in token_ids:
        if len(ids) < 2:
            continue
        inputs = torch.tensor([ids])
        logits = model(inputs).logits[0, :-1].float()
        nll.append(float(F.cross_entropy(logits, inputs[0, 1:], reduction="sum")))
        counts.append(len(ids) - 1)
    return nll, counts


def negative_log_likelihood(model, token_ids: list[list[int]]) -> tuple[float, int]:
    """Sum of next-token NLL over every predicted position, and the count of positions."""
    nll, counts = sequence_nll(model, token_ids)
    return sum(nll), sum(counts)


def perplexity(model, token_ids: list[list[int]]) -> float:
    total, count = negative_log_likelihood(model, token_ids)
    return math.exp(total / count)


def held_out_chunks(model_path, dataset: str, chunk: int) -> list[list[int]]:
    """Held-out text as consecutive chunks of `chunk` tokens (the usual perplexity protocol); the tail
    that does not fill a chunk is dropped."""
    from quantkit.data.readers import read_records
    from quantkit.data.samples import tokenize
    from quantkit.models import load_tokenizer

    flat = [t for ids in tokenize(read_records(dataset), load_tokenizer(model_path)) for t in ids]
    return [flat[i:i + chunk] for i in range(0, len(flat) // chunk * chunk, chunk)]
