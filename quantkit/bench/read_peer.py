"""`quantkit bench read-peer`: a checkpoint written by llm-compressor is read by quantkit and gives the same
logits as transformers (with compressed-tensors, in llm-compressor's venv) on it.

llm-compressor quantizes the model (GPTQ W4A16 g64 symmetric) on a few calibration samples; both sides then
compute float32 logits on prompts from the shipped eval sets. Reported: the largest absolute logit difference
(and relative to the largest logit), and how often the two argmaxes agree; for scale, the same numbers
between the fp16 model and the checkpoint.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from quantkit.bench.peers import LLMCOMPRESSOR, peer_python, run_llmcompressor
from quantkit.bench.prompts import draw_prompts
from quantkit.bench.workers import run_worker

WORKER = Path(__file__).with_name("peer_llmcompressor_logits.py")


def run_bench(model: str, dataset: str, num_samples: int, max_seq_len: int, num_prompts: int, threads: int,
              console, keep: Path | None = None) -> dict:
    from safetensors.torch import load_file

    from quantkit.bench.quantize import _write_calibration
    from quantkit.models import load_tokenizer, resolve_model

    torch.set_num_threads(threads)
    path = resolve_model(model)
    prompts = [p.token_ids for p in draw_prompts(load_tokenizer(path), num_prompts, max_tokens=128)]
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        calib_dir = _write_calibration(path, dataset, num_samples, max_seq_len, work / "calib")
        checkpoint = work / "llmcompressor-gptq"
        quantized = run_llmcompressor("gptq", path, calib_dir, checkpoint, threads)
        (work / "prompts.json").write_text(json.dumps(prompts))
        args = [checkpoint, work / "prompts.json", work / "logits.safetensors", threads]
        peer = run_worker(str(WORKER), args, threads, python=str(peer_python(LLMCOMPRESSOR)))
        theirs = load_file(work / "logits.safetensors")
        theirs = [theirs[f"logits_{i}"] for i in range(len(prompts))]
        result = compare_logits(quantkit_logits(checkpoint, prompts), theirs)
        # For scale: how far quantization itself moved the logits from the fp16 model's.
        result["vs_fp16"] = compare_logits(quantkit_logits(path, prompts), theirs)
    result |= {"checkpoint": str(checkpoint), "quantize_wall_s": quantized["wall_s"], "peer": peer,
               "prompts": len(prompts), "tokens": sum(map(len, prompts))}
    _print(console, result, num_samples, max_seq_len)
    return result


@torch.inference_mode()
def quantkit_logits(checkpoint: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    from quantkit.models import load_model

    model = load_model(checkpoint, dtype=torch.float32)
    return [model(input_ids=torch.tensor([ids])).logits[0].float() for ids in prompts]


def compare_logits(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> dict:
    """Largest absolute difference over every position and vocabulary entry, that difference relative to the
    largest logit, and the share of positions whose argmax agrees."""
    ours_all, theirs_all = torch.cat(ours), torch.cat(theirs)
    max_abs = (ours_all - theirs_all).abs().max().item()
    agree = (ours_all.argmax(-1) == theirs_all.argmax(-1)).float().mean().item()
    return {"max_abs_diff": max_abs, "max_rel_diff": max_abs / theirs_all.abs().max().item(),
            "argmax_agreement": agree}


def _print(console, result: dict, num_samples: int, max_seq_len: int) -> None:
    from rich.table import Table

    table = Table(title=f"llm-compressor GPTQ W4A16 g64 ({num_samples} x {max_seq_len} calibration tokens): "
                        "quantkit's reading vs transformers + compressed-tensors", show_header=False)
    table.add_row("checkpoint", result["checkpoint"])
    table.add_row("prompts / positions", f"{result['prompts']} / {result['tokens']}")
    table.add_row("transformers layer class", result["peer"]["linear_class"])
    table.add_row("max |logit diff|", f"{result['max_abs_diff']:.3g} ({result['max_rel_diff']:.2e} of max |logit|)")
    table.add_row("argmax agreement", f"{result['argmax_agreement']:.2%}")
    base = result["vs_fp16"]
    table.add_row("for scale: fp16 model vs it", f"max |logit diff| {base['max_abs_diff']:.3g}, "
                                                  f"argmax agreement {base['argmax_agreement']:.2%}")
    console.print(table)
