import pytest
import yaml

from quantkit.errors import QuantkitError
from quantkit.eval.lm_tasks import TaskRunner, read_task
from quantkit.models import load_model, load_tokenizer


def test_bare_data_file_is_rewritten_to_an_absolute_path(eval_task):
    spec, config = read_task(eval_task)
    assert spec.name == "tiny_mc" and spec.metric == "acc"
    assert config["dataset_kwargs"]["data_files"] == str(eval_task.with_suffix(".jsonl").resolve())
    runner = TaskRunner([(spec, config)])
    try:
        written = yaml.safe_load(next(iter(__import__("pathlib").Path(runner._dir.name).glob("*.yaml"))).read_text())
        assert written["dataset_kwargs"]["data_files"] == config["dataset_kwargs"]["data_files"]
    finally:
        runner.close()


def test_missing_data_file_names_task_and_key(tmp_path, eval_task):
    bad = tmp_path / "bad.yaml"
    bad.write_text(eval_task.read_text().replace("tiny_mc.jsonl", "missing.jsonl"))
    with pytest.raises(QuantkitError, match=r"bad.yaml: 'dataset_kwargs.data_files': data file .*missing.jsonl"):
        read_task(bad)


def test_runs_offline_with_per_item_scores(tiny_model, eval_task, monkeypatch):
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("network access during an offline eval")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    runner = TaskRunner([read_task(eval_task)])
    try:
        scores = runner.run(load_model(tiny_model), load_tokenizer(tiny_model), limit=3)
        chosen = runner.item_ids(limit=3)["tiny_mc"]
    finally:
        runner.close()
    assert list(scores) == ["tiny_mc"] and sorted(scores["tiny_mc"].scores) == chosen
    assert len(chosen) == 3 and set(chosen) <= {0, 1, 2, 3}  # a seeded sample across the 4 items
    assert set(scores["tiny_mc"].scores.values()) <= {0.0, 1.0}
    # three choices per item, and each item's gold answer is a different string
    assert scores["tiny_mc"].chance == pytest.approx(1 / 3) and scores["tiny_mc"].majority == pytest.approx(1 / 3)
    import os

    assert os.environ["HF_DATASETS_OFFLINE"] == os.environ["HF_EVALUATE_OFFLINE"] == "1"
