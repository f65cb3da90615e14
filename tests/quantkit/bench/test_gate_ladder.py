"""quantkit bench gate: each candidate changes exactly what it claims, builds are reused, the table renders from
hand-made results, and a two-row ladder runs end to end on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from quantkit.bench.gate_ladder import (BUILD_RECORD, CANDIDATES, COLUMNS, BuildSpec, build_candidate,
                                        deviations_from_identity, markdown, pick_layer, select_candidates,
                                        summarize, table_cells)
from quantkit.errors import QuantkitError

BY_NAME = {c.name: c for c in CANDIDATES}


@pytest.fixture(scope="module")
def spec(tiny_model) -> BuildSpec:
    return BuildSpec(tiny_model, pick_layer(tiny_model, None), None)


def build(name: str, spec: BuildSpec, root: Path, **kwargs):
    return build_candidate(BY_NAME[name], spec, root, **kwargs)


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def changed_names(base: dict, other: dict) -> list[str]:
    assert base.keys() == other.keys()
    assert all(other[n].dtype == t.dtype and other[n].shape == t.shape for n, t in base.items())
    return sorted(n for n, t in base.items() if not torch.equal(t, other[n]))


def most_distinct_values_per_group(weight: torch.Tensor, group: int = 64) -> int:
    grouped = weight.reshape(weight.shape[0], -1, group).reshape(-1, group)
    return max(len(torch.unique(row)) for row in grouped)


def test_middle_layer_is_the_default_and_out_of_range_layers_are_refused(tiny_model):
    assert pick_layer(tiny_model, None) == 1  # 2 layers
    with pytest.raises(QuantkitError, match="--layer 2 is out of range"):
        pick_layer(tiny_model, 2)


def test_fp16_row_is_the_base_directory_itself(spec, tmp_path):
    built = build("fp16", spec, tmp_path)
    assert built.path == spec.base_dir and built.build_seconds == 0 and not list(tmp_path.iterdir())


def test_break_down_proj_changes_only_that_layers_down_proj_to_four_values_a_group(spec, tmp_path):
    built = build("break-down-proj-2bit", spec, tmp_path)
    base, new = tensors(spec.base_dir), tensors(built.path)
    name = "model.layers.1.mlp.down_proj.weight"
    assert changed_names(base, new) == [name]
    assert most_distinct_values_per_group(new[name]) <= 4
    assert (built.path / "config.json").read_text() == (spec.base_dir / "config.json").read_text()
    assert (built.path / "tokenizer.json").is_file()
    record = json.loads((built.path / BUILD_RECORD).read_text())
    assert record["changed"] == [name] and record["build_seconds"] == built.build_seconds


def test_break_v_proj_scales_that_one_weight_by_one_and_a_quarter(spec, tmp_path):
    built = build("break-v-proj-scale", spec, tmp_path)
    base, new = tensors(spec.base_dir), tensors(built.path)
    name = "model.layers.1.self_attn.v_proj.weight"
    assert changed_names(base, new) == [name]
    assert torch.equal(new[name], base[name] * 1.25)


def test_rtn_w3_leaves_at_most_eight_values_per_group_in_every_decoder_linear(spec, tmp_path):
    built = build("rtn-w3-g64", spec, tmp_path)
    base, new = tensors(spec.base_dir), tensors(built.path)
    linears = [n for n, t in base.items() if ".layers." in n and t.ndim == 2]
    assert changed_names(base, new) == sorted(linears) and len(linears) == 2 * 7
    assert all(most_distinct_values_per_group(new[n]) <= 8 for n in linears)


def test_rtn_w4_goes_through_the_real_quantize_pipeline(spec, tmp_path):
    built = build("rtn-w4a16-g64", spec, tmp_path)
    config = json.loads((built.path / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"
    record = json.loads((built.path / BUILD_RECORD).read_text())
    assert record["recipe"] == "rtn-w4a16-g64" and (built.path / "recipe.yaml").is_file()


def test_a_built_candidate_is_reused_unless_its_inputs_change_or_a_rebuild_is_asked(spec, tmp_path):
    first = build("break-v-proj-scale", spec, tmp_path)
    again = build("break-v-proj-scale", spec, tmp_path)
    assert again.reused and again.build_seconds == first.build_seconds
    assert not build("break-v-proj-scale", spec, tmp_path, rebuild=True).reused
    other_layer = build("break-v-proj-scale", BuildSpec(spec.base_dir, 0, None), tmp_path)
    assert not other_layer.reused
    assert changed_names(tensors(spec.base_dir), tensors(other_layer.path)) == ["model.layers.0.self_attn.v_proj.weight"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_only_keeps_ladder_order_and_refuses_unknown_names():
    assert [c.name for c in select_candidates("break-v-proj-scale, fp16")] == ["fp16", "break-v-proj-scale"]
    with pytest.raises(QuantkitError, match="unknown candidate rtn-w5"):
        select_candidates("fp16,rtn-w5")


# ---- the table, from hand-made results ----------------------------------------------------------------------

def measurement(metric, scope, value, high=None, baseline=0.0, candidate=None):
    estimate = SimpleNamespace(value=value, low=None if high is None else value - 1, high=high, n=8)
    return SimpleNamespace(metric=metric, scope=scope, baseline=baseline,
                           candidate=value if candidate is None else candidate, estimate=estimate)


def gate(metric, scope, passed, skipped=False):
    return SimpleNamespace(metric=metric, scope=scope, passed=passed, skipped=skipped, compared=1.0, limit=0.5)


def result(measurements, gates, seconds=12.0):
    return SimpleNamespace(measurements=measurements, gates=gates, header={"wall_seconds": seconds},
                           passed=all(g.passed for g in gates))


def test_table_shows_headline_metrics_and_the_failed_gates_by_kind():
    broken = result(
        [measurement("perplexity_increase_pct", "all", 41.234, baseline=10.0, candidate=14.1),
         measurement("perplexity_increase_pct", "coding_python:eval", 80.0),
         measurement("kl_mean", "all", 0.41234), measurement("top1_agreement", "all", 0.61234, baseline=1.0),
         measurement("accuracy_drop_points", "support_intent_mc", 5.0, high=12.0, baseline=0.5, candidate=0.45),
         measurement("accuracy_drop_points", "python_output_mc", 12.5, high=27.5, baseline=0.5, candidate=0.375)],
        [gate("perplexity_increase_pct", "all", False), gate("kl_mean", "all", False),
         gate("kl_mean", "coding_python:eval", False), gate("top1_agreement", "all", True),
         gate("accuracy_drop_points", "support_intent_mc", True),
         gate("accuracy_drop_points", "python_output_mc", False), gate("layer_sqnr_min_db", "-", True, skipped=True)])
    built = SimpleNamespace(name="rtn-w2-g64", path=Path("c/rtn-w2-g64"), build_seconds=3.14, reused=True)
    row = summarize(built, broken)
    cells = dict(zip(COLUMNS, table_cells(row)))
    assert cells == {"candidate": "rtn-w2-g64", "ppl +%": "+41.23", "KL mean": "0.4123", "top-1 agree": "0.612",
                     "worst task drop pts (CI high)": "+12.5 (+27.5) python_output_mc",
                     "gates failed": "4/6 (1 skipped)",
                     "failed gates": "token: perplexity_increase_pct, kl_mean, kl_mean[coding_python:eval]; "
                                     "task: python_output_mc",
                     "result": "FAIL", "build s": "3.1 (reused)", "eval s": "12"}
    assert deviations_from_identity(broken)  # a broken model is not its baseline


def test_baseline_row_passes_with_nothing_measured_as_a_dash_and_renders_as_markdown():
    same = result([measurement("kl_mean", "all", 0.0, candidate=0.0),
                   measurement("top1_agreement", "all", 1.0, baseline=1.0, candidate=1.0)],
                  [gate("kl_mean", "all", True), gate("top1_agreement", "all", True)])
    row = summarize(SimpleNamespace(name="fp16", path=Path("base"), build_seconds=0.0, reused=False), same)
    cells = table_cells(row)
    assert cells[COLUMNS.index("ppl +%")] == "-" and cells[COLUMNS.index("worst task drop pts (CI high)")] == "-"
    assert cells[COLUMNS.index("failed gates")] == "-" and cells[COLUMNS.index("result")] == "PASS"
    assert deviations_from_identity(same) == []
    lines = markdown([row, row], "title").splitlines()
    assert lines[2] == "| " + " | ".join(COLUMNS) + " |" and len(lines) == 6 and lines[4].startswith("| fp16 | - |")


# ---- end to end on the tiny model ---------------------------------------------------------------------------

def test_two_candidates_through_the_real_eval(tiny_model, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path / "cache"))
    suite = tmp_path / "suite.yaml"  # JSON is YAML
    suite.write_text(json.dumps({"name": "tiny", "token_metrics": {"datasets": ["support_chat_en:eval"],
                                                                    "max_seq_len": 32},
                                 "layer_metrics": None, "tasks": [], "bootstrap": {"resamples": 50}}))
    gates = tmp_path / "gates.yaml"
    gates.write_text(json.dumps({"name": "tokens", "gates": {"kl_mean": {"max": 0.35},
                                                             "top1_agreement": {"min": 0.65}}}))
    args = ("bench", "gate", "--model", tiny_model, "--suite", suite, "--gates", gates,
            "--only", "fp16,break-v-proj-scale", "--limit", 4, "--out", tmp_path / "bench")
    code, out, err = run_cli(*args)
    assert code == 0, err
    report = json.loads((tmp_path / "bench" / "gate-ladder.json").read_text())
    fp16, broken = report["rows"]
    assert fp16["candidate"] == "fp16" and fp16["passed"] and fp16["kl_mean"] == 0 and fp16["top1_agreement"] == 1
    assert broken["path"] == str(tmp_path / "bench" / "candidates" / "break-v-proj-scale") and not broken["reused"]
    assert report["warnings"] == [] and (tmp_path / "bench" / "reports" / "break-v-proj-scale" / "report.json").is_file()
    assert "break-v-proj-scale" in (tmp_path / "bench" / "gate-ladder.md").read_text() and "fp16" in out
    code, _, err = run_cli(*args)  # a rerun only re-evaluates
    assert code == 0, err
    assert json.loads((tmp_path / "bench" / "gate-ladder.json").read_text())["rows"][1]["reused"]


def test_unknown_candidate_is_a_usage_error(run_cli, tmp_path):
    code, _, err = run_cli("bench", "gate", "--only", "nope", "--out", tmp_path)
    assert code == 2 and "unknown candidate nope" in err
