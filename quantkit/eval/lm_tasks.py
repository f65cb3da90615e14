"""Task-level accuracy through lm-eval, offline, with every item's score kept so baseline and candidate can
be paired item by item.

A task is one of:
- a standard benchmark (``hellaswag``, ``arc_easy``, ...): lm-eval's own definition on local data
  (quantkit/eval/benchmarks.py);
- a task YAML of our own or the user's, naming its data by file name next to the YAML
  (``dataset_kwargs.data_files: gk_mc.jsonl``). lm-eval resolves data files against the working directory,
  so the YAML is rewritten with absolute paths.
Every task is written into one temporary include directory that a TaskManager without lm-eval's built-in
index reads. Items are a seeded sample across the whole split, the same for both models.
"""

from __future__ import annotations

import logging
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from quantkit.errors import QuantkitError
from quantkit.eval.benchmarks import BENCHMARKS

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
    sources: tuple[Path, ...]  # the files its items come from (part of the baseline's cache key)
    items: int | None = None  # how many to score; None: all


@dataclass
class TaskScores:
    """One model's per-item scores on one task, with what the task's chance level is on those items."""
    scores: dict[int, float]  # doc id -> the task's metric
    chance: float | None = None  # expected score of a uniform guess (mean of 1 / choices); None: not MC
    majority: float | None = None  # share of the most common gold answer text; None: not known

    def to_json(self) -> dict:
        return {"scores": self.scores, "chance": self.chance, "majority": self.majority}

    @classmethod
    def from_json(cls, data: dict) -> TaskScores:
        return cls({int(d): s for d, s in data["scores"].items()}, data["chance"], data["majority"])


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
    return TaskSpec(config["task"], metric, (path, *paths)), config


def benchmark_task(name: str) -> tuple[TaskSpec, dict]:
    benchmark = BENCHMARKS[name]
    config = benchmark.config()
    return TaskSpec(name, benchmark.metric, (Path(config["include"]), *benchmark.data_files())), config


@dataclass
class TaskRunner:
    """Tasks written into a temporary include directory; run() scores one model on all of them."""
    tasks: list[tuple[TaskSpec, dict]]
    seed: int = 0
    specs: list[TaskSpec] = field(init=False)
    sizes: dict[str, int] = field(init=False, default_factory=dict)  # documents in each task's split

    def __post_init__(self):
        self.specs = [spec for spec, _ in self.tasks]
        names = [s.name for s in self.specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise QuantkitError(f"two task files define task '{duplicates[0]}'")
        self._dir = tempfile.TemporaryDirectory(prefix="quantkit-tasks-")
        for spec, config in self.tasks:
            Path(self._dir.name, f"{spec.name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def close(self) -> None:
        self._dir.cleanup()

    @property
    def include_dir(self) -> Path:
        return Path(self._dir.name)

    def _manager(self):
        go_offline()
        _quiet_lm_eval()
        from lm_eval.tasks import TaskManager

        return TaskManager(include_path=self._dir.name, include_defaults=False)

    def item_ids(self, limit: int | None = None) -> dict[str, list[int]]:
        """Per task, the documents scored: a seeded sample across the split of min(items, limit) documents,
        in document order (all of them when neither is set)."""
        if not self.sizes and self.specs:
            tasks = self._manager().load([s.name for s in self.specs])["tasks"]
            self.sizes = {name: len(task.eval_docs) for name, task in tasks.items()}
        chosen = {}
        for spec in self.specs:
            size = self.sizes[spec.name]
            caps = [n for n in (spec.items, limit) if n]
            count = min([size, *caps])
            rng = np.random.default_rng([self.seed, _stable_hash(spec.name)])
            ids = np.arange(size) if count == size else np.sort(rng.choice(size, count, replace=False))
            chosen[spec.name] = [int(i) for i in ids]
        return chosen

    def run(self, model, tokenizer, limit: int | None = None, batch_size: int = 1) -> dict[str, TaskScores]:
        """Per task, per document id, the task's metric for this model."""
        if not self.specs:
            return {}
        go_offline()
        _quiet_lm_eval()  # before HFLM warns that it was handed a model object, which is how quantkit calls it
        from lm_eval.models.huggingface import HFLM

        return self.run_lm(HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size), limit)

    def run_lm(self, lm, limit: int | None = None) -> dict[str, TaskScores]:
        """The same for any lm-eval LM object (e.g. local-completions against `quantkit serve`)."""
        from lm_eval import simple_evaluate

        samples = self.item_ids(limit)
        results = simple_evaluate(model=lm, tasks=[s.name for s in self.specs], samples=samples, log_samples=True,
                                  task_manager=self._manager(), bootstrap_iters=0,
                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
        return {spec.name: _task_scores(spec, results["samples"][spec.name]) for spec in self.specs}


def _task_scores(spec: TaskSpec, samples: list[dict]) -> TaskScores:
    scores = {int(s["doc_id"]): float(s[spec.metric]) for s in samples}
    if not samples or not all(s.get("arguments") and len(s["arguments"]) > 1 for s in samples):
        return TaskScores(scores)  # not multiple choice: no chance level to state
    per_choice = 2 if spec.metric == "acc_mutual_info" else 1  # it adds one unconditional request per choice
    chance = float(np.mean([per_choice / len(s["arguments"]) for s in samples]))
    golds = [_gold_answer(s) for s in samples]
    majority = None
    if all(g is not None for g in golds):
        majority = max(golds.count(g) for g in set(golds)) / len(golds)
    return TaskScores(scores, chance, majority)


def _gold_answer(sample: dict) -> str | None:
    """The gold choice's text: a model that always prefers one answer (" yes", " A") scores the share of
    the most common one. Choices are scored each on its own, so their position does not matter."""
    continuations = [arg[1] for arg in sample["arguments"]]
    target = sample["target"]
    if isinstance(target, int) and 0 <= target < len(continuations):
        return continuations[target]
    matches = [c for c in continuations if isinstance(target, str) and c.strip() == target.strip()]
    return matches[0] if len(matches) == 1 else None  # winogrande: the choices differ in context, not answer


def _stable_hash(name: str) -> int:
    return zlib.crc32(name.encode())  # Python's hash() of a str changes between processes


def _quiet_lm_eval() -> None:
    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import datasets

    datasets.disable_progress_bars()  # one bar per split loaded, on every run
