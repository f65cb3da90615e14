"""`quantkit eval` on the real model: the quick suite's token and task gates both fail RTN 2-bit, and FP16
against itself passes with every delta exactly 0. What each gate catches across the whole ladder of
candidates is `quantkit bench gate` (docs/evaluation.md)."""

import json

import pytest

pytestmark = pytest.mark.e2e
RTN2 = """name: rtn-w2a16-g64
quantization: {method: rtn}
weights: {bits: 2, group_size: 64, symmetric: false}
"""


@pytest.fixture(scope="module")
def rtn2(smollm2, tmp_path_factory):
    from quantkit.quantize.run import QuantizeOptions, quantize

    root = tmp_path_factory.mktemp("ckpts")
    (root / "rtn2.yaml").write_text(RTN2)
    quantize(QuantizeOptions(model="smollm2-135m", recipe=str(root / "rtn2.yaml"), out=root / "rtn2"))
    return root / "rtn2"


def _eval(run_cli, candidate, report):
    code, out, err = run_cli("eval", "--baseline", "smollm2-135m", "--candidate", candidate, "--report", report,
                             "--quick")
    return code, json.loads((report / "report.json").read_text()) if (report / "report.json").exists() else None, err


def test_quick_gate_fails_rtn_2bit_on_tokens_and_on_a_task(rtn2, tmp_path, run_cli):
    code, report, err = _eval(run_cli, rtn2, tmp_path / "r")
    assert code == 1, err
    failed = {(g["metric"], g["scope"]) for g in report["gates"] if not g["passed"]}
    assert {("perplexity_increase_pct", "all"), ("kl_mean", "all"), ("top1_agreement", "all")} <= failed
    assert any(metric == "accuracy_drop_points" for metric, _ in failed), failed


def test_fp16_against_itself_passes_with_every_delta_zero(smollm2, tmp_path, run_cli):
    code, report, err = _eval(run_cli, smollm2, tmp_path / "r")
    assert code == 0, err
    assert all(g["passed"] and not g["skipped"] for g in report["gates"])
    for m in report["measurements"]:
        if m["metric"] in ("perplexity_increase_pct", "kl_mean", "kl_p99", "accuracy_drop_points"):
            assert m["value"] == 0, m
        elif m["metric"] == "top1_agreement":
            assert m["value"] == 1, m


def test_candidate_with_another_tokenizer_is_refused(smollm2, tmp_path, run_cli):
    from tests.conftest import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    code, out, err = run_cli("eval", "--baseline", "smollm2-135m", "--candidate", tiny, "--report", tmp_path / "r")
    assert code == 2 and "different tokenizer" in err.strip().splitlines()[-1]
    assert not (tmp_path / "r").exists()
