"""`quantkit bench ladder`: the tuning table engineers build by hand, measured in one run on one workload.

Rows, each adding one step to the previous:
  1. transformers static batching: `generate` on fixed batches of max_num_seqs requests, left-padded;
     a batch runs until its longest request is done and the next batch waits for it.
  2. continuous batching: quantkit's engine, same batch size, prefix caching off, KV in the compute dtype.
  3. + FP8 KV cache: the same KV memory budget now holds 4x the tokens (float32 -> float8 on CPU).
  4. + prefix caching: the workload's shared system prompt is computed once.
  5. + tuned max_num_seqs: the best output throughput over a few larger batch limits.

Workload: every request arrives at t=0 and carries one shared system prompt plus its own question;
output lengths are mixed and exact (EOS ignored). The KV budget is fixed (in MiB) and small on purpose,
so the cache is the constraint, as it is when a GPU serves a model that fills most of its memory.
TTFT and TPOT are per request (mean and p99), throughput is output tokens over the row's wall time,
KV usage is the peak share of the budget in use, max concurrency the peak number of running requests.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from quantkit.bench.serve import WORDS

SYSTEM = ("You are the support assistant of Northwind Storage. Answer in two short sentences, quote the plan "
          "limits exactly, never promise refunds, and point to the status page for outages. Plans: Starter has "
          "100 GB and 5 users, Business has 2 TB and 50 users, Enterprise is unlimited with a named engineer. "
          "The API allows 10 requests per second on Starter and 100 on Business; over the limit it returns "
          "HTTP 429. Invoices are issued on the first day of each month. Customer question:")


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def max_len(self) -> int:
        return max(len(p) + n for p, n in zip(self.prompts, self.output_lens))


@dataclass
class Row:
    name: str
    seconds: float
    output_tokens: int
    throughput: float  # output tokens / s
    ttft_mean_ms: float
    ttft_p99_ms: float
    tpot_mean_ms: float
    tpot_p99_ms: float
    kv_peak_mib: float
    kv_usage_peak: float | None  # share of the KV budget; None when nothing bounds it (transformers)
    max_concurrency: int
    preemptions: int = 0
    prefix_hit_rate: float = 0.0
    settings: dict = field(default_factory=dict)


def make_workload(tokenizer, num_requests: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    system = tokenizer.encode(SYSTEM, add_special_tokens=False)
    prompts, outs = [], []
    for i in range(num_requests):
        question = f" ({i}) " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 48))) + "?"
        prompts.append(system + tokenizer.encode(question, add_special_tokens=False))
        outs.append(rng.randint(16, 64))
    return Workload(prompts, outs)


def _summary(name: str, seconds: float, ttft: list[float], tpot: list[float], output_tokens: int, **extra) -> Row:
    return Row(name, seconds, output_tokens, output_tokens / seconds, float(np.mean(ttft)),
               float(np.percentile(ttft, 99)), float(np.mean(tpot)), float(np.percentile(tpot, 99)), **extra)


def run_transformers(model_dir: Path, work: Workload, batch_size: int, bytes_per_token: int) -> Row:
    """Static batching: batches in arrival order, each generating until its longest request is done."""
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    class Clock(StoppingCriteria):  # called once per generated token: when each step's token exists
        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    ttft, tpot, peak_kv = [], [], 0.0
    start = time.perf_counter()
    for b in range(0, len(work.prompts), batch_size):
        prompts, lens = work.prompts[b:b + batch_size], work.output_lens[b:b + batch_size]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        clock = Clock()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens), min_new_tokens=max(lens),
                           do_sample=False, pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]))
        for n in lens:
            ttft.append((clock.times[0] - start) * 1e3)
            tpot.append((clock.times[n - 1] - clock.times[0]) * 1e3 / (n - 1))
        peak_kv = max(peak_kv, len(prompts) * (width + max(lens)) * bytes_per_token / 2**20)
    seconds = time.perf_counter() - start
    return _summary("transformers static batching", seconds, ttft, tpot, sum(work.output_lens),
                    kv_peak_mib=peak_kv, kv_usage_peak=None, max_concurrency=batch_size,
                    settings={"batch_size": batch_size})


def run_engine(name: str, model: str, work: Workload, kv_budget_mib: float, **engine) -> Row:
    """All requests at t=0 through LLMEngine, stepping until done; per-step peaks of KV usage and running."""
    from quantkit.runtime import EngineConfig, LLMEngine, SamplingParams

    engine_cfg = EngineConfig(model, dtype="float32", max_model_len=work.max_len + 1,
                              kv_cache_memory_gb=kv_budget_mib / 1024, **engine)
    llm = LLMEngine(engine_cfg)
    cap = llm.capacity
    start = time.perf_counter()
    for prompt, n in zip(work.prompts, work.output_lens):
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    outputs, peak_usage, peak_running = [], 0.0, 0
    while llm.has_unfinished_requests():
        outputs += [o for o in llm.step() if o.finished]
        stats = llm.stats()
        peak_usage = max(peak_usage, stats.kv_cache_usage)
        peak_running = max(peak_running, stats.num_running)
    seconds = time.perf_counter() - start
    stats = llm.stats()
    ttft = [o.metrics.ttft_ms for o in outputs]
    tpot = [o.metrics.tpot_ms for o in outputs if o.metrics.tpot_ms is not None]
    return _summary(name, seconds, ttft, tpot, sum(len(o.token_ids) for o in outputs),
                    kv_peak_mib=peak_usage * cap.num_tokens * cap.bytes_per_token / 2**20, kv_usage_peak=peak_usage,
                    max_concurrency=peak_running, preemptions=stats.num_preemptions,
                    prefix_hit_rate=stats.prefix_cache_hit_rate,
                    settings={k: v for k, v in engine.items()} | {"kv_blocks": cap.num_blocks, "kv_dtype": cap.dtype})


@dataclass
class LadderResult:
    model: str
    num_requests: int
    batch_size: int
    kv_budget_mib: float
    rows: list[Row]
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def run_ladder(model: str = "smollm2-135m", num_requests: int = 32, batch_size: int = 8,
               kv_budget_mib: float = 48.0, tune: tuple[int, ...] = (16, 32), threads: int = 1,
               progress=None) -> LadderResult:
    import torch

    from quantkit.models import load_config, load_tokenizer, resolve_model

    torch.set_num_threads(threads)
    begin = time.perf_counter()
    say = progress or (lambda message: None)
    model_dir = resolve_model(model)
    work = make_workload(load_tokenizer(model_dir), num_requests)
    cfg = load_config(model_dir)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    fp32_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
    rows = []
    say("transformers static batching")
    rows.append(run_transformers(model_dir, work, batch_size, fp32_bytes))
    base = {"max_num_seqs": batch_size, "enable_prefix_caching": False}
    steps = [("continuous batching", base),
             ("+ FP8 KV cache", base | {"kv_cache_dtype": "fp8"}),
             ("+ prefix caching", base | {"kv_cache_dtype": "fp8", "enable_prefix_caching": True})]
    for name, engine in steps:
        say(name)
        rows.append(run_engine(name, model, work, kv_budget_mib, **engine))
    tried = []
    for seqs in tune:
        say(f"max_num_seqs {seqs}")
        tried.append(run_engine(f"+ tuned max_num_seqs={seqs}", model, work, kv_budget_mib,
                                **(steps[-1][1] | {"max_num_seqs": seqs})))
    best = max(tried + [rows[-1]], key=lambda r: r.throughput)
    if best is not rows[-1]:
        best.settings["tried"] = [r.settings["max_num_seqs"] for r in tried]
        rows.append(best)
    return LadderResult(model, num_requests, batch_size, kv_budget_mib, rows, time.perf_counter() - begin)


def markdown(result: LadderResult) -> str:
    lines = ["| step | tok/s | vs previous | TTFT mean / p99 (ms) | TPOT mean / p99 (ms) | KV peak (MiB) "
             "| KV usage peak | max concurrency | preemptions | prefix hits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    previous = None
    for r in result.rows:
        gain = f"{r.throughput / previous:.2f}x" if previous else "-"
        usage = "unbounded" if r.kv_usage_peak is None else f"{r.kv_usage_peak:.0%}"
        lines.append(f"| {r.name} | {r.throughput:.1f} | {gain} | {r.ttft_mean_ms:,.0f} / {r.ttft_p99_ms:,.0f} | "
                     f"{r.tpot_mean_ms:.1f} / {r.tpot_p99_ms:.1f} | {r.kv_peak_mib:.1f} | {usage} | "
                     f"{r.max_concurrency} | {r.preemptions} | {r.prefix_hit_rate:.0%} |")
        previous = r.throughput
    return "\n".join(lines) + "\n"


def plot(result: LadderResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name.removeprefix("+ ") for r in result.rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [("output tokens/s", [r.throughput for r in result.rows]),
              ("mean TTFT (s)", [r.ttft_mean_ms / 1e3 for r in result.rows]),
              ("mean TPOT (ms)", [r.tpot_mean_ms for r in result.rows])]
    for ax, (title, values) in zip(axes, panels):
        ax.bar(range(len(values)), values, color=["#999999"] + ["#3b7dd8"] * (len(values) - 1))
        ax.set_title(title)
        ax.set_xticks(range(len(values)), names, rotation=30, ha="right", fontsize=8)
    fig.suptitle(f"{result.model}: {result.num_requests} requests, KV budget {result.kv_budget_mib:g} MiB")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
