"""RuntimeLM: lm-eval's LM over quantkit.runtime, so a checkpoint is scored the way it is served: the runtime's
loader, its INT4 / FP8 kernels and its paged KV cache, not transformers.

Each call hands all of its requests to one engine at once and continuous batching does the batching.
Loglikelihoods are the prompt log-probabilities of the continuation positions only (only those pay for the
lm_head and the log-softmax over the vocabulary). HFLM's conventions hold, so scores line up with it:
context + continuation tokens, the last context token predicts the first continuation token, BOS (else EOS)
stands in for an empty context and starts rolling windows, and over-long inputs lose tokens on the left.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from pathlib import Path

from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from quantkit.errors import QuantkitError
from quantkit.runtime import LLM, RequestOutput, SamplingParams

# Requests are ordered so that the first request of each context runs before the others of that context,
# which then find its blocks in the prefix cache (requests admitted in the same step cannot). Contexts take
# turns in waves of this many, so the reused blocks are recent and still cached, however long the task.
CONTEXTS_PER_WAVE = 64
Request = tuple[tuple[str, str] | None, list[int], list[int]]  # (strings or None, context ids, continuation ids)


class RuntimeLM(TemplateLM):
    """RuntimeLM("smollm2-135m" | HF dir | quantized checkpoint, **EngineConfig options).

    max_length is HFLM's: a scored window holds at most max_length + 1 tokens. The engine needs room for the
    one token it samples after every prompt, so it is at most max_model_len - 2 (the default)."""

    def __init__(self, pretrained: str | Path, max_length: int | None = None, max_gen_toks: int = 256,
                 add_bos_token: bool | None = None, **engine_options):
        super().__init__()
        self.llm = LLM(str(pretrained), **engine_options)
        self.tokenizer = self.llm.tokenizer
        self.pretrained = str(pretrained)
        room = self.llm.engine.max_model_len - 2
        if max_length is not None and not 1 <= max_length <= room:
            raise QuantkitError(f"max_length {max_length} does not fit the engine: it scores windows of "
                                f"max_length + 1 tokens and samples one more, within max_model_len "
                                f"{self.llm.engine.max_model_len}", hint=f"use 1 .. {room}, or raise max_model_len")
        self._max_length = max_length or room
        self._max_gen_toks = max_gen_toks
        self.add_bos_token = add_bos_token

    # --- tokens ---
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """HFLM's rule: the tokenizer's own default, unless told, and no second BOS before one in the text."""
        special = {}
        if add_special_tokens is not None:
            special["add_special_tokens"] = add_special_tokens
        elif self.add_bos_token is not None:
            special["add_special_tokens"] = self.add_bos_token
        if add_special_tokens is None and string.startswith(self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    def get_model_info(self) -> dict:
        return {"model": self.pretrained, "runtime_dtype": str(self.llm.engine.runner.dtype),
                "kv_cache_dtype": self.llm.engine.capacity.dtype}

    # --- scoring ---
    def _loglikelihood_tokens(self, requests: Seq[Request], disable_tqdm: bool = False,
                              **kwargs) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding gives the continuation)."""
        windows, firsts = [], []
        for _, context, continuation in requests:
            if not context or not 0 < len(continuation) <= self.max_length:
                raise QuantkitError(f"a loglikelihood request needs a context and a continuation of 1 .. "
                                    f"{self.max_length} tokens, got {len(context)} and {len(continuation)}")
            window = (context + continuation)[-(self.max_length + 1):]
            windows.append(window)
            firsts.append(len(window) - len(continuation))
        params = [SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0, prompt_logprobs_from=first)
                  for first in firsts]
        order = context_turns([tuple(w[:f]) for w, f in zip(windows, firsts)])
        outs = self._run([windows[i] for i in order], [params[i] for i in order], "Scoring loglikelihoods",
                         disable_tqdm)
        by_request = dict(zip(order, outs))
        answers = []
        for i, (strings, _, _) in enumerate(requests):
            scored = by_request[i].prompt_logprobs[firsts[i]:]
            answer = (sum(s.logprob for s in scored), all(s.is_greedy for s in scored))
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, answer)
            answers.append(answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's total log-probability over HFLM's disjoint rolling windows, every window of every text
        in one engine run."""
        windows: list[Request] = []
        owners: list[int] = []
        for i, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[i] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """The engine's generation (greedy unless do_sample) up to a stop string, EOS or max_gen_toks; the
        context loses tokens on the left to leave max_gen_toks of room, as in HFLM."""
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        prompts, params, stops = [], [], []
        for context, gen_kwargs in (req.args for req in requests):
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            room = self.max_length - max_gen_toks
            if room < 1:
                raise QuantkitError(f"max_gen_toks {max_gen_toks} leaves no room for a context within max_length "
                                    f"{self.max_length}")
            prompts.append(self.tok_encode(context)[-room:])
            params.append(_generation_params(kwargs, max_gen_toks, until))
            stops.append(until)
        outs = self._run(prompts, params, "Generating", disable_tqdm)
        texts = [postprocess_generated_text(out.text, until, None) for out, until in zip(outs, stops)]
        for req, text in zip(requests, texts):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return texts

    def _run(self, prompts: list[list[int]], params: list[SamplingParams], desc: str,
             disable_tqdm: bool) -> list[RequestOutput]:
        with tqdm(total=len(prompts), desc=desc, disable=disable_tqdm) as bar:
            return self.llm.generate(prompts, params, on_finished=lambda _: bar.update())


def context_turns(contexts: list[tuple[int, ...]]) -> list[int]:
    """Request indices in submission order: within each wave of CONTEXTS_PER_WAVE distinct contexts, every
    context's first request, then every second one, and so on."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, context in enumerate(contexts):
        groups.setdefault(context, []).append(i)
    members = list(groups.values())
    order: list[int] = []
    for lo in range(0, len(members), CONTEXTS_PER_WAVE):
        wave = members[lo:lo + CONTEXTS_PER_WAVE]
        for turn in range(max(len(g) for g in wave)):
            order.extend(g[turn] for g in wave if turn < len(g))
    return order


def _generation_params(kwargs: dict, max_tokens: int, until: list[str]) -> SamplingParams:
    sampled = bool(kwargs.get("do_sample")) and kwargs.get("temperature", 0.0) > 0
    extra = dict(temperature=kwargs["temperature"], top_p=kwargs.get("top_p") or 1.0,
                 top_k=kwargs.get("top_k") or -1, seed=kwargs.get("seed")) if sampled else dict(temperature=0)
    return SamplingParams(max_tokens=max_tokens, stop=until, **extra)
