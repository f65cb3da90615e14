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
from rich.table import Table

from quantkit.bench.commands import bench_app
from quantkit.console import console, err_console
from quantkit.errors import QuantkitError

app = typer.Typer(help="Calibrate, quantize, evaluate and serve quantized language models.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
models_app = typer.Typer(help="Known and cached models.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")



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
    dataset: str = typer.Option(..., help="Shipped set name (e.g. coqa_chat_en) or a jsonl/json/csv/parquet/txt "
                                          "file or a `datasets` directory; or auto[:SET,FILE,...] to draw the mix "
                                          "of those candidates (default: every shipped set) that matches --traffic."),
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
    if result.auto is not None:
        _print_auto_mix(result.auto)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    report = result.coverage
    if report is None:
        console.print("No --traffic given: coverage not checked.")
        return
    verdict = "[bold red]POOR MATCH[/]" if report.poor_match else "[bold green]good match[/]"
    console.print(f"Coverage vs traffic: {verdict}  KS(lengths) {report.ks_length:.2f}, "
                  f"unigram JSD {report.jsd_unigram:.2f} bits; report in {result.out / 'coverage.md'}")
    for warning in report.warnings:
        err_console.print(f"[yellow]warning:[/] calibration set {warning}", highlight=False)


def _print_auto_mix(auto) -> None:
    """The chosen mix, then coverage of the traffic before (pooled candidates, best single set) and after."""
    mix = auto.mix
    chosen = ", ".join(f"{name} {count}" for name, count in mix.counts.items() if count)
    console.print(f"Mix matched to traffic: {chosen} samples", highlight=False, soft_wrap=True)
    table = Table(title="Coverage of the traffic (drawn samples)")
    for column in ("calibration", "KS lengths", "unigram JSD", "languages", "warnings"):
        table.add_column(column)
    for name, report in auto.coverage.items():
        langs = ", ".join(f"{lang} {share:.0%}" for lang, share in report.calib_langs.items())
        table.add_row(name, f"{report.ks_length:.3f}", f"{report.jsd_unigram:.3f}", langs, str(len(report.warnings)))
    console.print(table)


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
    max_shard_mb: int = typer.Option(1024, min=1, help="Largest safetensors file; bigger checkpoints are sharded "
                                                       "with an index. Also bounds what the writer holds in memory."),
    offload_activations: Optional[Path] = typer.Option(
        None, help="Keep calibration activations in files under this directory instead of in memory "
                   "(for models whose activations outgrow RAM; removed afterwards)."),
) -> None:
    """Apply a recipe (INT4 RTN / AWQ / GPTQ, FP8 W8A8, FP8 KV-cache scales) layer by layer; write a checkpoint."""
    from quantkit.quantize.run import QuantizeOptions
    from quantkit.quantize.run import quantize as run_quantize

    opts = QuantizeOptions(model=model, recipe=recipe, out=out, calib=calib, dataset=dataset,
                           num_samples=num_samples, max_seq_len=max_seq_len, seed=seed, pack=pack, format=format,
                           overwrite=overwrite, max_shard_bytes=max_shard_mb * 1024**2,
                           offload_dir=offload_activations)
    with _layer_progress("quantizing") as on_layer:
        result = run_quantize(opts, on_layer=on_layer)
    _print_quantize_summary(result)


def _print_quantize_summary(result) -> None:
    """One row per decoder layer: where the error is. Per-linear numbers are in quantkit.json."""
    recipe = result.provenance["recipe"]
    table = Table(title=f"{recipe} -> {result.out} (relative output error on the calibration tokens)")
    for column in ("layer", "method", "weights", "RTN error", "method error", "worst linear"):
        table.add_column(column)
    by_layer: dict[str, list] = {}
    for report in result.reports:
        by_layer.setdefault(report.name.rsplit(".", 2)[0], []).append(report)
    for layer, reports in by_layer.items():
        measured = [r for r in reports if r.error is not None]
        worst = max(measured, key=lambda r: r.error, default=None)
        error_rtn = _mean(r.error_rtn for r in measured if r.error_rtn is not None)
        table.add_row(layer, reports[0].method, result.weights,
                      _percent(error_rtn), _percent(_mean(r.error for r in measured)),
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
    suite: Optional[str] = typer.Option(None, help="Shipped suite name (default, quick) or a suite YAML path."),
    gate: Optional[str] = typer.Option(None, help="Shipped gate name (default, quick) or a gate YAML path."),
    quick: bool = typer.Option(False, help="The quick suite and its gate (a smoke check; ship on the default)."),
    device: str = typer.Option("cpu", help="torch device for both models."),
    batch_size: int = typer.Option(8, help="lm-eval batch size."),
    task_dtype: str = typer.Option("auto", help="Task scoring dtype for both models: auto (bfloat16 where the CPU "
                                                "multiplies it natively, else float32), float32 or bfloat16."),
    engine: str = typer.Option("transformers", help="Task scoring: transformers (HFLM, dequantized weights) or "
                                                    "runtime (quantkit.runtime's kernels, as served)."),
    limit: Optional[int] = typer.Option(None, help="At most N sequences per dataset, samples and task items."),
    cache: bool = typer.Option(True, help="Reuse the baseline's cached results for this model and suite."),
    overwrite: bool = typer.Option(False, help="Replace --report if it exists."),
) -> None:
    """Measure a candidate against its baseline (tokens, layers, tasks); exit 1 when any gate fails."""
    from quantkit.eval.report import task_lines, table_rows
    from quantkit.eval.run import EvalOptions, run_eval

    preset = "quick" if quick else "default"
    opts = EvalOptions(baseline=baseline, candidate=candidate, report=report, suite=suite or preset,
                       gates=gate or preset, device=device, batch_size=batch_size, task_dtype=task_dtype,
                       engine=engine, limit=limit, use_cache=cache, overwrite=overwrite)
    with _phase_progress() as on_phase:
        result = run_eval(opts, on_phase)
    table = Table(title=f"{candidate} vs {baseline} (sample sizes in {report / 'report.md'})")
    for column in ("metric", "scope", "baseline", "candidate", "delta", "CI", "gate", "result"):
        table.add_column(column, no_wrap=column != "metric")
    for row in table_rows(result, per_dataset=("perplexity_increase_pct",)):
        table.add_row(*row[:6], *row[7:], style="red" if row[-1] == "FAIL" else None)
    console.print(table, width=max(console.width, 150))  # CI logs are 80 wide: keep every column readable
    for line in task_lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    failed = [g for g in result.gates if not g.passed]
    console.print(f"{result.header['sample_sizes']}; baseline {'cached' if result.header['baseline_cached'] else 'measured'}; "
                  f"{result.header['wall_seconds']:.0f} s. Report in {report}", highlight=False, soft_wrap=True)
    if failed:
        from rich.markup import escape

        # escaped: rich would read "[customer_service_zh:eval]" as a style tag and drop it
        console.print(f"[bold red]FAIL[/]: {escape(', '.join(f'{g.metric}[{g.scope}]' for g in failed))}")
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


if __name__ == "__main__":
    main()
