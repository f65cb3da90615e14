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
    rows = run_bench(str(tiny_model), str(data), [str(data)], 4, 64, 1, ["rtn-w4a16-g64", str(recipe)], False,
                     Console(file=io.StringIO()), keep=tmp_path / "work")
    # each checkpoint lands in the work directory under the recipe's name, never over the recipe file
    assert [Path(r["path"]) for r in rows] == [tmp_path / "work" / "rtn-w4a16-g64", tmp_path / "work" / "my-rtn"]
    assert recipe.read_text().startswith("name: my-rtn")
    for row in rows:
        assert (Path(row["path"]) / "model.safetensors").is_file()
        assert math.isfinite(row["perplexity"]) and row["perplexity"] > 1 and row["wall_s"] > 0
        assert row["delta_low"] <= row["delta"] <= row["delta_high"] and row["delta_low"] < row["delta_high"]


def test_several_seeds_draw_several_calibration_sets_and_summarize_each_method(tiny_model, tmp_path):
    from safetensors.torch import load_file

    from quantkit.bench.quantize import summarize_over_seeds

    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(40))
    recipe = tmp_path / "tiny-gptq.yaml"
    recipe.write_text("name: tiny-gptq\nquantization: {method: gptq}\nweights: {bits: 4, group_size: 32}\n")
    out = io.StringIO()
    rows = run_bench(str(tiny_model), str(data), [str(data)], 4, 64, 1, [str(recipe)], False,
                     Console(file=out, width=200), keep=tmp_path / "work", seeds=[0, 5])
    work = tmp_path / "work"
    assert [(r["name"], r["seed"], Path(r["path"])) for r in rows] == [
        (f"quantkit {recipe}", 0, work / "tiny-gptq-seed0"), (f"quantkit {recipe}", 5, work / "tiny-gptq-seed5")]
    tokens = [load_file(work / f"calib-seed{s}" / "samples.safetensors") for s in (0, 5)]
    assert not all(a.equal(b) for a, b in zip(tokens[0].values(), tokens[1].values()))  # two different draws
    weights = [load_file(Path(r["path"]) / "model.safetensors") for r in rows]
    assert any(not weights[0][k].equal(weights[1][k]) for k in weights[0] if k.endswith("weight_packed"))
    (summary,) = summarize_over_seeds(rows)
    deltas = [r["delta"] for r in rows]
    assert summary["seeds"] == [0, 5]
    assert math.isclose(summary["delta_mean"], sum(deltas) / 2)
    assert (summary["delta_min"], summary["delta_max"]) == (min(deltas), max(deltas))
    assert "over calibration seeds 0, 5" in out.getvalue()


def test_each_held_out_set_gets_its_own_perplexity_and_the_first_is_the_headline(tiny_model, tmp_path):
    from quantkit.bench.quantize import summarize_over_seeds

    chats = write_jsonl(tmp_path / "chats.jsonl", chat_rows(24))
    prose = tmp_path / "prose.txt"
    prose.write_text(" ".join(f"Paragraph {i} of a plain English text about harbours and ships." for i in range(200)))
    recipe = tmp_path / "my-rtn.yaml"
    recipe.write_text("name: my-rtn\nquantization: {method: rtn}\nweights: {bits: 4, group_size: 32}\n")
    out = io.StringIO()
    rows = run_bench(str(tiny_model), str(chats), [str(chats), str(prose)], 4, 64, 1, [str(recipe)], False,
                     Console(file=out, width=2000), keep=tmp_path / "work", seeds=[0, 1])
    for row in rows:
        on_chats, on_prose = row["evals"][str(chats)], row["evals"][str(prose)]
        assert on_chats["perplexity"] != on_prose["perplexity"]  # two texts, scored separately
        assert (row["perplexity"], row["delta"]) == (on_chats["perplexity"], on_chats["delta"])
        assert on_prose["delta_low"] <= on_prose["delta"] <= on_prose["delta_high"]
    (summary,) = summarize_over_seeds(rows)
    prose_deltas = [r["evals"][str(prose)]["delta"] for r in rows]
    assert math.isclose(summary["evals"][str(prose)]["delta_mean"], sum(prose_deltas) / 2)
    assert math.isclose(summary["delta_mean"], summary["evals"][str(chats)]["delta_mean"])
    printed = out.getvalue()  # a column per set, in both tables
    assert printed.count(f"{prose}: vs fp16") == 2 and printed.count(f"{chats}: vs fp16") == 2


def test_each_row_gets_its_time_over_the_peers_for_the_same_method_and_draw():
    from quantkit.bench.quantize import _print, add_peer_time_ratios

    def row(name, method, seed, wall, **extra):
        result = {"perplexity": 30.0, "delta": 0.1, "delta_low": 0.09, "delta_high": 0.11}
        return {"name": name, "method": method, "seed": seed, "wall_s": wall, "peak_rss_mb": 1.0, **result,
                "evals": {"e": result}, **extra}

    rows = [row("quantkit gptq", "gptq", 0, 200.0), row("quantkit gptq", "gptq", 1, 300.0),
            row("quantkit rtn", "rtn", 0, 9.0), row("quantkit awq", "awq", 0, 50.0),
            row("llm-compressor gptq", "gptq", 0, 400.0, peer="llm-compressor"),
            row("llm-compressor gptq", "gptq", 1, 500.0, peer="llm-compressor")]
    add_peer_time_ratios(rows)
    assert [r.get("peer_time_ratio") for r in rows] == [0.5, 0.6, None, None, None, None]
    out = io.StringIO()
    _print(Console(file=out, width=200), "m", "c", 4, 64, 1, {"e": 27.0}, rows, [0, 1])
    assert "x peer's time" in out.getvalue() and "0.50x" in out.getvalue() and "0.60x" in out.getvalue()


def test_gptq_recipes_are_compared_with_the_peers_gptq_in_their_own_symmetry():
    from quantkit.bench.quantize import peer_method
    from quantkit.recipes import load_recipe

    assert peer_method(load_recipe("gptq-w4a16-g64-sym")) == "gptq"  # llm-compressor's W4A16 preset
    assert peer_method(load_recipe("gptq-w4a16-g64-actorder")) == "gptq-asym"  # W4A16_ASYM
    assert peer_method(load_recipe("awq-w4a16-g64")) == "awq"
    assert peer_method(load_recipe("rtn-w4a16-g64")) == "rtn"
