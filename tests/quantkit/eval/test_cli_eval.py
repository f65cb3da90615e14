"""`quantkit eval` end to end on the tiny random model: exit codes, report files, cache, bad input."""

import json
import shutil
import xml.etree.ElementTree as ET

import pytest

from tests.quantkit.eval.conftest import write_suite

GATES = """name: strict
gates:
  perplexity_increase_pct: {max: 5}
  kl_mean: {max: 0.01}
  top1_agreement: {min: 0.9}
  accuracy_drop_points: {max: 80}   # what 2 paired items resolve (76.7 points at discordance 0.15)
  attention_shift_max: {max: 0.05}
  layer_sqnr_min_db: {min: 20}
"""


@pytest.fixture
def setup(tmp_path, eval_task, monkeypatch):
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "gate.yaml").write_text(GATES)
    return write_suite(tmp_path, [str(eval_task)]), tmp_path / "gate.yaml"


def test_identical_models_pass_every_gate_and_reuse_the_cached_baseline(tiny_model, setup, tmp_path, run_cli):
    suite, gate = setup
    args = ["eval", "--baseline", tiny_model, "--candidate", tiny_model, "--suite", suite, "--gate", gate]
    code, out, err = run_cli(*args, "--report", tmp_path / "r1")
    assert code == 0, err
    report = json.loads((tmp_path / "r1" / "report.json").read_text())
    assert report["passed"] and not report["baseline_cached"]
    # token gates per dataset (2) and pooled, the task gate, the layer gates
    assert len(report["gates"]) == 3 * 3 + 1 + 2
    assert all(g["passed"] and not g["skipped"] for g in report["gates"])
    task = next(m for m in report["measurements"] if m["metric"] == "accuracy_drop_points")
    assert task["details"]["chance"] == 1 / 3 and task["details"]["discordance"] == 0
    rows = {(m["metric"], m["scope"]): m for m in report["measurements"]}
    assert rows["kl_mean", "all"]["value"] == 0 and rows["top1_agreement", "all"]["value"] == 1
    assert rows["layer_sqnr_min_db", "layers"]["value"] == "inf"
    assert rows["accuracy_drop_points", "tiny_mc"]["n"] == 4
    assert sorted(p.name for p in (tmp_path / "r1").iterdir()) == [
        "junit.xml", "kl_histogram.png", "layers.png", "report.json", "report.md"]
    code, out, err = run_cli(*args, "--report", tmp_path / "r2")
    assert code == 0 and json.loads((tmp_path / "r2" / "report.json").read_text())["baseline_cached"]
    code, _, err = run_cli(*args, "--report", tmp_path / "r2")
    assert code == 2 and "already exists" in err


def test_perturbed_model_fails_the_token_and_layer_gates(tiny_model, perturbed_model, setup, tmp_path, run_cli):
    suite, gate = setup
    code, out, err = run_cli("eval", "--baseline", tiny_model, "--candidate", perturbed_model, "--suite", suite,
                             "--gate", gate, "--report", tmp_path / "r", "--limit", 2)
    assert code == 1, err
    failed = {g["metric"] for g in json.loads((tmp_path / "r" / "report.json").read_text())["gates"]
              if not g["passed"]}
    assert {"kl_mean", "layer_sqnr_min_db", "perplexity_increase_pct"} <= failed
    assert "accuracy_drop_points" not in failed  # 4 items: the interval cannot establish a 50-point drop
    cases = ET.parse(tmp_path / "r" / "junit.xml").getroot().findall(".//testcase")
    assert {c.get("name").split("[")[0] for c in cases if c.find("failure") is not None} == failed
    assert "FAIL" in out and "kl_mean[all]" in out  # the scope survives rich markup


def test_different_tokenizer_is_refused(tiny_model, setup, tmp_path, run_cli, capsys):
    from tests.conftest import build_tiny_model

    other = tmp_path / "other"
    build_tiny_model(other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first, second = list(vocab)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    capsys.readouterr()
    suite, gate = setup
    code, out, err = run_cli("eval", "--baseline", tiny_model, "--candidate", other, "--suite", suite,
                             "--report", tmp_path / "r")
    assert code == 2 and "different tokenizer" in err and "4 entries differ" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_bad_gate_and_missing_task_are_one_line_exit_2(tiny_model, setup, tmp_path, run_cli):
    suite, _ = setup
    bad_gate = tmp_path / "bad-gate.yaml"
    bad_gate.write_text("name: g\ngates: {accuracy_jump: {max: 1}}\n")
    code, _, err = run_cli("eval", "--baseline", tiny_model, "--candidate", tiny_model, "--suite", suite,
                           "--gate", bad_gate, "--report", tmp_path / "r")
    assert code == 2 and "unknown metric 'accuracy_jump'" in err and str(bad_gate) in err
    missing = write_suite(tmp_path, ["no_such_task"])
    code, _, err = run_cli("eval", "--baseline", tiny_model, "--candidate", tiny_model, "--suite", missing,
                           "--report", tmp_path / "r")
    assert code == 2 and "unknown task 'no_such_task'" in err
    assert len(err.strip().splitlines()) == 1


def test_a_task_margin_finer_than_the_items_resolve_is_refused(tiny_model, setup, tmp_path, run_cli):
    suite, gate = setup
    gate.write_text(GATES.replace("max: 80", "max: 5"))
    code, _, err = run_cli("eval", "--baseline", tiny_model, "--candidate", tiny_model, "--suite", suite,
                           "--gate", gate, "--report", tmp_path / "r")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'accuracy_drop_points.max': 5 points is finer than task 'tiny_mc' resolves with 4 items" in err
    assert "it needs 471 items" in err and not (tmp_path / "r").exists()


def test_runtime_engine_scores_the_tasks_as_the_transformers_path(tiny_model, setup, tmp_path, run_cli):
    suite, gate = setup
    reports = {}
    for engine in ("transformers", "runtime"):
        code, _, err = run_cli("eval", "--baseline", tiny_model, "--candidate", tiny_model, "--suite", suite,
                               "--gate", gate, "--engine", engine, "--task-dtype", "float32",
                               "--report", tmp_path / engine)
        assert code == 0, err
        reports[engine] = json.loads((tmp_path / engine / "report.json").read_text())
    assert reports["runtime"]["engine"] == "runtime" and not reports["runtime"]["baseline_cached"]
    task = {e: next(m for m in r["measurements"] if m["metric"] == "accuracy_drop_points") for e, r in reports.items()}
    assert task["runtime"]["baseline"] == task["transformers"]["baseline"] and task["runtime"]["value"] == 0


@pytest.mark.parametrize("option, value, expected", [("--task-dtype", "float16", "--task-dtype 'float16'"),
                                                      ("--engine", "vllm", "--engine 'vllm'")])
def test_unknown_task_dtype_or_engine_is_one_line_exit_2(tiny_model, setup, tmp_path, run_cli, option, value,
                                                          expected):
    suite, gate = setup
    code, _, err = run_cli("eval", "--baseline", tiny_model, "--candidate", tiny_model, "--suite", suite,
                           "--gate", gate, option, value, "--report", tmp_path / "r")
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
