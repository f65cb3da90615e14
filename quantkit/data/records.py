"""One calibration record, in any of the three accepted shapes, validated with its source location.

Shapes:
- chat: ``{"messages": [{"role": ..., "content": ...}, ...]}``
- pair: ``{"prompt": ..., "completion": ...}`` (completion may be empty)
- text: ``{"text": ...}`` as in pile-style corpora
Each may carry ``task`` and ``lang`` tags; missing tags become "unknown".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from quantkit.errors import QuantkitError

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Record:
    where: str  # "file:line", so every later error can name the source
    shape: str  # "chat" | "pair" | "text"
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    completion: str = ""
    text: str = ""
    task: str = "unknown"
    lang: str = "unknown"

    def plain_text(self) -> str:
        """The record's words without any template, for statistics that must not depend on a tokenizer."""
        if self.shape == "chat":
            return "\n".join(content for _, content in self.messages)
        if self.shape == "pair":
            return f"{self.prompt}\n{self.completion}"
        return self.text


def parse_record(obj: object, where: str) -> Record:
    if not isinstance(obj, dict):
        raise QuantkitError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    task = _tag(obj.get("task"), "task", where)
    lang = _tag(obj.get("lang"), "lang", where)
    messages = obj.get("messages")
    if isinstance(messages, str):  # csv / parquet cells carry the list as a JSON string
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise QuantkitError(f"{where}: 'messages' is not valid JSON: {exc.msg}") from exc
    if messages is not None:
        return Record(where, "chat", messages=_parse_messages(messages, where), task=task, lang=lang)
    if obj.get("prompt") is not None:
        prompt, completion = obj.get("prompt"), obj.get("completion") or ""
        if not isinstance(prompt, str) or not isinstance(completion, str) or not prompt.strip():
            raise QuantkitError(f"{where}: 'prompt' must be non-empty text and 'completion' text")
        return Record(where, "pair", prompt=prompt, completion=completion, task=task, lang=lang)
    text = obj.get("text")
    if isinstance(text, str) and text.strip():
        return Record(where, "text", text=text, task=task, lang=lang)
    raise QuantkitError(
        f"{where}: record has no usable text",
        hint="each record needs 'messages', 'prompt'/'completion' or a non-empty 'text'",
    )


def _parse_messages(messages: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise QuantkitError(f"{where}: 'messages' must be a non-empty list")
    parsed = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in ROLES or not isinstance(content, str):
            raise QuantkitError(f"{where}: messages[{i}] needs a role in {ROLES} and text content")
        parsed.append((role, content))
    if not any(content.strip() for _, content in parsed):
        raise QuantkitError(f"{where}: record has no usable text (every message is empty)")
    return tuple(parsed)


def _tag(value: object, name: str, where: str) -> str:
    if value is None or value == "":
        return "unknown"
    if not isinstance(value, str):
        raise QuantkitError(f"{where}: '{name}' must be a string")
    return value
