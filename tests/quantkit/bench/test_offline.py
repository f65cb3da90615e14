from quantkit.bench.offline import make_prompts, offline_benchmark
from quantkit.models import load_tokenizer


def test_offline_benchmark_rows_on_the_tiny_model(tiny_model):
    rows = offline_benchmark(str(tiny_model), num_requests=4, output_len=3, serial_requests=2, progress=lambda m: None)
    assert [r.engine for r in rows] == ["transformers serial", "transformers static-8", "quantkit"]
    assert [r.requests for r in rows] == [2, 4, 4]
    for r in rows:
        assert r.tokens_per_second > 0 and r.peak_rss_mib >= r.loaded_rss_mib > r.weights_mib > 0
    assert rows[0].ratio_to_serial == 1.0
    # transformers and the runtime hold the same dense float32 weights (the runtime fuses, never copies)
    assert abs(rows[2].weights_mib - rows[0].weights_mib) < 0.05 * rows[0].weights_mib


def test_prompts_are_varied_and_deterministic(tiny_model):
    tok = load_tokenizer(tiny_model)
    prompts = make_prompts(tok, 8)
    assert prompts == make_prompts(tok, 8) and len({len(p) for p in prompts}) > 2
