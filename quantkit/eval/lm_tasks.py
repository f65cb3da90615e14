"""Task-level accuracy through lm-eval, offline: local task YAML + JSONL, our loaded model objects.

A task YAML names its data by bare file name (``dataset_kwargs.data_files: gk_mc.jsonl``), next to the
YAML. lm-eval resolves data files against the working directory, so each task is rewritten into a
temporary include directory with absolute paths. Both models go through the same HFLM adapter, and
every item's score is kept so baseline and candidate can be paired item by item.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from quantkit.errors import QuantkitError

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_EVALUATE_OFFLINE": "1", "HF_UPDATE_DOWNLOAD_COUNTS": "0"}
# Per-item scores that are a plain number per document; the first one a task lists is the one gated.
SCALAR_METRICS = ("acc", "acc_norm", "exact_match", "acc_mutual_info", "f1", "mcc")
DEFAULT_METRIC = {"multiple_choice": "acc", "generate_until": "exact_match"}


def go_offline() -> None:
    """Set the offline switches; call before lm_eval, datasets or transformers read them. Modules imported
    earlier in this process read the environment at import, so their flags are set too."""
    os.environ.update(OFFLINE_ENV)
    import sys

    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_DATASETS_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True


@dataclass(frozen=True)
class TaskSpec:
    name: str
    metric: str
    source: Path  # the task YAML as shipped
    data_files: tuple[Path, ...]


def read_task(path: Path) -> tuple[TaskSpec, dict]:
    """A task YAML checked for what we need, and its config with data file paths made absolute."""
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise QuantkitError(f"{path}: invalid task YAML ({getattr(exc, 'problem', exc)})") from exc
    if not isinstance(config, dict) or not isinstance(config.get("task"), str):
        raise QuantkitError(f"{path}: 'task': a task YAML needs a task name")
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if files is None:
        raise QuantkitError(f"{path}: 'dataset_kwargs.data_files': missing (name the JSONL next to the YAML)")

    def absolute(name: str) -> str:
        data = Path(name) if Path(name).is_absolute() else path.parent / name
        if not data.is_file():
            raise QuantkitError(f"{path}: 'dataset_kwargs.data_files': data file {data} does not exist")
        return str(data.resolve())

    if isinstance(files, dict):
        files = {split: absolute(f) if isinstance(f, str) else [absolute(x) for x in f] for split, f in files.items()}
        paths = [Path(p) for f in files.values() for p in ([f] if isinstance(f, str) else f)]
    elif isinstance(files, list):
        files = [absolute(f) for f in files]
        paths = [Path(f) for f in files]
    else:
        files = absolute(files)
        paths = [Path(files)]
    config["dataset_kwargs"] = {**config["dataset_kwargs"], "data_files": files}
    listed = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, dict)]
    metric = next((m for m in listed if m in SCALAR_METRICS), DEFAULT_METRIC.get(config.get("output_type")))
    if metric is None:
        raise QuantkitError(f"{path}: 'metric_list': no per-item score to pair "
                            f"(need one of {', '.join(SCALAR_METRICS)})")
    return TaskSpec(config["task"], metric, path, tuple(paths)), config


class TaskRunner:
    """Rewritten tasks in a temporary include directory; run() scores one model on all of them."""

    def __init__(self, task_files: list[Path]):
        read = [read_task(path) for path in task_files]
        self.specs = [spec for spec, _ in read]
        names = [s.name for s in self.specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise QuantkitError(f"two task files define task '{duplicates[0]}'")
        self._dir = tempfile.TemporaryDirectory(prefix="quantkit-tasks-")
        for spec, config in read:
            Path(self._dir.name, f"{spec.name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def close(self) -> None:
        self._dir.cleanup()

    def run(self, model, tokenizer, limit: int | None = None, batch_size: int = 1) -> dict[str, dict[int, float]]:
        """Per task, per document id, the task's metric for this model."""
        if not self.specs:
            return {}
        go_offline()
        _quiet_lm_eval()  # before HFLM warns that it was handed a model object, which is how quantkit calls it
        from lm_eval.models.huggingface import HFLM

        return self.run_lm(HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size), limit)

    def run_lm(self, lm, limit: int | None = None) -> dict[str, dict[int, float]]:
        """The same for any lm-eval LM object (e.g. local-completions against `quantkit serve`)."""
        go_offline()
        _quiet_lm_eval()
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=self._dir.name, include_defaults=False, verbosity="ERROR")
        results = simple_evaluate(model=lm, tasks=[s.name for s in self.specs], limit=limit, log_samples=True,
                                  task_manager=manager, bootstrap_iters=0, verbosity="ERROR",
                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
        scores = {}
        for spec in self.specs:
            samples = results["samples"][spec.name]
            scores[spec.name] = {int(s["doc_id"]): float(s[spec.metric]) for s in samples}
        return scores


def _quiet_lm_eval() -> None:
    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.ERROR)


def measurements(baseline: dict[str, dict[int, float]], candidate: dict[str, dict[int, float]],
                 bootstrap) -> list:
    """Per task: each model's accuracy and the drop in points, paired over the items both were scored on."""
    import numpy as np

    from quantkit.eval.stats import Measurement, paired_bootstrap

    rows = []
    for task, base_scores in baseline.items():
        items = sorted(set(base_scores) & set(candidate.get(task, {})))
        base = np.array([base_scores[i] for i in items])
        cand = np.array([candidate[task][i] for i in items])
        drop = paired_bootstrap(len(items), lambda idx: (base[idx].mean() - cand[idx].mean()) * 100,
                                resamples=bootstrap.resamples, confidence=bootstrap.confidence, seed=bootstrap.seed)
        rows.append(Measurement("accuracy_drop_points", task, float(base.mean()), float(cand.mean()), drop, "items"))
    return rows
