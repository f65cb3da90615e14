"""LLM: offline generation over LLMEngine (batch generate, chat, streaming)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence as Seq

from quantkit.runtime.config import EngineConfig
from quantkit.runtime.engine import LLMEngine
from quantkit.runtime.outputs import RequestOutput
from quantkit.runtime.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """LLM("smollm2-135m" | checkpoint dir, dtype=..., kv_cache_dtype=..., ...): see EngineConfig."""

    def __init__(self, model: str, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=str(model), **kwargs))
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts: Prompt | Seq[Prompt],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 on_finished: Callable[[RequestOutput], None] | None = None) -> list[RequestOutput]:
        """Outputs in prompt order. A single prompt is a str or a list of token ids. on_finished is called with
        each request's final output as it finishes (a progress bar's update)."""
        prompts = _as_list(prompts)
        params = _params_for(prompts, sampling_params)
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        final: dict[str, RequestOutput] = {}
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
                        if on_finished is not None:
                            on_finished(out)
        finally:
            for request_id in ids:
                if request_id not in final:
                    self.engine.abort(request_id)
        return [final[i] for i in ids]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or several, through the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        return self.generate([self.chat_prompt(c) for c in conversations], sampling_params)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield an output per new token (delta_text / delta_token_ids); the last one has finished=True.
        Other requests already queued on the engine keep running alongside."""
        request_id = self.engine.add_request(prompt, sampling_params)
        finished = False
        try:
            while not finished:
                for out in self.engine.step():
                    if out.request_id == request_id:
                        finished = out.finished
                        yield out
        finally:
            if not finished:
                self.engine.abort(request_id)

    def stats(self):
        return self.engine.stats()


def _as_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


def _params_for(prompts: list, params) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        from quantkit.errors import QuantkitError

        raise QuantkitError(f"{len(params)} sampling params for {len(prompts)} prompts", hint="pass one or one each")
    return params
