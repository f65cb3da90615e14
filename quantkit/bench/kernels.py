"""`quantkit bench kernels`: the runtime's CPU linear paths on SmolLM2's layer shapes at M = 1, 8, 64.

    fp32 dense            F.linear on float32 weights (a float32 dense checkpoint on CPU)
    int4 cpu (native)     quantkit's CPU INT4 kernel, cpu_int4.py (Int4Linear, kernels="auto"): a register
                          GEMV up to 4 rows, then AMX bf16 tiles where the CPU has them, else torch matmul
                          over decoded blocks in the activation dtype
    int4 cpu (int4pack)   torch's W4A16 CPU kernel, bf16 activations (the fallback when the native one
                          cannot be built)
    int4 reference        dequantize per call to float32, then F.linear (Int4Linear, kernels="reference")
    bf16 dense            F.linear on bfloat16 weights (a bf16 dense checkpoint; AMX where the CPU has it)
    int8 cpu (native)     W8A8 INT8 with per-token activations, bf16 in and out (Int8Linear, kernels="auto"):
                          cpu_int8.py quantizes the activations in the same call (timed), then AMX int8 tiles
                          where the CPU has them, else an AVX-512 VNNI GEMV
    int8 cpu (int_mm)     the same layer over torch._int_mm after torch-op quantization (timed; the fallback
                          when the native kernel cannot be built)

Timings are medians of interleaved rounds (each round runs every path once), so load from other processes
hits all paths alike; ratios are against fp32 dense and bf16 dense in the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from quantkit.bench.offline import tensor_mib
from quantkit.formats.quantized import Int8Weight, QuantizedWeight

# SmolLM2-135M's linears as the runtime fuses them: (name, out_features N, in_features K)
SMOLLM2_SHAPES = (("qkv_proj", 960, 576), ("o_proj", 576, 576), ("gate_up_proj", 3072, 576), ("down_proj", 576, 1536))
PATHS = ("fp32 dense", "int4 cpu (native)", "int4 cpu (int4pack)", "int4 reference", "bf16 dense",
         "int8 cpu (native)", "int8 cpu (int_mm)")
INT8_PATHS = {"int8 cpu (native)": "cpu-native", "int8 cpu (int_mm)": "cpu-int-mm"}


@dataclass
class KernelRow:
    layer: str
    n: int
    k: int
    m: int
    path: str
    microseconds: float
    ratio_to_fp32: float  # fp32 time / this time: > 1 is faster
    ratio_to_bf16: float  # bf16 dense time / this time
    weight_kib: float


def random_int4(n: int, k: int, group_size: int = 64, seed: int = 0) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    return QuantizedWeight(q=torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
                           scale=torch.rand(n, k // group_size, generator=gen) * 0.01 + 0.001,
                           zero=torch.randint(0, 16, (n, k // group_size), generator=gen, dtype=torch.int32),
                           bits=4, group_size=group_size, symmetric=False)


def random_int8(n: int, k: int, seed: int = 0) -> Int8Weight:
    gen = torch.Generator().manual_seed(seed)
    return Int8Weight(weight=torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8),
                      scale=torch.rand(n, 1, generator=gen) * 0.01 + 0.001)


def bench_kernels(ms: tuple[int, ...] = (1, 8, 64, 512), rounds: int = 30, threads: int = 1) -> list[KernelRow]:
    from quantkit.runtime.layers.int8_linear import Int8Linear
    from quantkit.runtime.layers.linear import Int4Linear

    torch.set_num_threads(threads)
    cpu, rows = torch.device("cpu"), []
    for name, n, k in SMOLLM2_SHAPES:
        qw = random_int4(n, k)
        dense = qw.dequantize(torch.float32)
        dense_bf16 = dense.to(torch.bfloat16)
        layers = {path: Int4Linear([qw], None, torch.float32, kernels, cpu)
                  for path, kernels in zip(PATHS[1:4], ("cpu-native", "cpu-int4pack", "reference"))}
        qw8 = random_int8(n, k)
        layers.update({path: Int8Linear([qw8], None, torch.bfloat16, kernels, cpu)
                       for path, kernels in INT8_PATHS.items()})
        weights = {PATHS[0]: dense.nbytes / 1024, **{p: tensor_mib(layer) * 1024 for p, layer in layers.items()},
                   PATHS[4]: dense_bf16.nbytes / 1024}
        for m in ms:
            x = torch.randn(m, k)
            xb = x.to(torch.bfloat16)
            calls = {PATHS[0]: lambda: F.linear(x, dense),
                     **{p: (lambda f=f: f(xb if p in INT8_PATHS else x)) for p, f in layers.items()},
                     PATHS[4]: lambda: F.linear(xb, dense_bf16)}
            times = _interleaved(calls, rounds)
            for path in PATHS:
                rows.append(KernelRow(name, n, k, m, path, round(times[path] * 1e6, 1),
                                      round(times[PATHS[0]] / times[path], 2),
                                      round(times[PATHS[4]] / times[path], 2), round(weights[path], 1)))
    return rows


def _interleaved(calls: dict, rounds: int) -> dict[str, float]:
    with torch.inference_mode():
        for call in calls.values():  # warm up
            call()
        samples = {path: [] for path in calls}
        for _ in range(rounds):
            for path, call in calls.items():
                start = time.perf_counter()
                call()
                samples[path].append(time.perf_counter() - start)
    return {path: statistics.median(s) for path, s in samples.items()}


def rows_table(rows: list[KernelRow], title: str):
    from rich.table import Table

    table = Table(title=title)
    for column in ("layer", "N x K", "M", "path", "us", "x fp32", "x bf16", "weights KiB"):
        table.add_column(column, justify="left" if column in ("layer", "path") else "right")
    for r in rows:
        table.add_row(r.layer, f"{r.n} x {r.k}", str(r.m), r.path, f"{r.microseconds:,.1f}", f"{r.ratio_to_fp32:.2f}",
                      f"{r.ratio_to_bf16:.2f}", f"{r.weight_kib:,.0f}")
    return table


def as_dicts(rows: list[KernelRow]) -> list[dict]:
    return [asdict(r) for r in rows]
