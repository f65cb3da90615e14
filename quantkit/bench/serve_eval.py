"""`quantkit bench serve-eval`: one shipped generation task through lm-eval's `local-completions` model
pointed at `quantkit serve`, against the same task through quantkit's in-process evaluation (HFLM on the
transformers model), item by item.

Both sides see the same task files, prompts and greedy decoding; what differs is the engine (paged KV,
continuous batching, our kernels) and the HTTP path. Only generate_until tasks run here: the prompts go
as text, and a loglikelihood request's context / continuation split is only exact with token ids
(the server's echo + logprobs serve those: tests/runtime/server/test_completion_logprobs.py).
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


def _task_file(task: str):
    from quantkit.eval.suite import shipped_task_names, shipped_tasks_dir

    path = shipped_tasks_dir() / f"{task}.yaml"
    if not path.is_file():
        raise QuantkitError(f"task '{task}' is not shipped", hint=f"shipped: {', '.join(shipped_task_names())}")
    return path


def run(model: str = "smollm2-135m", task: str = "meeting_owner_gen", limit: int | None = None,
        num_concurrent: int = 8, max_model_len: int = 2048, threads: int = 1) -> ServeEvalResult:
    import torch
    import yaml

    from quantkit.eval.lm_tasks import TaskRunner, go_offline
    from quantkit.models import load_model, load_tokenizer, resolve_model
    from quantkit.runtime import EngineConfig
    from quantkit.runtime.server import make_server

    path = _task_file(task)
    if yaml.safe_load(path.read_text()).get("output_type") != "generate_until":
        raise QuantkitError(f"task '{task}' is not a generate_until task",
                            hint="this bench compares generations; score loglikelihood tasks with "
                                 "quantkit.eval.runtime_lm.RuntimeLM")
    go_offline()
    torch.set_num_threads(threads)
    model_dir = resolve_model(model)
    runner = TaskRunner([path])
    try:
        with make_server(EngineConfig(model, dtype="float32", max_model_len=max_model_len), model) as server:
            from lm_eval.models.openai_completions import LocalCompletionsAPI

            lm = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model=model,
                                     tokenizer_backend="huggingface", tokenizer=str(model_dir),
                                     tokenized_requests=False, num_concurrent=num_concurrent, max_retries=1,
                                     max_length=max_model_len)
            start = time.perf_counter()
            served = runner.run_lm(lm, limit)[runner.specs[0].name]
            server_seconds = time.perf_counter() - start
        hf = load_model(model_dir, torch.float32)
        start = time.perf_counter()
        local = runner.run(hf, load_tokenizer(model_dir), limit, batch_size=1)[runner.specs[0].name]
        local_seconds = time.perf_counter() - start
    finally:
        runner.close()
    items = sorted(set(served) & set(local))
    return ServeEvalResult(task, runner.specs[0].metric, len(items), sum(served[i] for i in items) / len(items),
                           sum(local[i] for i in items) / len(items), sum(served[i] == local[i] for i in items),
                           server_seconds, local_seconds, num_concurrent)
