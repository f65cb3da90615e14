"""llm-compressor worker for `quantkit bench quantize --peers`.

Runs under the llm-compressor venv's python (see quantkit/bench/peers.py), so it imports only torch,
transformers, safetensors, datasets, llmcompressor and the standard library, never quantkit.

    python peer_llmcompressor.py {gptq|gptq-asym|awq|fp8|int8} MODEL_DIR CALIB_DIR OUT_DIR THREADS

Quantizes MODEL_DIR on the calibration tokens in CALIB_DIR/samples.safetensors (`input_ids` int32 flat,
`offsets` int64 [N+1]), saves a compressed-tensors checkpoint to OUT_DIR and prints, last, one JSON line
{"wall_s", "peak_rss_mb", "dtype"}, where wall_s times oneshot alone and dtype is what it computed in.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja")


def load_samples(calib_dir: Path) -> list[list[int]]:
    from safetensors.torch import load_file

    tensors = load_file(calib_dir / "samples.safetensors")
    ids, offsets = tensors["input_ids"], tensors["offsets"].tolist()
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def calibration_dataset(samples: list[list[int]]):
    from datasets import Dataset

    # An `input_ids` column tells llm-compressor the data is tokenized already: it uses the tokens as given.
    return Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})


def weight_args(symmetric: bool) -> dict:
    return {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": 64}


def recipe(method: str) -> list:
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    if method in ("gptq", "gptq-asym"):  # W4A16 (symmetric) or W4A16_ASYM, group 64
        groups = {"group_0": {"targets": ["Linear"], "weights": weight_args(symmetric=method == "gptq")}}
        return [GPTQModifier(config_groups=groups, ignore=["lm_head"])]
    if method == "awq":  # W4A16_ASYM with group 64 instead of the preset's 128
        from llmcompressor.modifiers.transform import AWQModifier

        groups = {"group_0": {"targets": ["Linear"], "weights": weight_args(symmetric=False)}}
        # Since 0.14 AWQModifier only smooths; a quantization modifier after it does the quantizing.
        return [AWQModifier(), QuantizationModifier(config_groups=groups, ignore=["lm_head"])]
    if method == "fp8":  # FP8_DYNAMIC preset: per-channel fp8 weights, per-token dynamic activations
        return [QuantizationModifier(targets=["Linear"], scheme="FP8_DYNAMIC", ignore=["lm_head"])]
    if method == "int8":  # W8A8 preset after SmoothQuant at strength 0.8, as llm-compressor's int8 example does
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        return [SmoothQuantModifier(smoothing_strength=0.8),
                GPTQModifier(targets=["Linear"], scheme="W8A8", ignore=["lm_head"])]
    raise SystemExit(f"unknown method {method!r}; expected gptq, gptq-asym, awq, fp8 or int8")


def allow_cpu_only_awq() -> None:
    # AWQ pins cached activations for faster host-to-GPU copies; on CPU-only torch pinning raises
    # "Cannot access accelerator device when none is available". Pinning buys nothing here: skip it.
    if not torch.accelerator.is_available():
        from llmcompressor.pipelines.cache import IntermediatesCache

        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None


def compute_dtype() -> torch.dtype:
    """The peer's fastest dtype here: bfloat16 where the CPU multiplies it natively (AMX, AVX-512 BF16; on a Xeon
    with AMX its GPTQ took 298 s in bfloat16 against 460 s in float32 at 128 x 512, +24.6% against +25.4%),
    float32 elsewhere (no native bfloat16 or fp16 GEMM on AVX2: fp16 ran ~7x slower than float32)."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    native = any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    return torch.bfloat16 if native else torch.float32


def main(method: str, model_dir: Path, calib_dir: Path, out_dir: Path, threads: int) -> None:
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    allow_cpu_only_awq()
    samples = load_samples(calib_dir)
    dtype = compute_dtype()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    start = time.perf_counter()
    oneshot(model=model, dataset=calibration_dataset(samples), recipe=recipe(method),
            num_calibration_samples=len(samples), max_seq_length=max(map(len, samples)),
            shuffle_calibration_samples=False)
    wall_s = time.perf_counter() - start
    # Store fp16 like the source model (and quantkit): packed ints are unchanged, since the fake-quantized
    # weights are exact multiples of their scales and fp16 rounding moves w/scale by far less than 0.5.
    model.to(torch.float16)
    model.save_pretrained(out_dir, save_compressed=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out_dir / name)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # ru_maxrss is KiB on Linux
    print(json.dumps({"wall_s": round(wall_s, 2), "peak_rss_mb": round(peak_rss_mb, 1),
                      "dtype": str(dtype).removeprefix("torch.")}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
