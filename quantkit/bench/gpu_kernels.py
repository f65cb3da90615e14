"""The runtime's Triton kernels on a GPU, against the device's copy bandwidth and torch fp16.

    python -m quantkit.bench.gpu_kernels [--int4-group 128] [--attn-batch 16]

- device copy bandwidth: a 1 GiB device-to-device copy (bytes read + written per second), the roofline;
- INT4 GEMM (W4A16, fp16): M in {1, 16, 64, 256} x (N, K) in {(4096, 4096), (11008, 4096), (4096, 11008)}:
  time, GB/s moved (packed weights, scales, zeros, x, y) and its share of the copy bandwidth, speed-up over
  torch fp16 x @ W; targets at M = 1: >= 70% of copy bandwidth and >= 2.5x fp16;
- paged decode attention, fp8 versus fp16 KV cache, Llama-3-8B heads (32 query, 8 KV, D 128), block 16,
  context 1k..16k: time, GB/s of K/V read, fp8 speed-up; target: fp8 faster from 4k on.
Times are triton.testing.do_bench medians with the L2 flushed before each run (cold weights, as in decode).
Each kernel is checked against its torch reference (SQNR in dB) before it is timed. Prints a table; writes
gpu_kernels.json into $OUT when set. Needs CUDA and triton; about 3-6 minutes on an H100/H200, most of it
compiling the ~100 INT4 tuning candidates (M = 1, M <= 16 and larger M have their own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

M_VALUES = (1, 16, 64, 256)
NK_SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))
CONTEXTS = (1024, 2048, 4096, 8192, 16384)
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
TARGET_BW_SHARE, TARGET_SPEEDUP = 0.70, 2.5


def sqnr_db(reference: torch.Tensor, actual: torch.Tensor) -> float:
    reference, actual = reference.double(), actual.double()
    noise = (reference - actual).pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * torch.log10(reference.pow(2).sum() / noise).item()


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth_gbs(device: torch.device) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / ms / 1e6


def int4_case(m: int, n: int, k: int, group: int, device: torch.device) -> dict:
    from quantkit.runtime.kernels import int4_gemm
    from quantkit.runtime.kernels.int4_layout import dequantize_int4, int4_matmul_reference, pack_int4

    groups = k // group
    q = torch.randint(0, 16, (n, k))
    scales = torch.rand(n, groups) * 0.01 + 0.001
    zeros = torch.randint(0, 16, (n, groups))
    qweight, scales, zeros = (t.to(device) for t in pack_int4(q, scales, zeros))  # packed on the CPU
    scales = scales.half()
    x = torch.randn(m, k, dtype=torch.float16, device=device)
    w = dequantize_int4(qweight, scales, zeros, None, group, torch.float16)
    tuning = time.perf_counter()
    y = int4_gemm.int4_matmul(x, qweight, scales, zeros, None, group)  # first call tunes this shape
    tuning = time.perf_counter() - tuning
    db = sqnr_db(int4_matmul_reference(x, qweight, scales, zeros, None, group), y)
    int4_ms = bench_ms(lambda: int4_gemm.int4_matmul(x, qweight, scales, zeros, None, group))
    fp16_ms = bench_ms(lambda: torch.mm(x, w))
    moved = qweight.numel() * 4 + scales.numel() * 2 + zeros.numel() + x.numel() * 2 + m * n * 2
    return dict(m=m, n=n, k=k, group=group, int4_us=int4_ms * 1e3, fp16_us=fp16_ms * 1e3,
                speedup=fp16_ms / int4_ms, gbs=moved / int4_ms / 1e6, sqnr_db=db, tune_s=tuning,
                config=str(int4_gemm.tuned_config(x, qweight, None, group)))


def attention_case(context: int, batch: int, device: torch.device) -> dict:
    from quantkit.runtime.kernels import fp8_kv, paged_attention, reference

    blocks_per_seq = context // BLOCK_SIZE
    num_blocks = batch * blocks_per_seq + 1  # + the null block
    table = (torch.randperm(num_blocks - 1, device=device) + 1).view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.float16, device=device)
    slots = torch.arange(num_blocks * BLOCK_SIZE, device=device)
    row = {"context": context, "batch": batch}
    for name, cache_dtype, k_scale, v_scale in (("fp16", torch.float16, None, None),
                                                ("fp8", torch.uint8, 0.02, 0.01)):
        caches = []
        for std, scale in ((3.0, k_scale), (1.0, v_scale)):
            cache = torch.empty(num_blocks * BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=cache_dtype, device=device)
            values = (torch.randn(cache.shape, device=device) * std).half()
            fp8_kv.write_kv(cache, values, slots, scale)
            del values
            caches.append(cache)
        args = (q, caches[0], caches[1], table, lens, BLOCK_SIZE, HEAD_DIM ** -0.5, k_scale, v_scale)
        out = paged_attention.paged_decode_attention(*args)
        if context <= 4096:  # the reference materializes every sequence's K/V in fp16
            row[f"{name}_sqnr_db"] = sqnr_db(reference.paged_decode_attention(*args), out)
        ms = bench_ms(lambda: paged_attention.paged_decode_attention(*args))
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * caches[0].element_size()
        row[f"{name}_us"], row[f"{name}_gbs"] = ms * 1e3, kv_bytes / ms / 1e6
        del caches
    row["fp8_speedup"] = row["fp16_us"] / row["fp8_us"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--int4-group", type=int, default=128)
    parser.add_argument("--attn-batch", type=int, default=16)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; this benchmark needs a GPU", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    device = torch.device("cuda")
    torch.manual_seed(0)
    started = time.perf_counter()
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__}
    import triton

    result["triton"] = triton.__version__
    copy_gbs = copy_bandwidth_gbs(device)
    result["copy_gbs"] = copy_gbs
    print(f"{result['device']}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"device copy bandwidth: {copy_gbs:,.0f} GB/s (read + write)\n")

    print(f"INT4 GEMM, W4A16 fp16, group {args.int4_group} asymmetric")
    print(f"{'M':>4} {'N':>6} {'K':>6} {'int4 us':>9} {'fp16 us':>9} {'speedup':>8} {'GB/s':>7} "
          f"{'% copy':>7} {'SQNR dB':>8}  config")
    result["int4"] = []
    for n, k in NK_SHAPES:
        for m in M_VALUES:
            row = int4_case(m, n, k, args.int4_group, device)
            row["copy_share"] = row["gbs"] / copy_gbs
            result["int4"].append(row)
            print(f"{m:>4} {n:>6} {k:>6} {row['int4_us']:>9.1f} {row['fp16_us']:>9.1f} {row['speedup']:>7.2f}x "
                  f"{row['gbs']:>7.0f} {row['copy_share']:>6.0%} {row['sqnr_db']:>8.1f}  {row['config']}",
                  flush=True)
    m1 = [r for r in result["int4"] if r["m"] == 1]
    result["int4_targets_met_at_m1"] = all(r["copy_share"] >= TARGET_BW_SHARE and r["speedup"] >= TARGET_SPEEDUP
                                          for r in m1)
    print(f"targets at M = 1 (>= {TARGET_BW_SHARE:.0%} of copy bandwidth, >= {TARGET_SPEEDUP}x fp16): "
          f"{'met' if result['int4_targets_met_at_m1'] else 'NOT met'}\n")

    print(f"paged decode attention, batch {args.attn_batch}, {HEADS} heads / {KV_HEADS} KV heads, D {HEAD_DIM}, "
          f"block {BLOCK_SIZE}")
    print(f"{'context':>7} {'fp16 us':>9} {'fp16 GB/s':>10} {'fp8 us':>9} {'fp8 GB/s':>9} {'fp8 speedup':>12} "
          f"{'SQNR fp16/fp8 dB':>17}")
    result["attention"] = []
    for context in CONTEXTS:
        row = attention_case(context, args.attn_batch, device)
        result["attention"].append(row)
        sq = (f"{row['fp16_sqnr_db']:.0f}/{row['fp8_sqnr_db']:.0f}" if "fp8_sqnr_db" in row else "-")
        print(f"{context:>7} {row['fp16_us']:>9.1f} {row['fp16_gbs']:>10.0f} {row['fp8_us']:>9.1f} "
              f"{row['fp8_gbs']:>9.0f} {row['fp8_speedup']:>11.2f}x {sq:>17}", flush=True)
        torch.cuda.empty_cache()
    long = [r for r in result["attention"] if r["context"] >= 4096]
    result["attention_target_met"] = all(r["fp8_speedup"] > 1 for r in long)
    print(f"target (fp8 faster than fp16 from 4k): {'met' if result['attention_target_met'] else 'NOT met'}")
    result["seconds"] = time.perf_counter() - started
    print(f"\n{result['seconds']:.0f} s")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "gpu_kernels.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
