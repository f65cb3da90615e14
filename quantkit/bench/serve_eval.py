"""`quantkit bench serve-eval`: one task (a standard benchmark or a shipped task) through lm-eval's
`local-completions` model pointed at `quantkit serve`, against the same task through quantkit's in-process
evaluation (HFLM on the transformers model), item by item.

Both sides see the same task definition and items; what differs is the engine (paged KV, continuous
batching, our kernels) and the HTTP path. Multiple-choice tasks go as token ids (`tokenized_requests`): the
server returns the prompt's log-probabilities (echo + logprobs), and a context / continuation split is only
exact in tokens. Generation tasks go as text.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from quantkit.errors import QuantkitError


@dataclass
class ServeEvalResult:
    task: str
    metric: str
    items: int
    server_accuracy: float
    in_process_accuracy: float
    items_that_agree: int
    server_seconds: float
    in_process_seconds: float
    num_concurrent: int

    def as_dict(self) -> dict:
        return asdict(self)


def _task(task: str):
    """A standard benchmark by name or a shipped task, as (TaskSpec, lm-eval config)."""
    from quantkit.eval.benchmarks import BENCHMARKS
    from quantkit.eval.lm_tasks import benchmark_task, read_task
    from quantkit.eval.suite import shipped_task_names, shipped_tasks_dir

    if task in BENCHMARKS:
        return benchmark_task(task)
    path = shipped_tasks_dir() / f"{task}.yaml"
    if not path.is_file():
        raise QuantkitError(f"task '{task}' is neither a benchmark nor shipped",
                            hint=f"benchmarks: {', '.join(BENCHMARKS)}; shipped: {', '.join(shipped_task_names())}")
    return read_task(path)


def run(model: str = "smollm2-135m", task: str = "meeting_owner_gen", limit: int | None = None,
        num_concurrent: int = 8, max_model_len: int = 2048, threads: int = 1) -> ServeEvalResult:
    import torch

    from quantkit.eval.lm_tasks import TaskRunner, go_offline
    from quantkit.models import load_model, load_tokenizer, resolve_model
    from quantkit.runtime import EngineConfig
    from quantkit.runtime.server import make_server

    spec, config = _task(task)
    go_offline()
    torch.set_num_threads(threads)
    model_dir = resolve_model(model)
    runner = TaskRunner([(spec, config)])
    try:
        with make_server(EngineConfig(model, dtype="float32", max_model_len=max_model_len), model) as server:
            from lm_eval.models.openai_completions import LocalCompletionsAPI

            lm = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model=model,
                                     tokenizer_backend="huggingface", tokenizer=str(model_dir),
                                     tokenized_requests=config.get("output_type") != "generate_until", num_concurrent=num_concurrent, max_retries=1,
                                     max_length=max_model_len)
            start = time.perf_counter()
            served = runner.run_lm(lm, limit)[spec.name].scores
            server_seconds = time.perf_counter() - start
        hf = load_model(model_dir, torch.float32)
        start = time.perf_counter()
        local = runner.run(hf, load_tokenizer(model_dir), limit, batch_size=1)[spec.name].scores
        local_seconds = time.perf_counter() - start
    finally:
        runner.close()
    items = sorted(set(served) & set(local))
    return ServeEvalResult(task, spec.metric, len(items), sum(served[i] for i in items) / len(items),
                           sum(local[i] for i in items) / len(items), sum(served[i] == local[i] for i in items),
                           server_seconds, local_seconds, num_concurrent)
