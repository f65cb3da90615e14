"""The task-level eval data in quantkit/eval/tasks/: schema, answer balance, executed Python answers, and
disjointness from the calibration sets. Fast, no model, no lm-eval import."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
TASKS_DIR = ROOT / "quantkit" / "eval" / "tasks"
CALIB_DIR = ROOT / "calib_sets"
NGRAM = 8
MC_FIELDS = {
    "support_intent_mc": ("message",),
    "product_docs_qa_mc": ("title", "passage", "question"),
    "python_output_mc": ("code",),
}
GEN_FIELDS = {"meeting_owner_gen": ("notes", "action")}
TASKS = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def _items(task: str) -> list[dict]:
    with open(TASKS_DIR / f"{task}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _config(task: str) -> dict:
    # lm-eval YAMLs may carry `!function` tags; ours do not, so safe_load must accept them as they are.
    return yaml.safe_load((TASKS_DIR / f"{task}.yaml").read_text())


def test_every_task_is_covered_and_the_package_is_data_only():
    assert set(TASKS) == set(MC_FIELDS) | set(GEN_FIELDS)
    assert (TASKS_DIR / "__init__.py").read_text().strip() == ""
    assert (TASKS_DIR / "README.md").is_file()


@pytest.mark.parametrize("task", TASKS)
def test_yaml_points_at_its_own_jsonl_by_bare_name(task):
    cfg = _config(task)
    assert cfg["task"] == task
    assert cfg["dataset_path"] == "json"
    assert cfg["dataset_kwargs"] == {"data_files": f"{task}.jsonl"}
    assert cfg["test_split"] == "train"
    expected = "multiple_choice" if task in MC_FIELDS else "generate_until"
    assert cfg["output_type"] == expected


@pytest.mark.parametrize("task", TASKS)
def test_items_parse_and_are_unique(task):
    items = _items(task)
    assert len(items) >= 100
    ids = [it["id"] for it in items]
    assert len(set(ids)) == len(ids)
    fields = MC_FIELDS.get(task) or GEN_FIELDS[task]
    keys = [tuple(it[f] for f in fields) for it in items]
    assert len(set(keys)) == len(keys), "duplicate items"
    for it in items:
        assert all(isinstance(it[f], str) and it[f].strip() for f in fields), it["id"]


@pytest.mark.parametrize("task", sorted(MC_FIELDS))
def test_multiple_choice_schema_and_balanced_answers(task):
    items = _items(task)
    for it in items:
        choices = it["choices"]
        assert len(choices) == 4, it["id"]
        assert len(set(choices)) == 4, f"{it['id']}: repeated choice"
        assert all(isinstance(c, str) and c for c in choices), it["id"]
        assert isinstance(it["answer"], int) and 0 <= it["answer"] < 4, it["id"]
    counts = collections.Counter(it["answer"] for it in items)
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_generation_items_have_a_short_answer_that_appears_in_the_notes():
    for it in _items("meeting_owner_gen"):
        assert it["answer"] and " " not in it["answer"] and "\n" not in it["answer"], it["id"]
        assert it["answer"] in it["notes"], it["id"]
        assert it["action"] in it["notes"], it["id"]
        # exactly one line carries the asked action, so the owner is unambiguous
        assert sum(it["action"] in line for line in it["notes"].splitlines()) == 1, it["id"]


def test_python_output_answers_are_what_the_snippets_print():
    items = _items("python_output_mc")
    # One interpreter runs every snippet in its own namespace; a snippet that hangs trips the timeout.
    runner = (
        "import contextlib, io, json, sys\n"
        "out = []\n"
        "for code in json.load(sys.stdin):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        exec(code, {'__builtins__': __builtins__})\n"
        "    out.append(buf.getvalue())\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", runner],
        input=json.dumps([it["code"] for it in items]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=TASKS_DIR,
    )
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    for it, out in zip(items, printed, strict=True):
        assert it["choices"][it["answer"]] == out.rstrip("\n"), it["id"]
        assert out.rstrip("\n") not in [c for i, c in enumerate(it["choices"]) if i != it["answer"]], it["id"]


def _ngrams(text: str) -> set[tuple[str, ...]]:
    toks = text.split()
    return {tuple(toks[i : i + NGRAM]) for i in range(len(toks) - NGRAM + 1)}


def _strings(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def test_no_task_item_shares_an_8_gram_with_calibration_data():
    calib: set[tuple[str, ...]] = set()
    files = sorted(CALIB_DIR.glob("*/train.jsonl")) + sorted(CALIB_DIR.glob("*/eval.jsonl"))
    assert len(files) >= 12
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                for s in _strings(json.loads(line)):
                    calib |= _ngrams(s)
    hits = []
    for task in TASKS:
        for it in _items(task):
            text = "\n".join(_strings(it))
            shared = _ngrams(text) & calib
            if shared:
                hits.append((task, it["id"], " ".join(next(iter(shared)))))
        # the few-shot description in the YAML is task text too
        shared = _ngrams(str(_config(task).get("description", ""))) & calib
        if shared:
            hits.append((task, "description", " ".join(next(iter(shared)))))
    assert not hits, hits[:10]
