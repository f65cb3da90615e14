"""`quantkit bench serve --url URL`: load an OpenAI-compatible server the way `vllm bench serve` does and
report the same numbers (request and token throughput; TTFT, TPOT, ITL and E2E latency mean/median/p-x).

Requests are streamed /v1/completions with ignore_eos, so each produces exactly its output length, and
arrive all at once (rate inf), at a Poisson rate (burstiness 1) or gamma-distributed (other burstiness),
optionally capped at a fixed number in flight. Prompts come from a JSONL file ({"prompt": ...,
"output_len": ...} per line) or are synthetic: words drawn with a fixed seed, one common English word
being about one token. With --tokenizer the synthetic prompts are token ids of the exact input length.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from quantkit.errors import QuantkitError

WORDS = ("the time people year way day thing man world life hand part child eye woman place work week case point "
         "number group problem fact house order money water room mother area night business story job word "
         "issue side kind head service friend power hour game line end member law car city name team minute "
         "idea body back parent face level office door health person art war history party result change "
         "morning reason research girl guy moment air teacher force education").split()


@dataclass(frozen=True)
class RequestSpec:
    prompt: str | list[int]
    output_len: int


@dataclass
class RequestResult:
    ok: bool
    status: int = 0
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first


def synthetic_requests(num: int, input_len: int, output_len: int, range_ratio: float, seed: int,
                       tokenizer=None) -> list[RequestSpec]:
    """Lengths uniform in [len*(1-r), len*(1+r)], as vllm's random dataset."""
    rng = random.Random(seed)

    def length(n: int) -> int:
        return max(1, rng.randint(math.floor(n * (1 - range_ratio)), math.ceil(n * (1 + range_ratio))))

    specs = []
    for i in range(num):
        n_in, n_out = length(input_len), length(output_len)
        text = f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(n_in))
        prompt: str | list[int] = text
        if tokenizer is not None:
            ids = tokenizer.encode(text + " " + text, add_special_tokens=False)
            prompt = ids[:n_in]
        specs.append(RequestSpec(prompt, n_out))
    return specs


