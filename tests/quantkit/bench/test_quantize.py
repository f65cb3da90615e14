"""`quantkit bench quantize` on the tiny model: one row per recipe, shipped names and YAML paths alike."""

import io
import math
from pathlib import Path

from rich.console import Console

from quantkit.bench.quantize import run_bench
from tests.conftest import chat_rows, write_jsonl


def test_rows_for_a_shipped_recipe_and_a_recipe_file(tiny_model, tmp_path):
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(24))
    recipe = tmp_path / "my-rtn.yaml"
    recipe.write_text("name: my-rtn\nquantization: {method: rtn}\nweights: {bits: 4, group_size: 32}\n")
    rows = run_bench(str(tiny_model), str(data), str(data), 4, 64, 1, ["rtn-w4a16-g64", str(recipe)], False,
                     Console(file=io.StringIO()), keep=tmp_path / "work")
    # each checkpoint lands in the work directory under the recipe's name, never over the recipe file
    assert [Path(r["path"]) for r in rows] == [tmp_path / "work" / "rtn-w4a16-g64", tmp_path / "work" / "my-rtn"]
    assert recipe.read_text().startswith("name: my-rtn")
    for row in rows:
        assert (Path(row["path"]) / "model.safetensors").is_file()
        assert math.isfinite(row["perplexity"]) and row["perplexity"] > 1 and row["wall_s"] > 0
        assert row["delta_low"] <= row["delta"] <= row["delta_high"] and row["delta_low"] < row["delta_high"]
