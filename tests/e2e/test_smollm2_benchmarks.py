"""The standard benchmarks on the real model: quantkit scores each item as `lm_eval --model hf` does."""

import json
import subprocess
import sys

import pytest

from quantkit.eval.lm_tasks import TaskRunner, benchmark_task, go_offline
from quantkit.models import load_model, load_tokenizer

pytestmark = pytest.mark.e2e


def test_per_item_scores_equal_lm_eval_hf_on_the_same_items(smollm2, tmp_path):
    runner = TaskRunner([benchmark_task("arc_easy"), benchmark_task("piqa")])
    try:
        items = runner.item_ids(limit=24)
        ours = runner.run(load_model(smollm2), load_tokenizer(smollm2), limit=24, batch_size=8)
        go_offline()
        subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf",
                        "--model_args", f"pretrained={smollm2},dtype=float32", "--tasks", "arc_easy,piqa",
                        "--include_path", str(runner.include_dir), "--samples", json.dumps(items),
                        "--batch_size", "8", "--log_samples", "--output_path", str(tmp_path / "out")],
                       check=True, capture_output=True, text=True)
    finally:
        runner.close()
    for task, metric in (("arc_easy", "acc"), ("piqa", "acc_norm")):
        [samples_file] = tmp_path.glob(f"out/**/samples_{task}_*.jsonl")
        theirs = {json.loads(line)["doc_id"]: json.loads(line)[metric] for line in samples_file.read_text().splitlines()}
        assert sorted(theirs) == items[task] and len(items[task]) == 24
        assert ours[task].scores == {i: float(theirs[i]) for i in items[task]}, task
    assert ours["arc_easy"].chance == pytest.approx(0.25, abs=0.02) and ours["piqa"].chance == 0.5
