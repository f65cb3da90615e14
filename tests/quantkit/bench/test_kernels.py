from quantkit.bench.kernels import PATHS, SMOLLM2_SHAPES, bench_kernels


def test_bench_kernels_times_every_path_and_counts_int4_weights_at_half_a_byte_and_int8_at_one():
    rows = bench_kernels(ms=(1,), rounds=2)
    assert len(rows) == len(SMOLLM2_SHAPES) * len(PATHS)
    for r in rows:
        assert r.microseconds > 0
        fp32 = r.n * r.k * 4 / 1024
        if r.path == "fp32 dense":
            assert r.ratio_to_fp32 == 1.0 and r.weight_kib == round(fp32, 1)
        if r.path == "int4 cpu (int4pack)":  # packed nibbles plus bf16 scales and offsets per group of 64
            assert r.weight_kib == round(fp32 / 8 + r.n * r.k / 64 * 4 / 1024, 1)
        if r.path == "int4 cpu (native)":  # packed nibbles plus float32 scales and offsets per group of 64
            assert r.weight_kib == round(fp32 / 8 + r.n * r.k / 64 * 8 / 1024, 1)
        if r.path == "bf16 dense":
            assert r.ratio_to_bf16 == 1.0
        if r.path == "int8 cpu (int_mm)":  # int8 weights plus a float32 scale per column
            assert r.weight_kib == round((r.n * r.k + r.n * 4) / 1024, 1)
        if r.path == "int8 cpu (native)":  # SmolLM2's shapes need no padding; plus float32 scales, int32 sums
            assert r.weight_kib == round((r.n * r.k + r.n * 8) / 1024, 1)
