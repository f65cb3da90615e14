"""`--dataset auto[:SET,SET|FILE,...]`: read the candidate sets, choose the mix that matches the traffic
(quantkit.data.mix), draw it, and measure coverage before and after with the coverage report's own measures.

"Before" is what a user gets without auto: the candidates pooled and drawn as one set (``--dataset A,B,...``),
and the best single candidate; "after" is the chosen mix.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.data import coverage
from quantkit.data.mix import Mix, choose_mix, draw_mix, profile
from quantkit.data.readers import read_records, shipped_set_names
from quantkit.data.records import Record
from quantkit.data.samples import SampleSet, select_samples, tokenize
from quantkit.errors import QuantkitError

AUTO = "auto"


@dataclass
class AutoResult:
    samples: SampleSet
    mix: Mix
    coverage: dict[str, coverage.CoverageReport]  # "pooled", "best single: NAME", "auto mix"


def is_auto(ref: str) -> bool:
    return ref == AUTO or ref.startswith(AUTO + ":")


def candidates(ref: str) -> list[str]:
    """``auto``: every shipped set's train split; ``auto:A,B``: those sets or files."""
    listed = ref.partition(":")[2]
    names = [part.strip() for part in listed.split(",") if part.strip()] if listed else shipped_set_names()
    if len(set(names)) != len(names):
        raise QuantkitError(f"--dataset {ref}: a candidate is listed twice")
    return names


def auto_samples(ref: str, traffic: list[Record], traffic_ids: list[list[int]], tokenizer, num_samples: int,
                 max_seq_len: int, seed: int = 0, stratify: bool = True) -> AutoResult:
    names = candidates(ref)
    records = {name: read_records(name) for name in names}  # an unknown name is a QuantkitError here
    token_ids = {name: tokenize(records[name], tokenizer) for name in names}
    vocab = max(len(tokenizer), 1 + max(max(ids, default=0) for ids in traffic_ids))
    grid = max(max_seq_len, max(map(len, traffic_ids))) + 1
    parts = [profile(records[n], token_ids[n], grid, vocab, max_seq_len) for n in names]
    mix = choose_mix(names, parts, [len(records[n]) for n in names], profile(traffic, traffic_ids, grid, vocab, None),
                     num_samples)
    samples = draw_mix(mix, records, token_ids, max_seq_len, seed, stratify)

    def report(drawn: SampleSet) -> coverage.CoverageReport:
        return coverage.compare(drawn.records, drawn.input_ids, traffic, traffic_ids)

    pooled = select_samples([r for n in names for r in records[n]], [t for n in names for t in token_ids[n]],
                            num_samples, max_seq_len, seed=seed, stratify=stratify)
    single = select_samples(records[mix.best_single], token_ids[mix.best_single], num_samples, max_seq_len,
                            seed=seed, stratify=stratify)
    return AutoResult(samples, mix, {"pooled": report(pooled), f"best single: {mix.best_single}": report(single),
                                     "auto mix": report(samples)})
