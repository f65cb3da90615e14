import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from quantkit.eval.gates import evaluate_gates
from quantkit.eval.report import EvalResult, to_junit, write_report
from quantkit.eval.stats import Estimate, Measurement
from quantkit.eval.suite import Gates


def m(metric, value, low, high, scope="all"):
    return Measurement(metric, scope, 1.0, 1.0, Estimate(value, low, high, 10), "sequences", 100)


@pytest.mark.parametrize("fail_when, interval, passed", [
    ("interval_crosses", (8, 12), False), ("interval_beyond", (8, 12), True),
    ("interval_beyond", (11, 12), False), ("interval_crosses", (1, 9), True)])
def test_max_gate_compares_the_interval(fail_when, interval, passed):
    gates = Gates(name="g", gates={"perplexity_increase_pct": {"max": 10, "fail_when": fail_when}})
    [result] = evaluate_gates(gates, [m("perplexity_increase_pct", 9.5, *interval)])
    assert result.passed is passed


def test_min_gate_and_point_estimate_without_interval():
    gates = Gates(name="g", gates={"top1_agreement": {"min": 0.9}, "layer_sqnr_min_db": {"min": 5}})
    results = evaluate_gates(gates, [m("top1_agreement", 0.95, 0.89, 0.97),
                                     m("layer_sqnr_min_db", math.inf, None, None, "layers")])
    assert [r.passed for r in results] == [False, True]


def test_per_dataset_rows_are_gated_and_unmeasured_gates_skip():
    gates = Gates(name="g", gates={"kl_mean": {"max": 0.1}, "accuracy_drop_points": {"max": 5}})
    results = evaluate_gates(gates, [m("kl_mean", 0.05, 0.04, 0.06), m("kl_mean", 0.3, 0.2, 0.4, "pile_style_en:eval")])
    assert [(r.scope, r.passed, r.skipped) for r in results] == [
        ("all", True, False), ("pile_style_en:eval", False, False), ("-", True, True)]


def test_task_gate_is_non_inferiority_and_skips_tasks_at_chance():
    gates = Gates(name="g", gates={"accuracy_drop_points": {"max": 5}})

    def task(scope, drop, low, high, gated=True):
        return Measurement("accuracy_drop_points", scope, 0.6, 0.6 - drop / 100, Estimate(drop, low, high, 500),
                           "items", gated=gated)

    results = evaluate_gates(gates, [task("arc_easy", 1.0, -2.0, 4.0), task("piqa", 3.0, 0.5, 5.5),
                                     task("winogrande", 20.0, 15.0, 25.0, gated=False)])
    # piqa's drop is not proven above 5 points, but it is not shown within them either: it fails
    assert [(r.scope, r.passed) for r in results] == [("arc_easy", True), ("piqa", False)]


def _result(tmp_path):
    gates = Gates(name="default", gates={"kl_mean": {"max": 0.1}, "top1_agreement": {"min": 0.9},
                                         "accuracy_drop_points": {"max": 5}})
    measurements = [m("kl_mean", 0.5, 0.4, 0.6), m("top1_agreement", 0.95, 0.93, 0.97)]
    header = {"baseline": {"ref": "b"}, "candidate": {"ref": "c"}, "suite": {"name": "s"}, "gates": {"name": "default"},
              "confidence": 0.95, "resamples": 100, "sample_sizes": "tokens: 10 sequences"}
    return EvalResult(header, measurements, evaluate_gates(gates, measurements),
                      {"sqnr_db": [30.0, math.inf], "attention_js": [0.01, 0.0]}, np.array([0.1, 0.2, 3.0]))


def test_junit_has_one_testcase_per_gate_with_failures_marked(tmp_path):
    root = ET.fromstring(to_junit(_result(tmp_path)))
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["kl_mean[all]", "top1_agreement[all]", "accuracy_drop_points[-]"]
    assert [c.find("failure") is not None for c in cases] == [True, False, False]
    assert cases[2].find("skipped") is not None
    assert root.find("testsuite").get("failures") == "1"


def test_report_files(tmp_path):
    write_report(_result(tmp_path), tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "quantkit.eval.report/1" and report["passed"] is False
    assert report["layers"]["sqnr_db"] == [30.0, "inf"]
    assert report["measurements"][0]["n"] == 10 and report["gates"][0]["compared"] == 0.6
    md = (tmp_path / "report.md").read_text()
    assert "FAIL (1 of 3 gates)" in md and "tokens: 10 sequences" in md and "| kl_mean | all |" in md
    for png in ("layers.png", "kl_histogram.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
