"""`quantkit bench kv-cache CKPT`: what an FP8 KV cache costs in perplexity with the checkpoint's
calibrated per-layer scales, versus the scale of 1.0 that engines fall back to when a checkpoint has
none. Every row runs the same model on the same held-out tokens in one process, threads pinned.
"""

from __future__ import annotations

from pathlib import Path

import torch


def run_bench(checkpoint: Path, eval_dataset: str, max_seq_len: int, threads: int, console) -> dict:
    from quantkit.eval.kv_cache import fp8_kv_cache, read_kv_scales
    from quantkit.eval.perplexity import held_out_chunks, perplexity
    from quantkit.models import load_model

    torch.set_num_threads(threads)
    scales = read_kv_scales(checkpoint)
    model = load_model(checkpoint)
    chunks = held_out_chunks(checkpoint, eval_dataset, max_seq_len)
    baseline = perplexity(model, chunks)
    calibrated = None
    if scales:
        with fp8_kv_cache(model, scales):
            calibrated = perplexity(model, chunks)
    with fp8_kv_cache(model, None):  # warns when the checkpoint has no scales
        unit = perplexity(model, chunks)
    result = {"checkpoint": str(checkpoint), "eval": eval_dataset, "tokens": sum(map(len, chunks)),
              "threads": threads, "perplexity": {"kv_model_dtype": baseline, "kv_fp8_calibrated": calibrated,
                                                  "kv_fp8_scale_1": unit},
              "scales": {str(i): {"k_scale": k, "v_scale": v} for i, (k, v) in scales.items()}}
    _print(console, result)
    return result


def _print(console, result: dict) -> None:
    from rich.table import Table

    ppl = result["perplexity"]
    base = ppl["kv_model_dtype"]
    table = Table(title=f"FP8 KV cache on {result['checkpoint']}: perplexity on {result['eval']} "
                        f"({result['tokens']} tokens, {result['threads']} thread(s))")
    for column in ("KV cache", "perplexity", "vs model-dtype KV"):
        table.add_column(column)
    for label, key in (("model dtype (no fp8)", "kv_model_dtype"), ("fp8, calibrated scales", "kv_fp8_calibrated"),
                       ("fp8, scale 1.0 (engine default)", "kv_fp8_scale_1")):
        if ppl[key] is not None:
            table.add_row(label, f"{ppl[key]:.3f}", f"{ppl[key] / base - 1:+.2%}")
    console.print(table)
    layers = Table(title="per-layer scales (|K| max = k_scale x 448; keys after rotary)")
    for column in ("layer", "k_scale", "v_scale", "|K| max", "|V| max"):
        layers.add_column(column)
    for layer, s in result["scales"].items():
        layers.add_row(layer, f"{s['k_scale']:.5f}", f"{s['v_scale']:.5f}", f"{s['k_scale'] * 448:.1f}",
                       f"{s['v_scale'] * 448:.1f}")
    console.print(layers)
