"""Token-level agreement of a candidate with its baseline on the same tokens: perplexity, per-token
KL(baseline || candidate) and top-1 next-token agreement. One sequence at a time, to bound memory.

The baseline pass keeps, per position, its top-k log-probabilities (cacheable: k numbers instead of the
vocabulary). KL is computed over those k tokens plus one bucket holding the rest of each distribution's
mass. Merging tokens can only lower a KL divergence, so this is a lower bound on the full-vocabulary KL,
tight when the baseline's tail mass is small; it is computed the same way whether or not the baseline
came from the cache, and is exactly 0 for identical models.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quantkit.eval.stats import Measurement, paired_bootstrap, perplexity_increase_pct


@dataclass
class BaselineTokens:
    nll: np.ndarray  # [sequences] summed next-token NLL
    counts: np.ndarray  # [sequences] predicted positions
    top_idx: torch.Tensor  # [positions, k] int32, all sequences concatenated
    top_logp: torch.Tensor  # [positions, k] float32

    def to_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.nll": torch.from_numpy(self.nll), f"{prefix}.counts": torch.from_numpy(self.counts),
                f"{prefix}.top_idx": self.top_idx, f"{prefix}.top_logp": self.top_logp}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str) -> BaselineTokens:
        return cls(tensors[f"{prefix}.nll"].numpy(), tensors[f"{prefix}.counts"].numpy(),
                   tensors[f"{prefix}.top_idx"], tensors[f"{prefix}.top_logp"])


@dataclass
class TokenComparison:
    base_nll: np.ndarray  # [sequences]
    cand_nll: np.ndarray  # [sequences]
    counts: np.ndarray  # [sequences]
    kl: np.ndarray  # [positions]
    agree: np.ndarray  # [positions] bool

    @staticmethod
    def concat(parts: list[TokenComparison]) -> TokenComparison:
        return TokenComparison(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                                 ("base_nll", "cand_nll", "counts", "kl", "agree")))


def sample_records(token_ids: list[list[int]], max_seq_len: int, records: int, seed: int) -> list[list[int]]:
    """A seeded sample of records across the whole split, each record one sequence (its first max_seq_len
    tokens), in split order. One sequence per record keeps the bootstrap's units independent: chunks of one
    long record are not."""
    usable = [i for i, ids in enumerate(token_ids) if len(ids) >= 2]
    rng = np.random.default_rng(seed)
    chosen = usable if records >= len(usable) else sorted(rng.choice(usable, records, replace=False).tolist())
    return [token_ids[i][:max_seq_len] for i in chosen]


def dataset_sequences(dataset: str, tokenizer, max_seq_len: int, records: int, seed: int = 0) -> list[list[int]]:
    from quantkit.data.readers import read_records
    from quantkit.data.samples import tokenize

    return sample_records(tokenize(read_records(dataset), tokenizer), max_seq_len, records, seed)


def _log_probs(model, ids: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device)).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1).cpu()


@torch.no_grad()
def baseline_pass(model, sequences: list[list[int]], top_k: int, on_step=None) -> BaselineTokens:
    nll, counts, idx, vals = [], [], [], []
    for ids in sequences:
        logp = _log_probs(model, ids)
        targets = torch.tensor(ids[1:])
        nll.append(-float(logp.gather(1, targets[:, None]).sum()))
        counts.append(len(ids) - 1)
        top = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        idx.append(top.indices.to(torch.int32))
        vals.append(top.values)
        if on_step:
            on_step()
    return BaselineTokens(np.array(nll), np.array(counts), torch.cat(idx), torch.cat(vals))


@torch.no_grad()
def candidate_pass(model, sequences: list[list[int]], baseline: BaselineTokens, on_step=None) -> TokenComparison:
    nll, kl, agree, start = [], [], [], 0
    for ids in sequences:
        logq = _log_probs(model, ids)
        end = start + len(ids) - 1
        nll.append(-float(logq.gather(1, torch.tensor(ids[1:])[:, None]).sum()))
        kl.append(bucketed_kl(baseline.top_logp[start:end], baseline.top_idx[start:end].long(), logq))
        agree.append((logq.argmax(-1) == baseline.top_idx[start:end, 0]).numpy())
        start = end
        if on_step:
            on_step()
    return TokenComparison(baseline.nll, np.array(nll), baseline.counts, np.concatenate(kl), np.concatenate(agree))


def bucketed_kl(p_top_logp: torch.Tensor, top_idx: torch.Tensor, logq: torch.Tensor) -> np.ndarray:
    """Per-position KL(P || Q) over P's top-k tokens plus one bucket for everything else."""
    p_top_logp = p_top_logp.double()
    q_top_logp = logq.gather(1, top_idx).double()
    p_top = p_top_logp.exp()
    kl = (p_top * (p_top_logp - q_top_logp)).sum(-1)
    p_rest = (1 - p_top.sum(-1)).clamp(min=0)
    q_rest = (1 - q_top_logp.exp().sum(-1)).clamp(min=1e-30)
    tail = torch.where(p_rest > 1e-12, p_rest * (p_rest.clamp(min=1e-30).log() - q_rest.log()), 0.0)
    return (kl + tail).clamp(min=0).numpy()


def measurements(comparison: TokenComparison, scope: str, bootstrap) -> list[Measurement]:
    """Perplexity increase, KL mean and p99, top-1 agreement, each with a paired bootstrap interval over
    sequences (records)."""
    c = comparison
    offsets = np.concatenate([[0], np.cumsum(c.counts)])
    kwargs = dict(resamples=bootstrap.resamples, confidence=bootstrap.confidence, seed=bootstrap.seed)
    n, tokens = len(c.counts), int(c.counts.sum())

    def positions(idx: np.ndarray) -> np.ndarray:
        return np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in idx])

    ppl_base = float(np.exp(c.base_nll.sum() / tokens))
    ppl_cand = float(np.exp(c.cand_nll.sum() / tokens))
    kl_mean = paired_bootstrap(n, lambda idx: c.kl[positions(idx)].mean(), **kwargs)
    kl_p99 = paired_bootstrap(n, lambda idx: np.quantile(c.kl[positions(idx)], 0.99), **kwargs)
    agree = paired_bootstrap(n, lambda idx: c.agree[positions(idx)].mean(), **kwargs)
    return [
        Measurement("perplexity_increase_pct", scope, ppl_base, ppl_cand,
                    perplexity_increase_pct(c.base_nll, c.cand_nll, c.counts, **kwargs), "sequences", tokens),
        Measurement("kl_mean", scope, 0.0, kl_mean.value, kl_mean, "sequences", tokens),
        Measurement("kl_p99", scope, 0.0, kl_p99.value, kl_p99, "sequences", tokens),
        Measurement("top1_agreement", scope, 1.0, agree.value, agree, "sequences", tokens),
    ]


