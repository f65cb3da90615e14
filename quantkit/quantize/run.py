"""`quantkit quantize`: recipe + model + calibration samples -> a checkpoint directory, written atomically."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quantkit import __version__
from quantkit.architectures import architecture_of
from quantkit.calibration.run import DEFAULT_MAX_SEQ_LEN, load_samples, peak_rss_mb
from quantkit.data.auto_mix import is_auto
from quantkit.data.readers import dataset_hash, read_records
from quantkit.data.samples import draw_samples
from quantkit.errors import QuantkitError
from quantkit.formats.common import DEFAULT_MAX_SHARD_BYTES
from quantkit.models import load_config, load_tokenizer, resolve_model, stored_dtype
from quantkit.outdir import atomic_output_dir, check_output_dir
from quantkit.quantize.activations import (activation_bytes, activation_store, check_offload_dir,
                                          warn_if_activations_outgrow_memory)
from quantkit.quantize.checkpoint import CheckpointWriter, check_format
from quantkit.quantize.methods import LinearReport
from quantkit.quantize.pipeline import LayerCallback, check_group_size, quantize_model, reference_picks
from quantkit.recipes import Recipe, load_recipe


@dataclass
class QuantizeOptions:
    model: str
    recipe: str
    out: Path
    calib: Path | None = None
    dataset: str | None = None
    num_samples: int = 128
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    seed: int = 0
    pack: bool = False
    format: str = "compressed-tensors"
    overwrite: bool = False
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    offload_dir: Path | None = None  # keep calibration activations in files here instead of memory


@dataclass
class QuantizeResult:
    out: Path
    provenance: dict
    reports: list[LinearReport]
    weights: str  # the recipe's weight scheme, e.g. "int4 g64 asym"
    warnings: list[str] = field(default_factory=list)


def quantize(opts: QuantizeOptions, on_layer: LayerCallback | None = None) -> QuantizeResult:
    started = time.perf_counter()
    if opts.calib and opts.dataset:
        raise QuantkitError("pass either --calib or --dataset, not both")
    if opts.dataset and is_auto(opts.dataset):  # the mix is chosen against traffic, which calibrate reads
        raise QuantkitError(f"--dataset {opts.dataset} is a calibrate option",
                            hint="run quantkit calibrate --dataset auto --traffic FILE --out DIR, then quantize "
                                 "--calib DIR")
    recipe = load_recipe(opts.recipe)
    checkpoint_format = check_format(recipe, opts.format)
    check_output_dir(opts.out, opts.overwrite)
    check_offload_dir(opts.offload_dir)
    model_path = resolve_model(opts.model)
    config = load_config(model_path)  # refuses unsupported architectures before any work
    refusal = recipe.method_class.check_architecture(recipe.quantization, architecture_of(config.to_dict()))
    if refusal:
        raise QuantkitError(f"recipe {recipe.name} on {model_path}: {refusal}")
    check_group_size(model_path, recipe)
    samples, calib_info = None, None
    if recipe.needs_calibration:
        samples, calib_info = _calibration_samples(opts, model_path)
    if samples:
        picks = reference_picks(recipe, len(samples)) or []
        needed = activation_bytes(config.hidden_size, config.intermediate_size, sum(map(len, samples)),
                                  reference_tokens=sum(len(samples[i]) for i in picks))
        warn_if_activations_outgrow_memory(needed, offloaded=opts.offload_dir is not None)
    with atomic_output_dir(opts.out, opts.overwrite) as staging, activation_store(opts.offload_dir) as activations:
        # AutoAWQ and GPTQ kernels read fp16 scales: quantize against fp16-rounded scales for them.
        scale_dtype = torch.float16 if checkpoint_format.fp16_scales else None
        writer = CheckpointWriter(recipe, opts.format, model_path, staging, config.to_dict(),
                                  stored_dtype(model_path), opts.max_shard_bytes)
        summary = quantize_model(model_path, recipe, samples, writer.add, on_layer, scale_dtype=scale_dtype,
                                 activations=activations)
        provenance = {
            "kind": "quantkit-checkpoint", "format": opts.format,
            "model": {"ref": opts.model, "path": str(model_path)},
            "recipe": recipe.name, "calibration": calib_info,
            "versions": {"quantkit": __version__, "torch": torch.__version__, "python": platform.python_version()},
            "compute": _compute_dtypes(recipe),
            "wall_seconds": round(time.perf_counter() - started, 2), "peak_rss_mb": round(peak_rss_mb(), 1),
            "layers": [r.__dict__ for r in summary.reports],
        }
        if summary.routed_tokens:
            provenance["routed_tokens"] = summary.routed_tokens
        warnings = summary.warnings + writer.finish(summary.ignored, provenance)
    return QuantizeResult(out=opts.out, provenance=provenance, reports=summary.reports,
                          weights=recipe.weights_label, warnings=warnings)


def _compute_dtypes(recipe: Recipe) -> dict:
    """What the recipe's "auto" choices resolved to on this machine: the same recipe may give other bytes elsewhere."""
    dtypes = recipe.method_class.compute_dtypes(recipe.quantization)
    return {use: str(dtype).removeprefix("torch.") for use, dtype in dtypes.items()}


def _calibration_samples(opts: QuantizeOptions, model_path: Path) -> tuple[list[list[int]], dict]:
    if opts.calib:
        manifest_path = opts.calib / "manifest.json"
        if not manifest_path.is_file():
            raise QuantkitError(f"{opts.calib} is not a quantkit calibrate output (no manifest.json)")
        manifest = json.loads(manifest_path.read_text())
        samples = load_samples(opts.calib)
        return samples, {"calib_dir": str(opts.calib), "dataset": manifest["dataset"],
                         "samples": len(samples), "tokens": sum(map(len, samples))}
    if not opts.dataset:
        raise QuantkitError("this recipe needs calibration data", hint="pass --calib DIR or --dataset SET")
    records = read_records(opts.dataset)
    picked = draw_samples(records, load_tokenizer(model_path), opts.num_samples, opts.max_seq_len,
                          seed=opts.seed, pack=opts.pack)
    dataset = {"ref": opts.dataset, "sha256": dataset_hash(opts.dataset), "records": len(records)}
    return picked.input_ids, {"dataset": dataset, "samples": len(picked.input_ids), "tokens": picked.num_tokens,
                              "truncated": picked.num_truncated, "seed": opts.seed,
                              "packed": opts.pack}