def dataset_requests(path: Path, num: int, output_len: int) -> list[RequestSpec]:
    specs = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            specs.append(RequestSpec(row["prompt"], int(row.get("output_len", output_len))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise QuantkitError(f"{path}:{lineno}: expected a JSON object with 'prompt' (and optional "
                                f"'output_len'): {exc}") from exc
        if len(specs) == num:
            break
    if not specs:
        raise QuantkitError(f"{path}: no requests in the file")
    return specs


def arrival_gaps(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before each request: 0 at rate inf, else gamma(burstiness) gaps with mean 1/rate."""
    if math.isinf(rate):
        return [0.0] * num
    rng = np.random.default_rng(seed)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num).tolist()


async def send(session, url: str, model: str, spec: RequestSpec, headers: dict) -> RequestResult:
    """One streamed completion: TTFT at the first chunk with text, ITL between chunks, usage from the last."""
    body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.output_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with session.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
            result.status = resp.status
            if resp.status != 200:
                result.error = (await resp.text())[:200]
                return result
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and (chunk["choices"][0].get("text") or last is None):
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
        result.latency = time.perf_counter() - start
        result.ok = result.output_tokens > 0
        if not result.ok:
            result.error = "no usage in the stream"
    except Exception as exc:  # a benchmark counts a broken request as failed and goes on
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_load(url: str, model: str, specs: list[RequestSpec], rate: float, burstiness: float,
                   max_concurrency: int | None, seed: int, api_key: str | None) -> tuple[list[RequestResult], float]:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)

    async def one(spec: RequestSpec) -> RequestResult:
        if gate is None:
            return await send(session, url, model, spec, headers)
        async with gate:
            return await send(session, url, model, spec, headers)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        tasks = []
        for spec, gap in zip(specs, arrival_gaps(len(specs), rate, burstiness, seed)):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(spec)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def summarize(results: list[RequestResult], duration: float, percentiles: list[float]) -> dict:
    """vllm bench serve's result fields (ms for latencies)."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    report = {"completed": len(ok), "failed": len(results) - len(ok), "duration": duration,
              "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
              "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
              "total_token_throughput": (in_tokens + out_tokens) / duration}
    series = {"ttft": [r.ttft for r in ok],
              "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
              "itl": [gap for r in ok for gap in r.itl],
              "e2el": [r.latency for r in ok]}
    for name, values in series.items():
        ms = np.array(values) * 1e3 if values else np.array([np.nan])
        report[f"mean_{name}_ms"] = float(np.mean(ms))
        report[f"median_{name}_ms"] = float(np.median(ms))
        report[f"std_{name}_ms"] = float(np.std(ms))
        for p in percentiles:
            report[f"p{p:g}_{name}_ms"] = float(np.percentile(ms, p))
    errors = sorted({r.error for r in results if not r.ok})
    report["errors"] = errors[:5]
    return report


@dataclass
class BenchConfig:
    url: str
    model: str | None = None
    num_prompts: int = 100
    input_len: int = 128
    output_len: int = 64
    range_ratio: float = 0.0
    dataset: Path | None = None
    tokenizer: str | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    percentiles: list[float] = field(default_factory=lambda: [99.0])
    api_key: str | None = None


def served_model(url: str, api_key: str | None) -> str:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())["data"][0]["id"]
    except (urllib.error.URLError, OSError, KeyError, IndexError, json.JSONDecodeError) as exc:
        raise QuantkitError(f"{url}/v1/models: cannot read the served model ({exc})",
                            hint="is the server running? start it with `quantkit serve`") from exc


def run(config: BenchConfig) -> dict:
    if config.request_rate <= 0 or config.burstiness <= 0:
        raise QuantkitError("--request-rate and --burstiness must be > 0")
    url = config.url.rstrip("/").removesuffix("/v1")
    model = config.model or served_model(url, config.api_key)
    if config.dataset is not None:
        specs = dataset_requests(config.dataset, config.num_prompts, config.output_len)
    else:
        tokenizer = None
        if config.tokenizer:
            from quantkit.models import load_tokenizer, resolve_model

            tokenizer = load_tokenizer(resolve_model(config.tokenizer))
        specs = synthetic_requests(config.num_prompts, config.input_len, config.output_len, config.range_ratio,
                                   config.seed, tokenizer)
    results, duration = asyncio.run(run_load(url, model, specs, config.request_rate, config.burstiness,
                                             config.max_concurrency, config.seed, config.api_key))
    report = summarize(results, duration, config.percentiles)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items() if k != "api_key"}
    settings["request_rate"] = "inf" if math.isinf(config.request_rate) else config.request_rate
    return {**settings, "model": model, "url": url, **report}


def print_report(report: dict, console) -> None:
    """The `vllm bench serve` layout."""
    from rich.table import Table

    table = Table(title="Serving Benchmark Result", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [("Successful requests", f"{report['completed']}"), ("Failed requests", f"{report['failed']}"),
            ("Maximum request concurrency", str(report["max_concurrency"] or "unlimited")),
            ("Request rate configured (RPS)", str(report["request_rate"])),
            ("Benchmark duration (s)", f"{report['duration']:.2f}"),
            ("Total input tokens", f"{report['total_input_tokens']}"),
            ("Total generated tokens", f"{report['total_output_tokens']}"),
            ("Request throughput (req/s)", f"{report['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{report['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{report['total_token_throughput']:.2f}")]
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append((f"[dim]{title}[/]", ""))
        rows.append((f"Mean {name.upper()} (ms)", f"{report[f'mean_{name}_ms']:.2f}"))
        rows.append((f"Median {name.upper()} (ms)", f"{report[f'median_{name}_ms']:.2f}"))
        for p in report["percentiles"]:
            rows.append((f"P{p:g} {name.upper()} (ms)", f"{report[f'p{p:g}_{name}_ms']:.2f}"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for error in report["errors"]:
        console.print(f"[red]failed:[/] {error}", highlight=False)
