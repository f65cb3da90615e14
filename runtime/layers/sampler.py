"""Pick the next token of each row: greedy, or temperature + top-k + top-p sampling with optional seeds."""

from __future__ import annotations

import torch

from quantkit.runtime.kernels import cpu_fused
from quantkit.runtime.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits: [B, V] float32. A row with a generator draws from it alone, so its seed fixes its tokens."""
    tokens = greedy(logits)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        index = torch.tensor(rows, device=logits.device)
        temperature = torch.tensor([params[i].temperature for i in rows], device=logits.device)
        top_k = [params[i].top_k for i in rows]
        top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device)
        probs = torch.softmax(_top_k_top_p(logits[index] / temperature[:, None], top_k, top_p), dim=-1)
        for j, i in enumerate(rows):
            tokens[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return tokens.tolist()


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The first index of each row's maximum. On CPU the native loop is ~4x faster than torch's max(dim),
    itself ~60% of argmax's time ([64, 49152] float32, 1 thread)."""
    if logits.dtype == torch.float32 and cpu_fused.supports(logits):
        return cpu_fused.greedy_tokens(logits)
    return logits.max(dim=-1).indices


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: torch.Tensor) -> torch.Tensor:
    if all(k <= 0 for k in top_k) and bool((top_p >= 1).all()):
        return logits
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True)
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=logits.device)
    ranks = torch.arange(vocab, device=logits.device)
    drop = ranks[None, :] >= ks[:, None]
    probs = torch.softmax(ordered.masked_fill(drop, float("-inf")), dim=-1)
    # Drop a token when the tokens before it already hold top_p of the mass; the first always stays.
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
