"""Turn records into token sequences: chat templating, seeded stratified sampling, counted truncation."""

from __future__ import annotations

import random
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

from quantkit.data.records import Record

# Token-length bucket edges used to stratify sampling and to describe length mixes.
LENGTH_BUCKETS = (128, 512, 1024, 2048)


def render(record: Record, tokenizer) -> tuple[str, bool]:
    """The text the model sees, and whether it already carries the special tokens of a chat template."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if record.shape == "chat" and has_template:
        messages = [{"role": r, "content": c} for r, c in record.messages]
        return tokenizer.apply_chat_template(messages, tokenize=False), True
    if record.shape == "pair" and has_template:
        messages = [{"role": "user", "content": record.prompt}]
        if record.completion:
            messages.append({"role": "assistant", "content": record.completion})
        return tokenizer.apply_chat_template(messages, tokenize=False), True
    if record.shape == "pair":
        return record.prompt + record.completion, False
    return record.plain_text(), False


def tokenize(records: list[Record], tokenizer) -> list[list[int]]:
    rendered = [render(record, tokenizer) for record in records]
    out: list[list[int]] = [[] for _ in records]
    for templated in (True, False):  # one batched call per kind: fast tokenizers run a batch in parallel
        picked = [i for i, (_, t) in enumerate(rendered) if t == templated]
        if picked:
            ids = tokenizer([rendered[i][0] for i in picked], add_special_tokens=not templated)["input_ids"]
            for i, row in zip(picked, ids):
                out[i] = row
    return out


def length_bucket(num_tokens: int) -> str:
    low = 0
    for edge in LENGTH_BUCKETS:
        if num_tokens < edge:
            return f"{low}-{edge - 1}"
        low = edge
    return f">={low}"


@dataclass
class SampleSet:
    """The sequences calibration runs on, and an honest account of how they were chosen."""

    input_ids: list[list[int]]
    records: list[Record]
    num_available: int
    num_truncated: int = 0
    tokens_truncated: int = 0
    strata: dict[str, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for ids in self.input_ids)


def select_samples(
    records: list[Record],
    token_ids: list[list[int]],
    num_samples: int,
    max_seq_len: int,
    seed: int = 0,
    stratify: bool = True,
) -> SampleSet:
    """Pick ``num_samples`` records (all of them when fewer exist, with a warning), truncate to
    ``max_seq_len`` and count what was cut. Stratified by (task, length bucket) so that every slice
    of the set keeps its share."""
    if len(records) < num_samples:
        warnings.warn(f"only {len(records)} records available, fewer than --num-samples {num_samples}: using all")
    rng = random.Random(seed)
    if stratify:
        chosen = _stratified(records, token_ids, min(num_samples, len(records)), rng)
    else:
        chosen = rng.sample(range(len(records)), min(num_samples, len(records)))
    chosen.sort()
    rng.shuffle(chosen)
    samples = SampleSet(input_ids=[], records=[], num_available=len(records))
    for i in chosen:
        ids = token_ids[i]
        if len(ids) > max_seq_len:
            samples.num_truncated += 1
            samples.tokens_truncated += len(ids) - max_seq_len
            ids = ids[:max_seq_len]
        samples.input_ids.append(ids)
        samples.records.append(records[i])
        key = f"{records[i].task}/{length_bucket(len(token_ids[i]))}"
        samples.strata[key] = samples.strata.get(key, 0) + 1
    return samples


def pack_samples(records: list[Record], token_ids: list[list[int]], num_samples: int, max_seq_len: int,
                 separator: list[int], seed: int = 0) -> SampleSet:
    """Concatenate records (a seeded, stratified draw, separated by ``separator``) and cut
    ``num_samples`` chunks of exactly ``max_seq_len`` tokens, the pile-style protocol: every sample is
    full length, and samples cross record boundaries. The unused tail of the last record is counted."""
    need = num_samples * max_seq_len
    mean_len = sum(len(ids) + len(separator) for ids in token_ids) / len(token_ids)
    rng = random.Random(seed)
    draw = _stratified(records, token_ids, min(len(records), int(need / mean_len * 1.1) + 1), rng)
    rest = sorted(set(range(len(records))) - set(draw))
    rng.shuffle(draw)
    rng.shuffle(rest)
    stream, used = [], []
    for i in draw + rest:
        if len(stream) >= need:
            break
        stream += token_ids[i] + separator
        used.append(i)
    count = min(num_samples, len(stream) // max_seq_len)
    if count < num_samples:
        warnings.warn(f"the dataset has {len(stream)} tokens, enough for {count} packed samples of "
                      f"{max_seq_len}, fewer than --num-samples {num_samples}: using {count}")
    samples = SampleSet(input_ids=[stream[j * max_seq_len:(j + 1) * max_seq_len] for j in range(count)],
                        records=[records[i] for i in used], num_available=len(records),
                        num_truncated=1 if len(stream) > count * max_seq_len else 0,
                        tokens_truncated=len(stream) - count * max_seq_len)
    for i in used:
        key = f"{records[i].task}/{length_bucket(len(token_ids[i]))}"
        samples.strata[key] = samples.strata.get(key, 0) + 1
    return samples


def _stratified(records: list[Record], token_ids: list[list[int]], k: int, rng: random.Random) -> list[int]:
    strata: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (record, ids) in enumerate(zip(records, token_ids)):
        strata[(record.task, length_bucket(len(ids)))].append(i)
    keys = sorted(strata)
    for key in keys:
        rng.shuffle(strata[key])
    # Largest-remainder allocation: each stratum gets its proportional share of k, rounded fairly.
    exact = {key: k * len(strata[key]) / len(records) for key in keys}
    quota = {key: int(exact[key]) for key in keys}
    by_remainder = sorted(keys, key=lambda key: (exact[key] - quota[key], rng.random()), reverse=True)
    for key in by_remainder[: k - sum(quota.values())]:
        quota[key] += 1
    return [i for key in keys for i in strata[key][: quota[key]]]


def draw_samples(records: list[Record], tokenizer, num_samples: int, max_seq_len: int, seed: int = 0,
                 stratify: bool = True, pack: bool = False) -> SampleSet:
    """Tokenize and draw calibration samples: one record per sample (truncated, counted), or with
    ``pack`` full-length chunks of concatenated records separated by the EOS token."""
    token_ids = tokenize(records, tokenizer)
    if pack:
        separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        return pack_samples(records, token_ids, num_samples, max_seq_len, separator, seed)
    return select_samples(records, token_ids, num_samples, max_seq_len, seed=seed, stratify=stratify)
