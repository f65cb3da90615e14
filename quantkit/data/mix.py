"""`--dataset auto`: how many calibration samples to draw from each candidate set so that the mix matches a
traffic sample, by the measures the coverage report prints (quantkit.data.coverage): the two-sample KS
statistic of token lengths, the token-unigram Jensen-Shannon divergence, and the total-variation distance
between the language mixes (and between the task mixes, when the traffic carries task tags). The objective
is their plain sum: each lies in [0, 1] and the report reads them side by side.

A mix's measures follow from per-set profiles (length CDF, unigram counts, language and task shares) without
drawing samples, so the search is cheap: greedy, a step of samples at a time (at most GREEDY_STEPS steps) to
the set that lowers the objective most, then single-sample moves between sets while any helps. The chosen
counts are then drawn for real and the coverage report measures the drawn samples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from quantkit.data.coverage import MIN_SHARE, jsd_bits
from quantkit.data.language import record_language
from quantkit.data.records import Record
from quantkit.data.samples import SampleSet, select_samples


GREEDY_STEPS = 128  # large --num-samples are placed in this many steps, then refined one sample at a time


@dataclass
class Profile:
    """What a mix needs to know about one set (or the traffic): lengths as a CDF on a shared grid,
    token counts, mean tokens per record, language and task shares."""
    cdf: np.ndarray
    unigrams: np.ndarray
    mean_tokens: float
    langs: dict[str, float]
    tasks: dict[str, float]


@dataclass
class MixScore:
    ks_length: float
    jsd_unigram: float
    lang_distance: float
    task_distance: float | None  # None: the traffic has no task tags

    @property
    def total(self) -> float:
        return self.ks_length + self.jsd_unigram + self.lang_distance + (self.task_distance or 0.0)

    def as_dict(self) -> dict:
        return {"ks_length": round(self.ks_length, 4), "jsd_unigram": round(self.jsd_unigram, 4),
                "lang_distance": round(self.lang_distance, 4),
                "task_distance": None if self.task_distance is None else round(self.task_distance, 4),
                "objective": round(self.total, 4)}


@dataclass
class Mix:
    counts: dict[str, int]  # samples per candidate, in candidate order
    score: MixScore  # predicted from the profiles
    best_single: str  # the candidate whose samples alone would match best
    best_single_score: MixScore
    warnings: list[str] = field(default_factory=list)


def profile(records: list[Record], token_ids: list[list[int]], grid: int, vocab: int,
            max_seq_len: int | None) -> Profile:
    """``max_seq_len`` truncates lengths and tokens as calibration will (None for the traffic, kept whole)."""
    ids = [t[:max_seq_len] if max_seq_len else t for t in token_ids]
    lengths = np.minimum([len(t) for t in ids], grid - 1)
    cdf = np.cumsum(np.bincount(lengths, minlength=grid)) / len(ids)
    unigrams = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for t in ids]), minlength=vocab)
    return Profile(cdf, unigrams.astype(np.float64), float(np.mean([len(t) for t in ids])),
                   _shares(record_language(r) for r in records), _shares(r.task for r in records))


def score(weights: np.ndarray, parts: list[Profile], traffic: Profile, use_tasks: bool) -> MixScore:
    """The measures of a mix that draws ``weights[k]`` of its samples from ``parts[k]``."""
    w = weights / weights.sum()
    cdf = sum(wk * p.cdf for wk, p in zip(w, parts) if wk)
    # Each set adds its unigram distribution in proportion to the tokens its samples bring.
    unigrams = sum(wk * p.mean_tokens * p.unigrams / p.unigrams.sum() for wk, p in zip(w, parts) if wk)
    return MixScore(
        ks_length=float(np.max(np.abs(cdf - traffic.cdf))),
        jsd_unigram=jsd_bits(unigrams, traffic.unigrams),
        lang_distance=float(_distance([p.langs for p in parts], w, traffic.langs)),
        task_distance=float(_distance([p.tasks for p in parts], w, traffic.tasks)) if use_tasks else None)


def choose_mix(names: list[str], parts: list[Profile], available: list[int], traffic: Profile,
               num_samples: int) -> Mix:
    use_tasks = any(task != "unknown" for task in traffic.tasks)
    total = min(num_samples, sum(available))
    counts = np.zeros(len(parts))

    def objective(c: np.ndarray) -> float:
        return score(c, parts, traffic, use_tasks).total

    step = max(1, total // GREEDY_STEPS)
    while counts.sum() < total:  # greedy: each step of samples to the set that helps most
        size = min(step, total - int(counts.sum()))
        trials = [(objective(counts + size * np.eye(len(parts))[k]), k) for k in range(len(parts))
                  if counts[k] + size <= available[k]]
        if not trials:  # no set holds a whole step any more: go one sample at a time
            step = size = 1
            continue
        counts[min(trials)[1]] += size
    best = objective(counts)
    improved = True
    while improved:  # then move single samples between sets while that lowers the objective
        improved = False
        for i in np.flatnonzero(counts):
            for j in range(len(parts)):
                if i == j or counts[j] >= available[j] or not counts[i]:
                    continue
                trial = counts.copy()
                trial[i] -= 1
                trial[j] += 1
                value = objective(trial)
                if value < best - 1e-9:
                    counts, best, improved = trial, value, True
    singles = [(score(np.eye(len(parts))[k], parts, traffic, use_tasks), names[k]) for k in range(len(parts))]
    single_score, single = min(singles, key=lambda s: s[0].total)
    return Mix(counts={n: int(c) for n, c in zip(names, counts)}, score=score(counts, parts, traffic, use_tasks),
               best_single=single, best_single_score=single_score,
               warnings=_missing_languages(parts, names, traffic))


def draw_mix(mix: Mix, records: dict[str, list[Record]], token_ids: dict[str, list[list[int]]],
             max_seq_len: int, seed: int, stratify: bool) -> SampleSet:
    """Draw each candidate's count (stratified within the set, as a single-set draw is) and join them."""
    joined = SampleSet(input_ids=[], records=[], num_available=0)
    for name, count in mix.counts.items():
        joined.num_available += len(records[name])
        if not count:
            continue
        part = select_samples(records[name], token_ids[name], count, max_seq_len, seed=seed, stratify=stratify)
        joined.input_ids += part.input_ids
        joined.records += part.records
        joined.num_truncated += part.num_truncated
        joined.tokens_truncated += part.tokens_truncated
        for key, n in part.strata.items():
            joined.strata[f"{name}/{key}"] = n
    return joined


def _missing_languages(parts: list[Profile], names: list[str], traffic: Profile) -> list[str]:
    covered = {lang for p in parts for lang in p.langs}
    missing = [(lang, share) for lang, share in traffic.langs.items() if share >= MIN_SHARE and lang not in covered]
    return [f"no candidate set contains the traffic's language '{lang}' ({share:.0%} of its records); the mix is "
            f"the best of {', '.join(names)}" for lang, share in missing]


def _shares(values) -> dict[str, float]:
    counts = Counter(values)
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def _distance(parts: list[dict[str, float]], weights: np.ndarray, target: dict[str, float]) -> float:
    """Total-variation distance between the weighted mix of ``parts`` and ``target``."""
    mixed: Counter = Counter()
    for wk, shares in zip(weights, parts):
        for key, share in shares.items():
            mixed[key] += wk * share
    return 0.5 * sum(abs(mixed.get(k, 0.0) - target.get(k, 0.0)) for k in set(mixed) | set(target))
