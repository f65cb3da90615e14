"""LLMEngine: add_request / step / abort, driving scheduler -> model runner -> stop checks -> outputs.

A server drives it step by step; quantkit.runtime.LLM wraps it for offline use.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.models import load_tokenizer, resolve_model
from quantkit.runtime.block_manager import BlockManager
from quantkit.runtime.config import EngineConfig
from quantkit.runtime.detokenizer import take_delta, update_text
from quantkit.runtime.logprobs import TokenLogprob
from quantkit.runtime.model_runner import ModelRunner
from quantkit.runtime.outputs import RequestMetrics, RequestOutput
from quantkit.runtime.sampling_params import SamplingParams
from quantkit.runtime.scheduler import Scheduler
from quantkit.runtime.sequence import Sequence


@dataclass
class EngineStats:
    """Engine-wide state and counters (a server exports them under vLLM's metric names)."""

    kv_cache_usage: float  # share of usable blocks held by requests (vllm:kv_cache_usage_perc)
    num_running: int
    num_waiting: int
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    prefix_cache_hit_rate: float
    num_preemptions: int
    num_steps: int
    computed_tokens: int  # tokens run through the model (prefix hits excluded, recomputes included)
    generation_tokens: int
    last_step_tokens: int
    mean_step_tokens: float

    def as_dict(self) -> dict:
        return asdict(self)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.path = resolve_model(config.model)
        self.tokenizer = load_tokenizer(self.path)
        self.runner = ModelRunner(config, self.path)
        self.max_model_len = self.runner.max_model_len
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.eos_token_ids = _eos_token_ids(self.path, self.tokenizer)
        self.requests: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._steps = self._step_tokens = self._last_step_tokens = 0
        self._generation_tokens = 0

    @property
    def capacity(self):
        return self.runner.capacity

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request (text or token ids); QuantkitError when it cannot fit in max_model_len."""
        params = params or SamplingParams()
        if isinstance(prompt, str):
            token_ids, text = self.tokenizer.encode(prompt), prompt
        else:
            token_ids, text = [int(t) for t in prompt], None
        if not token_ids:
            raise QuantkitError("the prompt is empty", hint="pass at least one token")
        if len(token_ids) >= self.max_model_len:
            raise QuantkitError(f"the prompt has {len(token_ids)} tokens; max_model_len is {self.max_model_len}, "
                                "which must leave room for at least one output token",
                                hint="shorten the prompt or raise max_model_len")
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise QuantkitError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, token_ids, params, prompt=text)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.pop(request_id, None)
        if seq is None or seq.is_finished:
            return None
        self.scheduler.finish(seq, "abort")
        seq.finish_time = time.perf_counter()
        return self._output(seq, [])

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward, sample; outputs for the requests that got a token this step."""
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        step = self.runner.execute(scheduled)
        for (seq, _), scored in zip(scheduled, step.prompt_logprobs):
            if scored:
                seq.prompt_logprobs.extend(scored)
        self.scheduler.update(scheduled)
        self._count(scheduled, step.tokens)
        outputs = []
        for (seq, _), token, logprob in zip(scheduled, step.tokens, step.logprobs):
            if token is None:
                continue
            seq.append_token(token, logprob)
            reason, stop_reason = self._check_stop(seq, token)
            if reason:
                seq.stop_reason = stop_reason
                seq.finish_time = time.perf_counter()
                self.scheduler.finish(seq, reason)
                self.requests.pop(seq.request_id, None)
            outputs.append(self._output(seq, [token]))
        return outputs

    def _check_stop(self, seq: Sequence, token: int) -> tuple[str | None, int | str | None]:
        params = seq.params
        stop_string = update_text(seq, self.tokenizer)
        if stop_string is not None:
            return "stop", stop_string
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop", None
        if token in params.stop_token_ids:
            return "stop", token
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None, None

    def _output(self, seq: Sequence, new_tokens: list[int]) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=seq.token_ids[:seq.num_prompt_tokens],
            text=seq.output_text, token_ids=seq.output_token_ids, finished=seq.is_finished,
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            metrics=RequestMetrics.of(seq, time.perf_counter()), delta_text=take_delta(seq),
            delta_token_ids=new_tokens, prompt_logprobs=_prompt_logprobs(seq),
            logprobs=None if seq.output_logprobs is None else list(seq.output_logprobs))

    def _count(self, scheduled: list[tuple[Sequence, int]], tokens: list[int | None]) -> None:
        step_tokens = sum(n for _, n in scheduled)
        self._steps += 1
        self._step_tokens += step_tokens
        self._last_step_tokens = step_tokens
        self._generation_tokens += sum(t is not None for t in tokens)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            kv_cache_usage=bm.usage, num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting), prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            prefix_cache_hit_rate=bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
            num_preemptions=self.scheduler.num_preemptions, num_steps=self._steps,
            computed_tokens=self._step_tokens, generation_tokens=self._generation_tokens,
            last_step_tokens=self._last_step_tokens,
            mean_step_tokens=self._step_tokens / self._steps if self._steps else 0.0)


def _prompt_logprobs(seq: Sequence) -> list[TokenLogprob | None] | None:
    """One entry per prompt position, None before the first scored one (position 0 has no prefix)."""
    if seq.prompt_logprobs is None:
        return None
    return [None] * seq.prompt_logprobs_from + seq.prompt_logprobs


def _eos_token_ids(path: Path, tokenizer) -> set[int]:
    """EOS ids from generation_config.json (what HF generate stops on), else the tokenizer's."""
    ids: set[int] = set()
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
