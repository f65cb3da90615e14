"""OpenAI completions and chat completions over the engine loop: validate, tokenize, submit, then either
collect the outputs into one JSON body or stream them as server-sent events.

A request that leaves before it finishes (client disconnect, cancelled handler) is aborted, which frees
its KV blocks. Tokenization happens here, on the HTTP side, with a tokenizer of its own: the engine
thread keeps its tokenizer for detokenizing.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from quantkit.errors import QuantkitError
from quantkit.runtime.outputs import RequestOutput
from quantkit.runtime.sampling_params import SamplingParams
from quantkit.runtime.server.engine_loop import Admitted, EngineLoop, Failed, Refused, Submission
from quantkit.runtime.server.protocol import (ChatCompletionRequest, CompletionRequest, SamplingRequest,
                                              error_response)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
RETRY_AFTER_S = 1
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; nobody is left to read it


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Call:
    """One HTTP call: its submissions (one per choice) and how to shape the answer."""
    chat: bool
    response_id: str
    submissions: list[Submission]
    stream: bool
    include_usage: bool
    echo: list[str] | None = None  # completions with echo: each prompt's text, put before its completion
    logprobs: int | None = None  # completions: alternatives per token in each choice's logprobs
    # max_tokens 0 (with echo): the engine samples one token after any prompt; it is dropped from the answer.
    prompt_only: bool = False


class OpenAIServing:
    def __init__(self, engine_loop: EngineLoop, tokenizer, model_name: str, max_model_len: int, vocab_size: int):
        self.engine_loop = engine_loop
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    # --- building the call ---
    def completion_call(self, req: CompletionRequest) -> Call:
        self._check_model(req)
        if req.max_tokens == 0 and not req.echo:
            raise BadRequest("max_tokens must be >= 1 (0 only with echo, to score the prompt)", "max_tokens")
        prompts = [self._encode(p) if isinstance(p, str) else self._checked_ids(p) for p in req.prompts]
        prompt_only = req.max_tokens == 0
        scoring = {}
        if req.logprobs is not None:
            scoring = dict(logprobs=req.logprobs, prompt_logprobs=req.logprobs if req.echo else None)
        call = self._call(req, prompts, "prompt", 1 if prompt_only else req.max_tokens, chat=False, **scoring)
        echo = [p if isinstance(p, str) else self.tokenizer.decode(p) for p in req.prompts] if req.echo else None
        return replace(call, echo=echo, logprobs=req.logprobs, prompt_only=prompt_only)

    def chat_call(self, req: ChatCompletionRequest) -> Call:
        self._check_model(req)
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("this model has no chat template; use /v1/completions", "messages")
        messages = [m.as_template_dict() for m in req.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja templates raise their own errors on messages they refuse
            raise BadRequest(f"the chat template refused these messages: {exc}", "messages") from exc
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self._call(req, [ids], "messages", req.requested_max_tokens, chat=True)

    def _check_model(self, req: SamplingRequest) -> None:
        if req.model is not None and req.model != self.model_name:
            raise ModelNotFound(req.model)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def _checked_ids(self, ids: list[int]) -> list[int]:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:  # the embedding lookup would fail inside the engine step, for the whole batch
            raise BadRequest(f"token id {bad} is out of range: the vocabulary has {self.vocab_size} ids", "prompt")
        return list(ids)

    def _call(self, req: SamplingRequest, prompts: list[list[int]], param: str, max_tokens: int | None,
              chat: bool, **scoring) -> Call:
        submissions = []
        prefix = "chatcmpl" if chat else "cmpl"
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        for index, ids in enumerate(prompts):
            tokens = self._max_tokens(len(ids), max_tokens, param, chat)
            try:
                params = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                                        max_tokens=tokens, stop=req.stop_list, stop_token_ids=req.stop_token_ids,
                                        ignore_eos=req.ignore_eos, **scoring)
            except QuantkitError as exc:
                raise BadRequest(str(exc)) from exc
            submissions.append(Submission(f"{response_id}-{index}", ids, params))
        return Call(chat, response_id, submissions, req.stream, req.include_usage)

    def _max_tokens(self, prompt_len: int, requested: int | None, param: str, chat: bool) -> int:
        if prompt_len == 0:
            raise BadRequest("the prompt is empty", param)
        room = self.max_model_len - prompt_len
        if room < 1 or (requested is not None and requested > room):
            asked = prompt_len + (requested or 0)
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                             f"requested {asked} tokens ({prompt_len} in the {param}, {requested or 0} in the "
                             "completion). Please reduce the length of the prompt or completion.", param)
        if requested is not None:
            return requested
        return room if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)

    # --- running it ---
    async def run(self, call: Call, request: Request) -> Response:
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.engine_loop.submit(call.submissions, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        try:
            first = await events.get()
        except asyncio.CancelledError:  # the handler went (shutdown) before admission: admitted later, it must end
            self.engine_loop.abort([s.request_id for s in call.submissions])
            raise
        if isinstance(first, Refused):
            return error_response(503, f"the server is busy: {first.num_waiting} requests are waiting; retry later",
                                  headers={"Retry-After": str(RETRY_AFTER_S)})
        if isinstance(first, Failed):
            return error_response(500, first.message)
        assert isinstance(first, Admitted)
        if call.stream:
            pending = {s.request_id for s in call.submissions}
            return _AbortingStream(self._stream(call, events, pending), lambda: self._abort(pending))
        return await self._collect_or_abort(call, events, request)

    def _abort(self, pending: set[str]) -> None:
        if pending:
            self.engine_loop.abort(sorted(pending))
            pending.clear()

    async def _collect_or_abort(self, call: Call, events: asyncio.Queue, request: Request) -> Response:
        pending = {s.request_id for s in call.submissions}
        collect = asyncio.ensure_future(self._collect(call, events, pending))
        left = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({collect, left}, return_when=asyncio.FIRST_COMPLETED)
            if collect.done():
                return collect.result()
            return Response(status_code=CLIENT_CLOSED)
        finally:
            collect.cancel()
            left.cancel()
            self._abort(pending)

    async def _collect(self, call: Call, events: asyncio.Queue, pending: set[str]) -> Response:
        final: dict[str, RequestOutput] = {}
        while pending:
            ev = await events.get()
            if isinstance(ev, Failed):
                return error_response(500, ev.message)
            if ev.finished:
                pending.discard(ev.request_id)
                final[ev.request_id] = ev
        outs = [final[s.request_id] for s in call.submissions]
        if call.chat:
            choices = [_choice(True, i, out.text, out.finish_reason) for i, out in enumerate(outs)]
        else:
            choices = [self._completion_choice(call, i, out) for i, out in enumerate(outs)]
        body = _envelope(call, self.model_name, choices, final=True)
        body["usage"] = _usage(outs, call.prompt_only)
        return JSONResponse(body)

    def _completion_choice(self, call: Call, index: int, out: RequestOutput) -> dict:
        """text: echoed prompt + completion; logprobs in the legacy completions shape (vLLM's): per token its
        text, its logprob (None for the first prompt token, which has no prefix), its top alternatives plus
        itself, and its character offset."""
        token_ids, records = [], []
        if call.echo is not None:
            token_ids += out.prompt_token_ids
            records += out.prompt_logprobs or [None] * len(out.prompt_token_ids)
        if not call.prompt_only:
            token_ids += out.token_ids
            records += out.logprobs or [None] * len(out.token_ids)
        text = "" if call.prompt_only else out.text
        choice = _choice(False, index, (call.echo[index] if call.echo is not None else "") + text,
                         "length" if call.prompt_only else out.finish_reason)
        if call.logprobs is not None:
            choice["logprobs"] = self._legacy_logprobs(token_ids, records)
        return choice

    def _legacy_logprobs(self, token_ids: list[int], records: list) -> dict:
        tokens = [self.tokenizer.decode([t]) for t in token_ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        top = [None if r is None else {self.tokenizer.decode([t]): lp for t, lp in (*r.top, (r.token_id, r.logprob))}
               for r in records]
        return {"tokens": tokens, "token_logprobs": [None if r is None else r.logprob for r in records],
                "top_logprobs": top, "text_offset": offsets}

    async def _stream(self, call: Call, events: asyncio.Queue, pending: set[str]) -> AsyncIterator[str]:
        index = {s.request_id: i for i, s in enumerate(call.submissions)}
        finished: list[RequestOutput] = []
        try:
            if call.chat:  # OpenAI's first chat chunk carries the role and no content
                for i in range(len(index)):
                    yield _sse(self._chunk(call, [_delta_choice(True, i, "", None, role=True)]))
            while pending:
                ev = await events.get()
                if isinstance(ev, Failed):
                    yield _sse({"error": {"message": ev.message, "type": "server_error", "code": 500}})
                    return
                if ev.finished:
                    pending.discard(ev.request_id)
                    finished.append(ev)
                if ev.delta_text or ev.finished:
                    choice = _delta_choice(call.chat, index[ev.request_id], ev.delta_text,
                                           ev.finish_reason if ev.finished else None)
                    yield _sse(self._chunk(call, [choice]))
            if call.include_usage:
                chunk = self._chunk(call, [])
                chunk["usage"] = _usage(finished)
                yield _sse(chunk)
            yield "data: [DONE]\n\n"
        finally:  # the client left (the generator is cancelled or closed) before every choice finished
            self._abort(pending)

    def _chunk(self, call: Call, choices: list[dict]) -> dict:
        chunk = _envelope(call, self.model_name, choices, final=False)
        if call.include_usage:
            chunk["usage"] = None
        return chunk


class _AbortingStream(StreamingResponse):
    """An SSE response that aborts what is still pending however it ends: the generator's own cleanup
    does not run when the client leaves before the first chunk is pulled from it."""

    def __init__(self, body: AsyncIterator[str], on_close):
        super().__init__(body, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class ModelNotFound(Exception):
    def __init__(self, model: str):
        super().__init__(model)
        self.model = model


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _envelope(call: Call, model: str, choices: list[dict], final: bool) -> dict:
    if call.chat:
        kind = "chat.completion" if final else "chat.completion.chunk"
    else:
        kind = "text_completion"
    return {"id": call.response_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}


def _choice(chat: bool, index: int, text: str, reason: str | None) -> dict:
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": reason}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}


def _delta_choice(chat: bool, index: int, text: str, reason: str | None, role: bool = False) -> dict:
    if not chat:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
    delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}


def _usage(outs: list[RequestOutput], prompt_only: bool = False) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = 0 if prompt_only else sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
