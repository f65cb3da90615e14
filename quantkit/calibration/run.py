"""`quantkit calibrate`: samples -> layer-by-layer activation statistics -> an output directory.

Output directory layout:
    samples.safetensors   input_ids (int32, all samples back to back) and offsets (int64, N + 1)
    stats.safetensors     <linear>.input_absmax / .input_mean_abs per input channel,
                          model.layers.<i>.self_attn.k_absmax / v_absmax per KV head (keys after RoPE)
    coverage.json/.md, coverage_lengths.png   when --traffic is given
    manifest.json         what made this directory (model, dataset hash, samples, versions, timings)
"""

from __future__ import annotations

import json
import platform
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from quantkit import __version__
from quantkit.architectures import architecture_of
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.calibration.observers import LayerObserver
from quantkit.data import coverage
from quantkit.data.auto_mix import AutoResult, auto_samples, is_auto
from quantkit.data.readers import dataset_hash, read_records
from quantkit.data.samples import SampleSet, draw_samples, tokenize
from quantkit.errors import QuantkitError
from quantkit.models import head_dim, load_config, load_tokenizer, resolve_model
from quantkit.outdir import atomic_output_dir, check_output_dir

DEFAULT_MAX_SEQ_LEN = 512
LayerCallback = Callable[[int, int], None]  # (layers done, total layers)


@dataclass
class CalibrateOptions:
    model: str
    dataset: str
    out: Path
    traffic: str | None = None
    num_samples: int = 128
    max_seq_len: int | None = None  # None: DEFAULT_MAX_SEQ_LEN, or the model's limit when that is smaller
    seed: int = 0
    stratify: bool = True
    pack: bool = False
    overwrite: bool = False


@dataclass
class CalibrateResult:
    out: Path
    samples: SampleSet
    manifest: dict
    coverage: coverage.CoverageReport | None = None
    warnings: list[str] = field(default_factory=list)
    auto: AutoResult | None = None  # with --dataset auto: the chosen mix and coverage before and after


def calibrate(opts: CalibrateOptions, on_layer: LayerCallback | None = None) -> CalibrateResult:
    started = time.perf_counter()
    if opts.num_samples < 1 or (opts.max_seq_len is not None and opts.max_seq_len < 1):
        raise QuantkitError("--num-samples and --max-seq-len must be at least 1")
    check_output_dir(opts.out, opts.overwrite)
    model_path = resolve_model(opts.model)
    config = load_config(model_path)
    if opts.max_seq_len is None:
        opts = replace(opts, max_seq_len=min(DEFAULT_MAX_SEQ_LEN, config.max_position_embeddings))
    elif opts.max_seq_len > config.max_position_embeddings:
        raise QuantkitError(
            f"--max-seq-len {opts.max_seq_len} is beyond the model's limit of {config.max_position_embeddings} tokens",
            hint=f"use at most {config.max_position_embeddings}",
        )
    if is_auto(opts.dataset) and (not opts.traffic or opts.pack):
        raise QuantkitError(f"--dataset {opts.dataset} matches the calibration mix to traffic: it needs --traffic "
                            "and draws whole records (no --pack)")
    traffic = read_records(opts.traffic) if opts.traffic else None
    tokenizer = load_tokenizer(model_path)
    traffic_ids = tokenize(traffic, tokenizer) if traffic is not None else None
    auto = None
    if is_auto(opts.dataset):
        auto = auto_samples(opts.dataset, traffic, traffic_ids, tokenizer, opts.num_samples, opts.max_seq_len,
                            seed=opts.seed, stratify=opts.stratify)
        samples = auto.samples
    else:
        samples = draw_samples(read_records(opts.dataset), tokenizer, opts.num_samples, opts.max_seq_len,
                               seed=opts.seed, stratify=opts.stratify, pack=opts.pack)
    report = None
    if traffic is not None:
        report = coverage.compare(samples.records, samples.input_ids, traffic, traffic_ids)

    with atomic_output_dir(opts.out, opts.overwrite) as staging:
        stats = collect_statistics(LayerwiseModel(model_path), samples.input_ids, on_layer)
        save_file(stats, staging / "stats.safetensors", metadata={"num_tokens": str(samples.num_tokens)})
        save_samples(samples.input_ids, staging / "samples.safetensors")
        if report is not None:
            coverage.write_report(report, samples.input_ids, traffic_ids, staging)
        manifest = _manifest(opts, model_path, samples, report, time.perf_counter() - started, auto)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    return CalibrateResult(out=opts.out, samples=samples, manifest=manifest, coverage=report,
                           warnings=auto.mix.warnings if auto else [], auto=auto)


