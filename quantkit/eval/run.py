"""`quantkit eval`: measure a candidate against its baseline with a suite, apply gates, write the report.

The baseline's side (top-k log-probs, layer tensors, per-item task scores) is computed once per
(model hash, suite hash) and cached; the candidate is always measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from quantkit.compute_dtype import resolve_compute_dtype
from quantkit.errors import QuantkitError
from quantkit.eval import baseline_cache, layer_metrics, lm_tasks, task_metrics, token_metrics
from quantkit.eval.baseline_cache import BaselineResults
from quantkit.eval.gates import POOLED, evaluate_gates
from quantkit.eval.report import EvalResult, write_report
from quantkit.eval.power import check_task_margin
from quantkit.eval.suite import Gates, Suite, load_gates, load_suite, suite_hash, task_configs
from quantkit.outdir import atomic_output_dir, check_output_dir

# The runtime engine's KV budget when it scores tasks: 64 sequences of a few hundred tokens, far below the
# engine's default share of free memory, which the loaded models already use.
RUNTIME_KV_GB = 1.0
# on_phase(description, total) -> step(): advances that phase by one unit.
PhaseCallback = Callable[[str, int], Callable[[], None]]


@dataclass
class EvalOptions:
    baseline: str
    candidate: str
    report: Path
    suite: str = "default"
    gates: str = "default"
    device: str = "cpu"
    batch_size: int = 8
    # Task scoring's compute dtype: "auto" is bfloat16 where the CPU multiplies it natively (AMX, AVX-512 BF16;
    # about 4x float32 on SmolLM2), float32 elsewhere. Both models are scored in the same dtype, item by item,
    # so the paired drop compares like with like; token and layer metrics always run in float32.
    task_dtype: str = "auto"
    # Who scores the tasks: "transformers" (HFLM on the dequantized model) or "runtime" (quantkit.runtime's
    # loader, INT4/FP8 kernels and paged KV cache: the numbers the checkpoint will be served with).
    engine: str = "transformers"
    limit: int | None = None
    use_cache: bool = True
    overwrite: bool = False


@dataclass
class _Plan:
    suite: Suite
    suite_path: Path
    tasks: lm_tasks.TaskRunner
    task_dtype: torch.dtype  # resolved from EvalOptions.task_dtype
    token_sequences: dict[str, list[list[int]]] = field(default_factory=dict)
    layer_samples: list[list[int]] = field(default_factory=list)


def run_eval(opts: EvalOptions, on_phase: PhaseCallback | None = None) -> EvalResult:
    lm_tasks.go_offline()  # before anything imports datasets, transformers or lm_eval
    from quantkit.models import load_tokenizer, resolve_model

    start = time.time()
    on_phase = on_phase or (lambda description, total: lambda: None)
    suite, suite_path = load_suite(opts.suite)
    gates, gates_path = load_gates(opts.gates)
    tasks = task_configs(suite, suite_path)
    check_output_dir(opts.report, opts.overwrite)
    if opts.task_dtype not in ("auto", "float32", "bfloat16"):
        raise QuantkitError(f"--task-dtype {opts.task_dtype!r}: expected auto, float32 or bfloat16")
    if opts.engine not in ("transformers", "runtime"):
        raise QuantkitError(f"--engine {opts.engine!r}: expected transformers or runtime")
    if opts.limit is not None and opts.limit < 1:
        raise QuantkitError(f"--limit must be at least 1, not {opts.limit}")
    base_path, cand_path = resolve_model(opts.baseline), resolve_model(opts.candidate)
    tokenizer = load_tokenizer(base_path)
    check_same_tokenizer(tokenizer, cand_path, opts.candidate, opts.baseline)
    task_dtype = resolve_compute_dtype(opts.task_dtype)
    plan = _Plan(suite, suite_path, lm_tasks.TaskRunner(tasks, suite.bootstrap.seed), task_dtype)
    try:
        _prepare(plan, tokenizer, opts.limit)
        _check_task_power(plan, gates, gates_path, opts.limit)
        data_files = [f for spec in plan.tasks.specs for f in spec.sources]
        # The dtype and the thread count change the low bits of every product (bfloat16 on 1 and 2 threads
        # scores 1 of 120 arc_easy items differently): a baseline is reused only where both match.
        computed_with = f"{opts.device}/{_short(task_dtype)}/{torch.get_num_threads()} threads/{opts.engine}"
        keys = (baseline_cache.model_hash(base_path), suite_hash(suite, data_files, opts.limit, computed_with))
        cached = baseline_cache.load(*keys) if opts.use_cache else None
        baseline = cached or _measure_baseline(plan, base_path, tokenizer, opts, on_phase)
        if cached is None and opts.use_cache:
            baseline_cache.store(*keys, baseline)
        result = _compare(plan, baseline, cand_path, tokenizer, opts, on_phase)
    finally:
        plan.tasks.close()
    bootstrap = suite.bootstrap
    result.gates = evaluate_gates(gates, result.measurements)
    result.header = {
        "baseline": {"ref": opts.baseline, "path": str(base_path), "sha256": keys[0]},
        "candidate": {"ref": opts.candidate, "path": str(cand_path)},
        "suite": {"name": suite.name, "path": str(suite_path), "hash": keys[1]},
        "gates": {"name": gates.name, "path": str(gates_path)},
        "limit": opts.limit, "device": opts.device, "task_dtype": _short(task_dtype),
        "threads": torch.get_num_threads(), "engine": opts.engine,
        "baseline_cached": cached is not None,
        "confidence": bootstrap.confidence, "resamples": bootstrap.resamples, "seed": bootstrap.seed,
        "sample_sizes": _sample_sizes(plan, baseline),
        "wall_seconds": round(time.time() - start, 1),
    }
    with atomic_output_dir(opts.report, opts.overwrite) as staging:
        write_report(result, staging)
    return result


def check_same_tokenizer(tokenizer, cand_path: Path, cand_ref: str, base_ref: str) -> None:
    """Token-level comparisons need both models to read the same token ids."""
    from quantkit.models import load_tokenizer

    try:
        other = load_tokenizer(cand_path)
    except (OSError, ValueError) as exc:
        raise QuantkitError(f"candidate {cand_ref} has no readable tokenizer ({exc})",
                            hint="copy the baseline's tokenizer files into the checkpoint") from exc
    mine, theirs = tokenizer.get_vocab(), other.get_vocab()
    if mine != theirs:
        differing = len(set(mine.items()) ^ set(theirs.items()))
        raise QuantkitError(
            f"candidate {cand_ref} has a different tokenizer than baseline {base_ref} (vocabulary "
            f"{len(theirs)} vs {len(mine)} tokens, {differing} entries differ): per-token metrics need the same ids",
            hint="evaluate a checkpoint quantized from this baseline")
    if (tokenizer.bos_token, tokenizer.eos_token) != (other.bos_token, other.eos_token):
        raise QuantkitError(f"candidate {cand_ref} has different special tokens than baseline {base_ref} "
                            f"(bos/eos {other.bos_token}/{other.eos_token} vs {tokenizer.bos_token}/{tokenizer.eos_token})")


def _prepare(plan: _Plan, tokenizer, limit: int | None) -> None:
    cap = (lambda n: min(n, limit)) if limit else (lambda n: n)
    seed = plan.suite.bootstrap.seed
    if plan.suite.token_metrics:
        spec = plan.suite.token_metrics
        for dataset in spec.datasets:
            plan.token_sequences[dataset] = token_metrics.dataset_sequences(
                dataset, tokenizer, spec.max_seq_len, cap(spec.records), seed)
    if plan.suite.layer_metrics:
        spec = plan.suite.layer_metrics
        plan.layer_samples = token_metrics.dataset_sequences(spec.dataset, tokenizer, spec.max_seq_len,
                                                             cap(spec.num_samples), seed)


def _check_task_power(plan: _Plan, gates: Gates, gates_path: Path, limit: int | None) -> None:
    threshold = gates.gates.get("accuracy_drop_points")
    if threshold is None or not plan.tasks.specs:
        return
    counts = {task: len(ids) for task, ids in plan.tasks.item_ids(limit).items()}
    power, confidence = plan.suite.task_power, plan.suite.bootstrap.confidence
    check_task_margin(threshold.max, counts, power.discordance, confidence, power.power, gates_path)


def _load(path: Path, device: str):
    from quantkit.models import load_model

    try:
        return load_model(path).to(device)
    except RuntimeError as exc:
        if "device" in str(exc).lower() or "cuda" in str(exc).lower():
            raise QuantkitError(f"cannot use device '{device}': {str(exc).splitlines()[0]}") from exc
        raise


def _measure_baseline(plan: _Plan, path: Path, tokenizer, opts: EvalOptions, on_phase) -> BaselineResults:
    model = _load(path, opts.device)
    out = BaselineResults()
    for dataset, seqs in plan.token_sequences.items():
        step = on_phase(f"baseline tokens {dataset}", len(seqs))
        out.tokens[dataset] = token_metrics.baseline_pass(model, seqs, plan.suite.token_metrics.kl_top_k, step)
    if plan.layer_samples:
        out.layers = layer_metrics.baseline_pass(model, plan.layer_samples,
                                                 on_phase("baseline layers", len(plan.layer_samples)))
    if plan.tasks.specs:
        step = on_phase(f"baseline tasks ({len(plan.tasks.specs)})", 1)
        out.tasks = _score_tasks(plan, model, path, tokenizer, opts)
        step()
    return out


def _compare(plan: _Plan, baseline: BaselineResults, path: Path, tokenizer, opts: EvalOptions,
             on_phase) -> EvalResult:
    model = _load(path, opts.device)
    bootstrap = plan.suite.bootstrap
    measurements, parts = [], []
    for dataset, seqs in plan.token_sequences.items():
        step = on_phase(f"candidate tokens {dataset}", len(seqs))
        parts.append(token_metrics.candidate_pass(model, seqs, baseline.tokens[dataset], step))
        measurements += token_metrics.measurements(parts[-1], dataset, bootstrap)
    if parts:
        measurements = token_metrics.measurements(token_metrics.TokenComparison.concat(parts), POOLED,
                                                  bootstrap) + measurements
    layers = {}
    if plan.layer_samples:
        comparison = layer_metrics.candidate_pass(model, plan.layer_samples, baseline.layers,
                                                  on_phase("candidate layers", len(plan.layer_samples)))
        measurements += layer_metrics.measurements(comparison, bootstrap)
        layers = {"sqnr_db": comparison.sqnr_db().tolist(), "attention_js": comparison.attention_shift().tolist()}
    if plan.tasks.specs:
        step = on_phase(f"candidate tasks ({len(plan.tasks.specs)})", 1)
        scores = _score_tasks(plan, model, path, tokenizer, opts)
        step()
        measurements += task_metrics.measurements(baseline.tasks, scores, bootstrap, plan.suite.task_power)
    kl = np.concatenate([p.kl for p in parts]) if parts else np.zeros(0)
    return EvalResult({}, measurements, [], layers, kl)


def _score_tasks(plan: _Plan, model, path: Path, tokenizer, opts: EvalOptions) -> dict:
    if opts.engine == "runtime":
        from quantkit.eval.runtime_lm import RuntimeLM

        lm = RuntimeLM(path, dtype=_short(plan.task_dtype), device=opts.device, kv_cache_memory_gb=RUNTIME_KV_GB)
        return plan.tasks.run_lm(lm, opts.limit)
    return plan.tasks.run(model.to(plan.task_dtype), tokenizer, opts.limit, opts.batch_size)


def _short(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _sample_sizes(plan: _Plan, baseline: BaselineResults) -> str:
    parts = []
    if plan.token_sequences:
        seqs = sum(len(s) for s in plan.token_sequences.values())
        tokens = sum(len(x) - 1 for s in plan.token_sequences.values() for x in s)
        parts.append(f"tokens: {seqs} sequences, {tokens:,} predicted tokens over {len(plan.token_sequences)} datasets")
    if plan.layer_samples:
        parts.append(f"layers: {len(plan.layer_samples)} samples of up to {max(map(len, plan.layer_samples))} tokens")
    for task, scores in baseline.tasks.items():
        parts.append(f"{task}: {len(scores.scores)} items")
    return "; ".join(parts) or "nothing measured"

