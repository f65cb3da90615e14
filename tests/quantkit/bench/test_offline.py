from quantkit.bench.offline import make_prompts, offline_throughput
from quantkit.models import load_tokenizer


def test_offline_throughput_on_the_tiny_model(tiny_model):
    result = offline_throughput(str(tiny_model), num_requests=3, output_len=4, transformers_requests=2)
    assert result.num_requests == 3 and result.transformers_requests == 2
    assert result.runtime_tokens_per_second > 0 and result.transformers_tokens_per_second > 0
    assert result.ratio == result.runtime_tokens_per_second / result.transformers_tokens_per_second
    assert "ratio" in result.summary()


def test_prompts_are_varied_and_deterministic(tiny_model):
    tok = load_tokenizer(tiny_model)
    prompts = make_prompts(tok, 8)
    assert prompts == make_prompts(tok, 8) and len({len(p) for p in prompts}) > 2
