"""Prompts for generation benchmarks: a fixed, seeded draw from the shipped eval sets, rendered the way a
user would send them (a chat up to its last assistant turn, with the generation prompt; a pair's prompt; the
opening of a text) and tokenized by quantkit, so every engine continues the very same token ids."""

from __future__ import annotations

import random
from dataclasses import dataclass

from quantkit.data.readers import read_records
from quantkit.data.records import Record

# Chat, prompt/completion and plain-text sets, in English (the embedded model's language).
PROMPT_SETS = ("support_chat_en:eval", "coding_python:eval", "meeting_notes_en:eval", "rag_product_docs_en:eval",
               "pile_style_en:eval")
TEXT_OPENING_TOKENS = 64  # a text record is continued from inside its first paragraph


@dataclass(frozen=True)
class Prompt:
    source: str  # the record's "file:line"
    dataset: str
    token_ids: list[int]


def draw_prompts(tokenizer, count: int = 20, max_tokens: int = 256, seed: int = 0,
                 datasets: tuple[str, ...] = PROMPT_SETS) -> list[Prompt]:
    """`count` prompts spread evenly over `datasets` (the first sets get one more when it does not divide),
    each set drawn with its own seeded generator so adding a set leaves the others' draws unchanged."""
    prompts = []
    for i, dataset in enumerate(datasets):
        records = read_records(dataset)
        share = min(count // len(datasets) + (i < count % len(datasets)), len(records))
        rng = random.Random(f"{seed}:{dataset}")
        for index in sorted(rng.sample(range(len(records)), share)):
            ids = prompt_ids(records[index], tokenizer)
            # Keep the end: for chats it holds the assistant header the model continues from.
            prompts.append(Prompt(records[index].where, dataset, ids[-max_tokens:]))
    return prompts


def prompt_ids(record: Record, tokenizer) -> list[int]:
    """The token ids a model continues for one record."""
    templated = bool(getattr(tokenizer, "chat_template", None))
    if record.shape == "text":
        return tokenizer(record.text)["input_ids"][:TEXT_OPENING_TOKENS]
    if not templated:
        return tokenizer(record.prompt or record.plain_text())["input_ids"]
    if record.shape == "pair":
        messages = [{"role": "user", "content": record.prompt}]
    else:
        turns = list(record.messages)
        last_reply = max((i for i, (role, _) in enumerate(turns) if role == "assistant"), default=len(turns))
        messages = [{"role": role, "content": content} for role, content in turns[:last_reply]]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
