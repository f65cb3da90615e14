"""`quantkit bench serve-load`: a bounded load test of the server on loopback.

N requests (default 300) from a fixed number of concurrent clients, mixed prompt and output lengths,
completions and chat, streamed and not; some clients leave mid-request (disconnect) and some requests are
invalid. Then it checks that every valid request completed or was cleanly refused (503 + Retry-After),
every invalid one got an OpenAI 4xx error, none hung, /health is ok, KV usage is back to 0, and the
server's counters add up with what the clients saw. With no --url it starts its own server in-process on
a small KV cache (so preemption happens too) and also checks the engine itself is empty afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from quantkit.bench.serve import WORDS

OK, REFUSED, REJECTED, LEFT, BAD, HUNG = "completed", "refused", "rejected", "left", "violation", "hung"


@dataclass
class LoadConfig:
    model: str = "smollm2-135m"
    url: str | None = None  # None: start a server in-process
    num_requests: int = 300
    concurrency: int = 32
    disconnect_fraction: float = 0.15
    invalid_fraction: float = 0.10
    max_prompt_words: int = 200
    max_output_tokens: int = 32
    request_timeout: float = 300.0  # a valid request slower than this counts as hung
    retry_for: float = 60.0  # seconds a client keeps retrying 503s (after each Retry-After) before giving up
    seed: int = 0
    # the in-process server
    max_model_len: int = 1024
    max_num_seqs: int = 16
    max_waiting: int = 8
    num_kv_blocks: int = 256
    threads: int = 1


@dataclass
class Plan:
    index: int
    kind: str  # "valid", "leave" or "invalid"
    chat: bool
    stream: bool
    body: dict | str  # a str is sent as a raw (malformed) body
    leave_after: float = 0.0  # seconds (non-streaming) or chunks (streaming) before leaving


@dataclass
class Outcome:
    index: int
    kind: str
    result: str
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    detail: str = ""
    attempts: int = 1
    retry_after: float = 0.0


def make_plans(cfg: LoadConfig, model: str) -> list[Plan]:
    rng = random.Random(cfg.seed)
    plans = []
    for i in range(cfg.num_requests):
        roll = rng.random()
        kind = "invalid" if roll < cfg.invalid_fraction else (
            "leave" if roll < cfg.invalid_fraction + cfg.disconnect_fraction else "valid")
        chat, stream = rng.random() < 0.3, rng.random() < 0.5
        # mixed lengths: from a few words to the longest allowed, most of them short
        words = int(cfg.max_prompt_words * rng.choice([0.02, 0.05, 0.15, 0.4, 1.0]) * rng.uniform(0.5, 1.0)) + 1
        text = f"Request {i}. " + " ".join(rng.choice(WORDS) for _ in range(words))
        body: dict | str = {"model": model, "max_tokens": rng.randint(1, cfg.max_output_tokens),
                            "temperature": rng.choice([0.0, 0.0, 0.8]), "stream": stream}
        if kind == "leave":
            body["max_tokens"] = cfg.max_output_tokens  # long enough to be running when the client leaves
            body["ignore_eos"] = True
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
        if kind == "invalid":
            body = _break(body, rng, cfg)
        leave = rng.randint(0, 6) if stream else rng.uniform(0.05, 2.0)
        plans.append(Plan(i, kind, chat, stream, body, leave))
    return plans


def _break(body: dict, rng: random.Random, cfg: LoadConfig) -> dict | str:
    how = rng.choice(["too_long", "temperature", "n", "token_id", "model", "json", "missing", "max_tokens"])
    body = dict(body)
    if how == "too_long":
        long = " ".join(["word"] * (cfg.max_model_len * 2))
        body.update({"messages": [{"role": "user", "content": long}]} if "messages" in body else {"prompt": long})
    elif how == "temperature":
        body["temperature"] = -1
    elif how == "n":
        body["n"] = 3
    elif how == "token_id":
        body.pop("messages", None)
        body["prompt"] = [1, 2, 10 ** 9]
    elif how == "model":
        body["model"] = "no-such-model"
    elif how == "json":
        return json.dumps(body)[:-5]
    elif how == "missing":
        body.pop("messages", None)
        body.pop("prompt", None)
    else:
        body["max_tokens"] = 0
    return body


async def _send_with_retries(session, url: str, plan: Plan, timeout: float, retry_for: float) -> Outcome:
    """Like a well-behaved client: a 503 is retried after its Retry-After for up to `retry_for` seconds;
    a request still refused then counts as cleanly refused."""
    start = time.monotonic()
    attempts = 0
    while True:
        out = await _send(session, url, plan, timeout)
        attempts += 1
        out.attempts = attempts
        if out.result != REFUSED or time.monotonic() + out.retry_after - start > retry_for:
            return out
        await asyncio.sleep(out.retry_after)


async def _send(session, url: str, plan: Plan, timeout: float) -> Outcome:
    path = "/v1/chat/completions" if plan.chat else "/v1/completions"
    out = Outcome(plan.index, plan.kind, BAD)
    kwargs = {"data": plan.body, "headers": {"Content-Type": "application/json"}} if isinstance(plan.body, str) \
        else {"json": plan.body}
    try:
        if plan.kind == "leave" and not plan.stream:
            # Leave by cancelling the call: aiohttp drops the half-read connection.
            await asyncio.wait_for(_exchange(session, url + path, kwargs, plan, out), plan.leave_after)
        else:
            await asyncio.wait_for(_exchange(session, url + path, kwargs, plan, out), timeout)
    except asyncio.TimeoutError:
        out.result = LEFT if plan.kind == "leave" else HUNG
    except Exception as exc:  # anything else is a broken exchange: record it, do not crash the run
        out.detail = f"{type(exc).__name__}: {exc}"
    return out


async def _exchange(session, url: str, kwargs: dict, plan: Plan, out: Outcome) -> None:
    async with session.post(url, **kwargs) as resp:
        out.status = resp.status
        if resp.status != 200:
            payload = await resp.text()
            out.result, out.detail = _judge_error(plan, resp, payload)
            if out.result == REFUSED:
                out.retry_after = float(resp.headers["Retry-After"])
            return
        if not plan.stream:
            data = await resp.json()
            _judge_whole(data, out)
            return
        chunks, done, usage, reason = 0, False, None, None
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            reason = next((c.get("finish_reason") for c in chunk.get("choices", []) if c.get("finish_reason")),
                          reason)
            chunks += 1
            if plan.kind == "leave" and chunks > plan.leave_after and not reason:
                out.result = LEFT
                resp.close()  # leave mid-stream
                return
        wants_usage = bool(plan.body.get("stream_options", {}).get("include_usage"))
        if done and reason in ("stop", "length") and (usage is not None) == wants_usage:
            out.result = OK
            if usage:
                out.prompt_tokens, out.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
        else:
            out.detail = f"stream ended badly: done={done} finish_reason={reason} usage={usage is not None}"


def _judge_whole(data: dict, out: Outcome) -> None:
    choice = data["choices"][0]
    if choice["finish_reason"] in ("stop", "length") and data["usage"]["completion_tokens"] >= 1:
        out.result = OK
        out.prompt_tokens = data["usage"]["prompt_tokens"]
        out.completion_tokens = data["usage"]["completion_tokens"]
    else:
        out.detail = f"finish_reason {choice['finish_reason']}"


def _judge_error(plan: Plan, resp, payload: str) -> tuple[str, str]:
    try:
        error = json.loads(payload)["error"]
        shaped = bool(error["message"]) and error["code"] == resp.status
    except (json.JSONDecodeError, KeyError, TypeError):
        shaped = False
    if plan.kind == "invalid" and resp.status in (400, 404) and shaped:
        return REJECTED, ""
    if plan.kind != "invalid" and resp.status == 503 and shaped and resp.headers.get("Retry-After"):
        return REFUSED, ""
    return BAD, f"HTTP {resp.status}: {payload[:120]}"


async def _drive(url: str, plans: list[Plan], concurrency: int, timeout: float, retry_for: float) -> list[Outcome]:
    import aiohttp

    gate = asyncio.Semaphore(concurrency)

    async def one(plan: Plan) -> Outcome:
        async with gate:
            return await _send_with_retries(session, url, plan, timeout, retry_for)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        return list(await asyncio.gather(*(one(p) for p in plans)))


def _scrape(url: str) -> dict[str, float]:
    """/metrics summed by sample name plus finished_reason: {"vllm:request_success_total{abort}": ...}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values: dict[str, float] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + (f"{{{s.labels['finished_reason']}}}" if "finished_reason" in s.labels else "")
            values[key] += s.value
    return values


