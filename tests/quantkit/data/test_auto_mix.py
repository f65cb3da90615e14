"""`--dataset auto` on the real sets with the SmolLM2 tokenizer (no model run): the mix follows the traffic."""

import warnings

import pytest

from quantkit.data.auto_mix import auto_samples, candidates, is_auto
from quantkit.data.readers import read_records
from quantkit.data.records import Record
from quantkit.data.samples import tokenize
from quantkit.errors import QuantkitError

CANDIDATES = "auto:coqa_chat_en,code_python_en,gsm8k_math_en,customer_service_zh"


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from quantkit.models import load_tokenizer

    return load_tokenizer(smollm2)


def _untagged(ref):
    """Traffic as users send it: no task or language tags."""
    return [Record(r.where, r.shape, r.messages, r.prompt, r.completion, r.text) for r in read_records(ref)]


def _auto(traffic, tokenizer, n=32):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return auto_samples(CANDIDATES, traffic, tokenize(traffic, tokenizer), tokenizer, n, 512)


def test_parsing():
    assert is_auto("auto") and is_auto("auto:a,b") and not is_auto("autos.jsonl")
    assert candidates("auto:a, b") == ["a", "b"]
    with pytest.raises(QuantkitError, match="twice"):
        candidates("auto:a,a")


@pytest.mark.parametrize("traffic,expected", [("code_python_en:eval", "code_python_en"),
                                              ("customer_service_zh:eval", "customer_service_zh"),
                                              ("gsm8k_math_en:eval", "gsm8k_math_en")])
def test_single_kind_traffic_draws_from_its_own_kind(traffic, expected, tokenizer):
    result = _auto(_untagged(traffic), tokenizer)
    assert result.mix.best_single == expected
    assert result.mix.counts[expected] >= 24, result.mix.counts


def test_mixed_traffic_gets_a_mix_that_covers_it_better_than_pooling(tokenizer):
    traffic = _untagged("code_python_en:eval") + _untagged("gsm8k_math_en:eval")[:63]
    result = _auto(traffic, tokenizer)
    assert result.mix.counts["code_python_en"] >= 8 and result.mix.counts["gsm8k_math_en"] >= 8
    assert sum(result.mix.counts.values()) == len(result.samples.input_ids) == 32
    after, pooled = result.coverage["auto mix"], result.coverage["pooled"]
    assert after.jsd_unigram < pooled.jsd_unigram and after.ks_length <= pooled.ks_length
