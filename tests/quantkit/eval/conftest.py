"""Eval fixtures: a small suite and task on the tiny random model, and a perturbed copy of that model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

MC_ROWS = [
    {"question": "How do I reset my password?", "choices": ["settings", "order", "meeting"], "answer": 0},
    {"question": "When does the order arrive?", "choices": ["March", "Friday", "never"], "answer": 1},
    {"question": "What does the API return?", "choices": ["200", "404", "429"], "answer": 2},
    {"question": "Who owns the checklist?", "choices": ["Dana", "Bob", "Eve"], "answer": 0},
]
MC_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files: tiny_mc.jsonl
test_split: train
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def write_task(directory: Path, name: str = "tiny_mc") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MC_ROWS))
    path = directory / f"{name}.yaml"
    path.write_text(MC_YAML.replace("tiny_mc", name))
    return path


def write_suite(directory: Path, tasks: list[str], **overrides) -> Path:
    suite = {"name": "tiny",
             "token_metrics": {"datasets": ["support_chat_en:eval", "pile_style_en:eval"], "max_seq_len": 48,
                               "records": 3},
             "layer_metrics": {"dataset": "pile_style_en:eval", "num_samples": 2, "max_seq_len": 24},
             "tasks": tasks, "bootstrap": {"resamples": 200}} | overrides
    path = directory / "suite.yaml"
    path.write_text(json.dumps(suite))  # JSON is YAML
    return path


@pytest.fixture(scope="session")
def eval_task(tmp_path_factory) -> Path:
    return write_task(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="session")
def perturbed_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with noise on every decoder linear and a sharper output (final norm x 4): visibly
    different next-token distributions, same tokenizer."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("perturbed")
    for file in tiny_model.iterdir():
        shutil.copy(file, out / file.name)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in name and p.ndim == 2:
                p.add_(torch.randn_like(p) * p.std() * 0.5)
        model.model.norm.weight.mul_(4)
    model.save_pretrained(out)
    return out
