import pytest

from quantkit.bench.runtime_features import kv_capacity_bench, prefix_cache_bench


def test_prefix_cache_bench_serves_the_shared_system_prompt_from_the_cache(tiny_model):
    result = prefix_cache_bench(str(tiny_model), num_requests=3, system_tokens=100, output_len=2)
    off, on = result["rows"]
    assert result["system_prompt_tokens"] == 100 and off["prompt_tokens"] == on["prompt_tokens"] > 100
    assert off["cached_prompt_tokens"] == 0
    # requests 2 and 3 find the system prompt's 6 full blocks of 16 tokens; the first finds nothing
    assert on["cached_prompt_tokens"] == round(2 * 96 / 3)
    assert result["ttft_speedup"] == pytest.approx(off["mean_ttft_ms"] / on["mean_ttft_ms"], rel=0.01)


def test_kv_capacity_bench_fits_four_times_the_sequences_in_fp8_than_in_float32(tiny_model):
    result = kv_capacity_bench(str(tiny_model), kv_budget_mib=0.25, num_requests=8, output_len=8, max_model_len=256,
                               configs=(("float32", "auto"), ("float32", "fp8")))
    wide, fp8 = result["rows"]
    assert wide["bytes_per_token"] == 4 * fp8["bytes_per_token"]
    assert fp8["blocks"] + 1 == 4 * (wide["blocks"] + 1)  # the same budget; one block is the null block
    assert wide["preemptions"] > 0 and fp8["preemptions"] == 0
    assert fp8["peak_running"] == 8 > wide["peak_running"]
