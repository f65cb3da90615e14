"""`quantkit bench quantize`: every method on the same calibration tokens, in one run: wall time, peak
RSS (each quantization in its own process, threads pinned) and perplexity on held-out text relative to
the fp16 model, all measured in the same run. With --peers, llm-compressor runs the same methods (GPTQ in
the recipe's symmetry, AWQ, FP8 dynamic) on the same tokens. With --seeds, all of it once per calibration
draw, and each method's mean and range over the draws.

Run a worker directly: python -m quantkit.bench.quantize quantize MODEL RECIPE CALIB_DIR OUT THREADS
                       python -m quantkit.bench.quantize perplexity EVAL_TOKENS THREADS MODEL_DIR...
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from quantkit.bench.workers import run_worker

DEFAULT_RECIPES = ("rtn-w4a16-g64", "awq-w4a16-g64", "gptq-w4a16-g64", "gptq-w4a16-g64-actorder",
                   "gptq-w4a16-g64-fp-targets")
DEFAULT_EVAL = "pile_style_en:eval"  # general English, not in any calibration set
WORKER = "quantkit.bench.quantize"
DELTA_KEYS = ("delta", "delta_low", "delta_high")


def run_bench(model: str, calib_dataset: str, eval_datasets: list[str], num_samples: int, max_seq_len: int,
              threads: int, recipes: list[str], peers: bool, console, keep: Path | None = None,
              seeds: list[int] | None = None) -> list[dict]:
    """One row per method and calibration seed. Several seeds draw several calibration sets: GPTQ's
    result moves by about a point between equally valid runs (docs/quantization.md, "Run-to-run band"),
    so variants are told apart by their spread over draws, not by one run.

    Each held-out set in ``eval_datasets`` gets its own perplexity and delta (``row["evals"][set]``); the
    first is the headline (``row["delta"]``), the others check the same checkpoints on other text (general
    English and the business sets' own held-out splits have ranked variants differently)."""
    from quantkit.bench.peers import METHODS as PEER_METHODS
    from quantkit.bench.peers import run_llmcompressor
    from quantkit.eval.stats import perplexity_increase_pct
    from quantkit.models import resolve_model
    from quantkit.recipes import load_recipe

    path = resolve_model(model)
    seeds = seeds or [0]
    # The peer runs each method the chosen recipes use, on the same tokens and in the same scheme.
    compared_as = {r: peer_method(load_recipe(r)) for r in recipes}
    peer_methods = [m for m in PEER_METHODS if m in compared_as.values()] if peers else []
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        eval_files = {name: _write_eval_tokens(path, name, max_seq_len, work / f"eval-{i}.safetensors")
                      for i, name in enumerate(eval_datasets)}
        rows = []
        for seed in seeds:
            suffix = f"-seed{seed}" if len(seeds) > 1 else ""
            calib_dir = _write_calibration(path, calib_dataset, num_samples, max_seq_len, work / f"calib{suffix}", seed)
            for recipe in recipes:
                out = work / f"{Path(recipe).stem}{suffix}"  # a recipe may be a YAML path
                row = run_worker(WORKER, ["quantize", path, recipe, calib_dir, out, threads], threads)
                rows.append(row | {"name": f"quantkit {recipe}", "path": str(out), "seed": seed,
                                   "method": compared_as[recipe]})
            for method in peer_methods:
                row = run_llmcompressor(method, path, calib_dir, work / f"llmcompressor-{method}{suffix}", threads)
                rows.append(row | {"name": f"llm-compressor {method} ({row['dtype']})", "seed": seed})
        models = [str(path), *[r["path"] for r in rows]]
        ppl = {name: run_worker(WORKER, ["perplexity", file, threads, *models], threads)
               for name, file in eval_files.items()}
    baselines = {name: results[str(path)]["perplexity"] for name, results in ppl.items()}
    for row in rows:
        row["evals"] = {}
        for name, results in ppl.items():
            # the 95% interval of a paired bootstrap over the evaluation chunks
            base = results[str(path)]
            increase = perplexity_increase_pct(base["nll"], results[row["path"]]["nll"], base["counts"])
            deltas = (increase.value / 100, increase.low / 100, increase.high / 100)
            row["evals"][name] = {"perplexity": results[row["path"]]["perplexity"], **dict(zip(DELTA_KEYS, deltas))}
        row.update(row["evals"][eval_datasets[0]])  # the headline set's, at the top level
    add_peer_time_ratios(rows)
    _print(console, model, calib_dataset, num_samples, max_seq_len, threads, baselines, rows, seeds)
    return rows


def peer_method(recipe) -> str:
    """The peer method a recipe is compared with: its method, with GPTQ's symmetry (the W4A16 preset is
    symmetric; an asymmetric recipe is compared with W4A16_ASYM)."""
    method = recipe.quantization.method
    if method == "gptq" and not recipe.weights.symmetric:
        return "gptq-asym"
    if method in ("fp8", "int8") and recipe.quantization.activations == "static":
        return f"{method}-static"  # the peer runs the dynamic presets only: no row to compare with
    return method


def add_peer_time_ratios(rows: list[dict]) -> None:
    """Each quantkit row's wall time over the peer's for the same method on the same calibration draw
    (``peer_time_ratio``), where the peer ran that method: the issue's speed goals are such ratios."""
    peer_wall = {(r["method"], r["seed"]): r["wall_s"] for r in rows if "peer" in r}
    for row in rows:
        peer = peer_wall.get((row["method"], row["seed"])) if "peer" not in row else None
        if peer:
            row["peer_time_ratio"] = row["wall_s"] / peer


def summarize_over_seeds(rows: list[dict]) -> list[dict]:
    """Per method (in first-seen order): the seeds it ran on, its mean wall time, and the mean, lowest and
    highest of its perplexity delta over them, on each held-out set (``evals``) and on the headline set."""
    by_name: dict[str, list[dict]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    summary = []
    for name, runs in by_name.items():
        evals = {eval_set: _spread([r["evals"][eval_set]["delta"] for r in runs]) for eval_set in runs[0]["evals"]}
        summary.append({"name": name, "seeds": [r["seed"] for r in runs], **_spread([r["delta"] for r in runs]),
                        "evals": evals, "wall_s_mean": sum(r["wall_s"] for r in runs) / len(runs)})
    return summary


def _spread(deltas: list[float]) -> dict:
    return {"delta_mean": sum(deltas) / len(deltas), "delta_min": min(deltas), "delta_max": max(deltas)}


def _write_calibration(model_path: Path, dataset: str, num_samples: int, max_seq_len: int, out: Path,
                       seed: int = 0) -> Path:
    """A calibrate-style directory holding only the samples, so every method (and peer) reads the same tokens."""
    from quantkit.calibration.run import save_samples
    from quantkit.data.readers import dataset_hash, read_records
    from quantkit.data.samples import draw_samples
    from quantkit.models import load_tokenizer

    samples = draw_samples(read_records(dataset), load_tokenizer(model_path), num_samples, max_seq_len, seed=seed,
                           pack=True)
    out.mkdir(parents=True, exist_ok=True)
    save_samples(samples.input_ids, out / "samples.safetensors")
    manifest = {"dataset": {"ref": dataset, "sha256": dataset_hash(dataset)}, "samples": len(samples.input_ids),
                "seed": seed}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _write_eval_tokens(model_path: Path, dataset: str, chunk: int, out: Path) -> Path:
    from safetensors.torch import save_file

    from quantkit.eval.perplexity import held_out_chunks

    save_file({"input_ids": torch.tensor(held_out_chunks(model_path, dataset, chunk), dtype=torch.int64)}, out)
    return out


def _print(console, model, calib, n, length, threads, baselines: dict[str, float], rows, seeds) -> None:
    """The rows, a perplexity and a delta column per held-out set; with several seeds, each method's spread."""
    from rich.table import Table

    several = len(seeds) > 1
    ratios = any("peer_time_ratio" in row for row in rows)
    eval_sets = list(baselines)
    # with one held-out set the title names it; with several each column does
    label = (lambda name: "") if len(eval_sets) == 1 else (lambda name: f"{name}: ")
    table = Table(title=f"{model}: calibration {calib} ({n} x {length} tokens), perplexity on "
                        f"{', '.join(eval_sets)}, {threads} thread(s)")
    for column in ("method", *(["seed"] if several else []), "wall s", "peak RSS MB",
                   *[f"{label(e)}{c}" for e in eval_sets for c in ("perplexity", "vs fp16 [95% interval]")],
                   *(["x peer's time"] if ratios else [])):
        table.add_column(column)
    table.add_row("fp16 baseline", *(["-"] if several else []), "-", "-",
                  *[x for e in eval_sets for x in (f"{baselines[e]:.3f}", "1.00x")], *(["-"] if ratios else []))
    for row in rows:
        ratio = f"{row['peer_time_ratio']:.2f}x" if "peer_time_ratio" in row else "-"
        cells = [x for e in eval_sets for x in _delta_cells(row["evals"][e])]
        table.add_row(row["name"], *([str(row["seed"])] if several else []), f"{row['wall_s']:.1f}",
                      f"{row['peak_rss_mb']:.0f}", *cells, *([ratio] if ratios else []))
    console.print(table)
    report = {"baseline_perplexity": baselines[eval_sets[0]], "baselines": baselines, "rows": rows}
    if several:
        summary = summarize_over_seeds(rows)
        table = Table(title=f"over calibration seeds {', '.join(map(str, seeds))}")
        for column in ("method", *[f"{label(e)}{c}" for e in eval_sets for c in ("vs fp16 mean", "lowest", "highest")],
                       "mean wall s"):
            table.add_column(column)
        for item in summary:
            spreads = [item["evals"][e] for e in eval_sets]
            cells = [f"{spread[key]:+.1%}" for spread in spreads for key in ("delta_mean", "delta_min", "delta_max")]
            table.add_row(item["name"], *cells, f"{item['wall_s_mean']:.1f}")
        console.print(table)
        report["over_seeds"] = summary
    console.print(json.dumps(report))


def _delta_cells(result: dict) -> tuple[str, str]:
    return (f"{result['perplexity']:.3f}",
            f"{result['delta']:+.1%} [{result['delta_low']:+.1%}, {result['delta_high']:+.1%}]")


def _quantize_worker(model_dir: str, recipe: str, calib_dir: str, out: str, threads: int) -> dict:
    from quantkit.algorithms import native
    from quantkit.calibration.run import peak_rss_mb
    from quantkit.quantize.run import QuantizeOptions, quantize

    torch.set_num_threads(threads)
    native.module()  # a fresh machine builds GPTQ's native loops once (~45 s): not part of any method's time
    started = time.perf_counter()
    quantize(QuantizeOptions(model=model_dir, recipe=recipe, calib=Path(calib_dir), out=Path(out), overwrite=True))
    return {"wall_s": round(time.perf_counter() - started, 1), "peak_rss_mb": round(peak_rss_mb(), 1)}


def _perplexity_worker(eval_file: str, threads: int, model_dirs: list[str]) -> dict:
    """Per model: perplexity, and each chunk's NLL sum and token count (for paired intervals)."""
    import math

    from safetensors.torch import load_file

    from quantkit.eval.perplexity import sequence_nll
    from quantkit.models import load_model

    torch.set_num_threads(threads)
    chunks = load_file(eval_file)["input_ids"].tolist()
    results = {}
    for model_dir in model_dirs:
        nll, counts = sequence_nll(load_model(Path(model_dir)), chunks)
        results[model_dir] = {"perplexity": math.exp(sum(nll) / sum(counts)), "nll": nll, "counts": counts}
    return results


if __name__ == "__main__":
    if sys.argv[1] == "quantize":
        result = _quantize_worker(*sys.argv[2:6], int(sys.argv[6]))
    else:
        result = _perplexity_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    print(json.dumps(result))