def _health(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_idle(url: str, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = _scrape(url)
        if (m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


@dataclass
class LoadReport:
    seconds: float
    counts: dict[str, int]  # "<kind>/<result>" -> requests
    server: dict[str, float]  # the counters read after the run (deltas over it)
    responses_503: int  # 503 + Retry-After answers the clients got, retried ones included
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def as_dict(self) -> dict:
        return asdict(self) | {"passed": self.passed}


def check(outcomes: list[Outcome], before: dict, after: dict, health: int) -> list[tuple[str, bool, str]]:
    by = Counter((o.kind, o.result) for o in outcomes)
    done = [o for o in outcomes if o.result == OK]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    finished = delta["vllm:request_success_total{stop}"] + delta["vllm:request_success_total{length}"]
    aborted = delta["vllm:request_success_total{abort}"]
    left = by["leave", LEFT]
    known_tokens = [o for o in done if o.completion_tokens]
    bad = [o for o in outcomes if o.result in (BAD, HUNG)]
    hung = sum(o.result == HUNG for o in outcomes)
    running = after["vllm:num_requests_running"] + after["vllm:num_requests_waiting"]
    return [
        ("no request hung", hung == 0, f"{hung} hung"),
        ("every valid request completed or was refused with 503 + Retry-After",
         all(o.result in (OK, REFUSED) for o in outcomes if o.kind == "valid"),
         "; ".join(f"#{o.index} {o.detail}" for o in bad[:3])),
        ("every invalid request got an OpenAI 400/404 error", all(o.result == REJECTED for o in outcomes
                                                                   if o.kind == "invalid"), ""),
        ("clients that left were aborted or had already finished",
         all(o.result in (LEFT, OK, REFUSED) for o in outcomes if o.kind == "leave"), ""),
        ("/health is 200 after the run", health == 200, f"HTTP {health}"),
        ("KV usage back to 0", after["vllm:kv_cache_usage_perc"] == 0.0, f"{after['vllm:kv_cache_usage_perc']}"),
        ("nothing running or waiting", running == 0, f"{running:.0f}"),
        ("finished (stop+length) = completed + those that left after finishing",
         len(done) <= finished <= len(done) + left, f"{finished:.0f} finished, {len(done)} completed, {left} left"),
        ("aborted <= clients that left", aborted <= left, f"{aborted:.0f} aborted, {left} left"),
        ("every admitted request that left was aborted or finished", finished + aborted <= len(done) + left,
         f"{finished + aborted:.0f} ended on the server"),
        ("one E2E observation per ended request",
         delta["vllm:e2e_request_latency_seconds_count"] == finished + aborted, ""),
        ("generated tokens >= the tokens completed clients received",
         delta["vllm:generation_tokens_total"] >= sum(o.completion_tokens for o in known_tokens),
         f"{delta['vllm:generation_tokens_total']:.0f} generated"),
    ]


def _stats(url: str) -> dict | None:
    """A quantkit server's /stats (admitted and refused counts); None from other servers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/stats", timeout=30) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, json.JSONDecodeError):
        return None


def exact_checks(outcomes: list[Outcome], before: dict, after: dict, stats_before: dict | None,
                 stats_after: dict | None) -> list[tuple[str, bool, str]]:
    """With a quantkit server's admission counts the accounting is exact, not bounded."""
    if stats_before is None or stats_after is None:
        return []
    admitted = stats_after["admitted_requests"] - stats_before["admitted_requests"]
    refused = stats_after["refused_calls"] - stats_before["refused_calls"]
    ended = sum(after.get(k, 0) - before.get(k, 0) for k in (
        "vllm:request_success_total{stop}", "vllm:request_success_total{length}", "vllm:request_success_total{abort}"))
    seen_503 = sum(o.attempts - 1 + (o.result == REFUSED) for o in outcomes)
    completed = sum(o.result == OK for o in outcomes)
    left = sum(o.result == LEFT for o in outcomes)
    return [("admitted = finished + aborted (server)", admitted == ended, f"{admitted} admitted, {ended:.0f} ended"),
            ("503s clients saw <= refusals the server made <= those + clients that left",
             seen_503 <= refused <= seen_503 + left, f"{seen_503} seen, {refused} made"),
            ("completed <= admitted <= completed + clients that left", completed <= admitted <= completed + left,
             f"{admitted} admitted, {completed} completed, {left} left")]


def run(cfg: LoadConfig) -> LoadReport:
    server = None
    url = cfg.url.rstrip("/").removesuffix("/v1") if cfg.url else None
    if url is None:
        import torch

        from quantkit.runtime import EngineConfig
        from quantkit.runtime.server import make_server

        torch.set_num_threads(cfg.threads)
        server = make_server(EngineConfig(cfg.model, max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                                          num_kv_blocks=cfg.num_kv_blocks), cfg.model,
                             max_waiting=cfg.max_waiting).start()
        url = server.url
    try:
        from quantkit.bench.serve import served_model

        model = served_model(url, None)
        plans = make_plans(cfg, model)
        before = _scrape(url)
        start = time.perf_counter()
        stats_before = _stats(url)
        outcomes = asyncio.run(_drive(url, plans, cfg.concurrency, cfg.request_timeout, cfg.retry_for))
        seconds = time.perf_counter() - start
        after = _wait_idle(url)
        checks = check(outcomes, before, after, _health(url))
        checks += exact_checks(outcomes, before, after, stats_before, _stats(url))
        if server is not None:
            engine = server.app.state.engine_loop.engine
            bm = engine.block_manager
            checks.append(("engine holds no request and every block is free",
                           not engine.requests and bm.num_free_blocks == bm.num_usable_blocks,
                           f"{len(engine.requests)} requests, {bm.num_free_blocks}/{bm.num_usable_blocks} blocks free"))
        counts = Counter(f"{o.kind}/{o.result}" for o in outcomes)
        server_numbers = {k: after.get(k, 0) - before.get(k, 0) for k in (
            "vllm:request_success_total{stop}", "vllm:request_success_total{length}",
            "vllm:request_success_total{abort}", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
            "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")}
        server_numbers["completed_prompt_tokens"] = sum(o.prompt_tokens for o in outcomes if o.result == OK)
        server_numbers["completed_completion_tokens"] = sum(o.completion_tokens for o in outcomes if o.result == OK)
        responses_503 = sum(o.attempts - 1 + (o.result == REFUSED) for o in outcomes)
        return LoadReport(seconds, dict(sorted(counts.items())), server_numbers, responses_503, checks)
    finally:
        if server is not None:
            server.stop()
