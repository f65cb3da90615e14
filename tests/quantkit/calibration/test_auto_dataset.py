"""`quantkit calibrate --dataset auto` through the CLI on the tiny model: the mix in the output and the
manifest, and each bad input as one line and exit 2."""

import json

import pytest

from tests.conftest import chat_rows, write_jsonl
from tests.quantkit.test_cli_calibrate import _assert_one_line_error, _no_leftovers


def _zh_rows(n):
    return [{"messages": [{"role": "user", "content": f"退款会在三到五个工作日内原路返回吗？订单{i}"},
                          {"role": "assistant", "content": "是的，退款会在三到五个工作日内原路返回。" * (1 + i % 3)}]}
            for i in range(n)]


def test_auto_picks_the_candidate_in_the_traffics_language(tiny_model, tmp_path, run_cli):
    en = write_jsonl(tmp_path / "en.jsonl", chat_rows(30))
    zh = write_jsonl(tmp_path / "zh.jsonl", _zh_rows(30))
    traffic = write_jsonl(tmp_path / "traffic.jsonl", _zh_rows(12))  # untagged
    out = tmp_path / "calib"
    code, stdout, err = run_cli("calibrate", "--model", tiny_model, "--dataset", f"auto:{en},{zh}",
                                "--traffic", traffic, "--num-samples", 8, "--max-seq-len", 32, "--out", out)
    assert code == 0, err
    mix = json.loads((out / "manifest.json").read_text())["mix"]
    assert mix["samples"] == {str(en): 0, str(zh): 8}
    assert set(mix["coverage"]) == {"pooled", f"best single: {zh}", "auto mix"}
    assert "Mix matched to traffic" in stdout and "best single" in stdout


def test_auto_without_traffic_is_one_line(tiny_model, tmp_path, run_cli):
    out = tmp_path / "calib"
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", "auto", "--out", out)
    _assert_one_line_error(code, err, "--traffic")
    assert _no_leftovers(out)


def test_unknown_candidate_is_one_line(tiny_model, tmp_path, run_cli):
    traffic = write_jsonl(tmp_path / "traffic.jsonl", chat_rows(4))
    out = tmp_path / "calib"
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", "auto:support_chat_en,no_such_set",
                           "--traffic", traffic, "--out", out)
    _assert_one_line_error(code, err, "no_such_set")
    assert _no_leftovers(out)


def test_empty_or_unreadable_traffic_is_one_line(tiny_model, tmp_path, run_cli):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    binary = tmp_path / "traffic.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for traffic, fragment in ((empty, "empty"), (binary, "UTF-8"), (tmp_path / "missing.jsonl", "not found")):
        out = tmp_path / "calib"
        code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", "auto:support_chat_en",
                               "--traffic", traffic, "--out", out)
        _assert_one_line_error(code, err, fragment)
        assert _no_leftovers(out)


def test_no_candidate_in_the_traffics_language_warns_and_still_picks(tiny_model, tmp_path, run_cli):
    en = write_jsonl(tmp_path / "en.jsonl", chat_rows(30))
    traffic = write_jsonl(tmp_path / "traffic.jsonl", _zh_rows(12))
    out = tmp_path / "calib"
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", f"auto:{en}", "--traffic", traffic,
                           "--num-samples", 4, "--max-seq-len", 32, "--out", out)
    assert code == 0, err
    assert "no candidate set contains the traffic's language 'zh' (100% of its records)" in err
    assert json.loads((out / "manifest.json").read_text())["mix"]["samples"] == {str(en): 4}


@pytest.mark.e2e
def test_auto_on_the_real_model_follows_code_traffic(smollm2, tmp_path, run_cli):
    out = tmp_path / "calib"
    code, _, err = run_cli("calibrate", "--model", smollm2, "--dataset",
                           "auto:coqa_chat_en,code_python_en,customer_service_zh", "--traffic", "code_python_en:eval",
                           "--num-samples", 8, "--max-seq-len", 64, "--out", out)
    assert code == 0, err
    mix = json.loads((out / "manifest.json").read_text())["mix"]
    assert mix["best_single"]["set"] == "code_python_en" and mix["samples"]["code_python_en"] >= 6
    assert mix["coverage"]["auto mix"]["jsd_unigram"] < mix["coverage"]["pooled"]["jsd_unigram"]
    assert (out / "stats.safetensors").is_file()
