import pytest

from quantkit.errors import QuantkitError
from quantkit.eval.benchmarks import BENCHMARKS
from quantkit.eval.power import items_needed
from quantkit.eval.suite import load_gates, load_suite, task_configs
from quantkit.recipes import shipped_recipe_names


def test_shipped_suite_and_gate_load_and_are_not_recipes():
    suite, _ = load_suite("default")
    gates, _ = load_gates("default")
    assert suite.token_metrics.datasets[0] == "pile_style_en:eval"
    assert set(suite.tasks) <= set(BENCHMARKS) and sum(suite.task_items().values()) >= 3000
    assert {"perplexity_increase_pct", "top1_agreement", "accuracy_drop_points"} <= set(gates.gates)
    assert not any(n.startswith(("suite", "gate")) for n in shipped_recipe_names())


@pytest.mark.parametrize("name", ["default", "quick"])
def test_each_shipped_suite_resolves_its_gate_margin(name):
    suite, _ = load_suite(name)
    margin = load_gates(name)[0].gates["accuracy_drop_points"].max
    needed = items_needed(margin, suite.task_power.discordance, suite.bootstrap.confidence, suite.task_power.power)
    assert min(suite.task_items().values()) >= needed


def test_accuracy_gate_must_be_non_inferiority(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("name: g\ngates: {accuracy_drop_points: {max: 5, fail_when: interval_beyond}}\n")
    with pytest.raises(QuantkitError, match="non-inferiority"):
        load_gates(str(path))


@pytest.mark.parametrize("text, expected", [
    ("name: g\ngates: {perplexity_jump: {max: 3}}\n", "'gates': unknown metric 'perplexity_jump'"),
    ("name: g\ngates: {top1_agreement: {max: 0.9}}\n", "takes a min bound"),
    ("name: g\ngates: {kl_mean: {max: 1, min: 0}}\n", "exactly one of max or min"),
    ("name: g\ngates: {kl_mean: {max: 1}}\nextra: 1\n", "'extra': unknown key"),
    ("name: g\ngates: {kl_mean: {max: 1, fail_when: sometimes}}\n", "'gates.kl_mean.fail_when'"),
])
def test_bad_gate_files_name_file_and_key(tmp_path, text, expected):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(QuantkitError) as exc:
        load_gates(str(path))
    assert str(path) in str(exc.value) and expected in str(exc.value)


def test_missing_task_file_names_suite_and_entry(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text("name: s\ntasks: [no_such_task]\n")
    suite, suite_path = load_suite(str(path))
    with pytest.raises(QuantkitError, match=r"suite.yaml: 'tasks': unknown task 'no_such_task'"):
        task_configs(suite, suite_path)


def test_bad_suite_value_names_key(tmp_path, eval_task):
    path = tmp_path / "suite.yaml"
    path.write_text(f"name: s\ntasks: [{eval_task}]\ntoken_metrics: {{max_seq_len: 1}}\n")
    with pytest.raises(QuantkitError, match="'token_metrics.max_seq_len'"):
        load_suite(str(path))


def test_unknown_suite_name():
    with pytest.raises(QuantkitError, match="suite 'nope' not found"):
        load_suite("nope")