def collect_statistics(model: LayerwiseModel, input_ids: list[list[int]],
                       on_layer: LayerCallback | None = None) -> dict[str, torch.Tensor]:
    """Run every sample through one decoder layer at a time, hooking its linears and K/V projections.

    Samples run one by one (no padding, so no padding mask is needed); each layer's outputs are the
    next layer's inputs, so only one layer's weights and one set of activations live at a time."""
    config = model.config
    architecture = architecture_of(config.to_dict())
    hidden = model.embed(input_ids)
    rotary_tables = {}  # by the layers' rotary kind (LayerwiseModel.rotary_kind)
    stats: dict[str, torch.Tensor] = {}
    for index in range(model.num_layers):
        kind = model.rotary_kind(index)
        if kind not in rotary_tables:
            rotary_tables[kind] = [model.position_embeddings(h, index) for h in hidden]
        rotary = rotary_tables[kind]
        with model.layer(index) as layer:
            observer = LayerObserver(layer, f"model.layers.{index}", config.num_key_value_heads, head_dim(config),
                                     qk_norm=architecture.qk_norm)
            try:
                for j, h in enumerate(hidden):
                    observer.set_rotary(*rotary[j])
                    hidden[j] = model.run_layer(layer, h, rotary[j], architecture.layer_window(config.to_dict(), index))
            finally:
                observer.remove()
        stats.update(observer.tensors())
        if on_layer:
            on_layer(index + 1, model.num_layers)
    return stats


def save_samples(input_ids: list[list[int]], path: Path) -> None:
    """Token sequences back to back (int32) with their offsets (int64, N + 1); read by load_samples."""
    lengths = torch.tensor([len(ids) for ids in input_ids], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    flat = torch.tensor([t for ids in input_ids for t in ids], dtype=torch.int32)
    save_file({"input_ids": flat, "offsets": offsets}, path)


def load_samples(calib_dir: Path) -> list[list[int]]:
    """Read back the token sequences a calibrate run used."""
    from safetensors.torch import load_file

    packed = load_file(calib_dir / "samples.safetensors")
    flat, offsets = packed["input_ids"].tolist(), packed["offsets"].tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _mix_manifest(auto: AutoResult) -> dict:
    mix = auto.mix
    return {"samples": mix.counts, "predicted": mix.score.as_dict(),
            "best_single": {"set": mix.best_single, "predicted": mix.best_single_score.as_dict()},
            "coverage": {name: {"ks_length": round(r.ks_length, 4), "jsd_unigram": round(r.jsd_unigram, 4),
                                "calib_langs": r.calib_langs, "warnings": r.warnings}
                         for name, r in auto.coverage.items()},
            "warnings": mix.warnings}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _manifest(opts: CalibrateOptions, model_path: Path, samples: SampleSet,
              report: coverage.CoverageReport | None, seconds: float, auto: AutoResult | None = None) -> dict:
    import transformers

    mix = auto.mix if auto else None
    return {
        "kind": "quantkit-calibration",
        "model": {"ref": opts.model, "path": str(model_path)},
        "dataset": {"ref": opts.dataset, "records": samples.num_available,
                    # auto: the hash of the sets that were drawn from, in the mix's order
                    "sha256": dataset_hash(",".join(n for n, c in mix.counts.items() if c) if mix else opts.dataset)},
        "mix": _mix_manifest(auto) if auto else None,
        "traffic": {"ref": opts.traffic, "sha256": dataset_hash(opts.traffic)} if opts.traffic else None,
        "samples": {
            "count": len(samples.input_ids), "tokens": samples.num_tokens, "max_seq_len": opts.max_seq_len,
            "seed": opts.seed, "stratified": opts.stratify, "packed": opts.pack, "truncated": samples.num_truncated,
            "tokens_truncated": samples.tokens_truncated, "strata": samples.strata,
            "sources": [r.where for r in samples.records],
        },
        "coverage": {"poor_match": report.poor_match, "warnings": report.warnings} if report else None,
        "versions": {"quantkit": __version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
        "wall_seconds": round(seconds, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
