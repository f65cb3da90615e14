"""OpenAI request bodies as pydantic models, and OpenAI's error JSON.

Fields OpenAI clients send that change nothing here (user, presence_penalty at 0, ...) are ignored;
fields that would change the answer and are not supported (n > 1, chat logprobs, streamed echo or logprobs)
are refused with 400 instead of being silently dropped. Completions take echo + logprobs + max_tokens 0, the
legacy way to score a prompt (lm-eval's local-completions loglikelihood).
"""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # vLLM's extension
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension; benchmarks use it for fixed output lengths
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n must be 1 (several choices per request are not supported)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


MAX_LOGPROBS = 20  # vLLM's default cap on alternatives per token


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # the prompt before the completion, in text and (with logprobs) in logprobs
    max_tokens: int | None = Field(None, ge=0)  # 0: nothing generated, only with echo (serving checks)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # alternatives per token, besides the token

    @model_validator(mode="after")
    def _prompt(self):
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        if self.stream and (self.echo or self.logprobs is not None):
            raise ValueError("echo and logprobs are not supported with stream=true")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None

    def as_template_dict(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _no_logprobs(self):
        if self.logprobs not in (None, False):
            raise ValueError("logprobs are not supported for chat completions (use /v1/completions)")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            503: "service_unavailable"}.get(status, "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)
