"""`quantkit calibrate` on the tiny model: outputs, and every bad input as one line + exit 2 + nothing written."""

import json

import pytest
from safetensors.torch import load_file

from quantkit.calibration import run as calibration_run
from quantkit.calibration.run import load_samples
from tests.conftest import chat_rows, write_jsonl


def _assert_one_line_error(code, err, *fragments):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _no_leftovers(out):
    return not out.exists() and not list(out.parent.glob(f".{out.name}.partial-*"))


def test_calibrate_writes_stats_samples_coverage_and_manifest(tiny_model, tmp_path, run_cli):
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(30))
    traffic = write_jsonl(tmp_path / "traffic.jsonl", chat_rows(12, task="refund", lang="zh"))
    out = tmp_path / "calib"
    code, stdout, err = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--traffic", traffic,
                                "--num-samples", 10, "--max-seq-len", 32, "--out", out)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"]["count"] == 10 and manifest["samples"]["truncated"] > 0
    assert len(manifest["dataset"]["sha256"]) == 64
    samples = load_samples(out)
    assert len(samples) == 10 and max(map(len, samples)) == 32
    stats = load_file(out / "stats.safetensors")
    assert stats["model.layers.1.mlp.down_proj.input_absmax"].shape == (128,)
    assert stats["model.layers.0.self_attn.k_absmax"].shape == (2,)
    coverage = json.loads((out / "coverage.json").read_text())
    assert coverage["poor_match"] and "POOR MATCH" in stdout
    assert "languages in traffic but not in the calibration set: zh" in err


def test_existing_output_is_refused_then_replaced_with_overwrite(tiny_model, tmp_path, run_cli):
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(6))
    out = tmp_path / "calib"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--out", out)
    _assert_one_line_error(code, err, "already exists", "--overwrite")
    assert (out / "keep.txt").read_text() == "mine"
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--out", out,
                           "--num-samples", 4, "--overwrite")
    assert code == 0, err
    assert not (out / "keep.txt").exists() and (out / "manifest.json").exists()


@pytest.mark.parametrize("content, fragments", [
    (None, ["not found"]),
    ("", ["is empty"]),
    ('{"text": "ok"}\n{"text": \n', ["bad.jsonl:2", "malformed JSON"]),
    ('{"text": "ok"}\n{"task": "qa", "lang": "en"}\n', ["bad.jsonl:2", "no usable text"]),
])
def test_bad_dataset_is_one_line_exit_2_and_writes_nothing(tiny_model, tmp_path, run_cli, content, fragments):
    data = tmp_path / "bad.jsonl"
    if content is not None:
        data.write_text(content)
    out = tmp_path / "out"
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--out", out)
    _assert_one_line_error(code, err, *fragments)
    assert _no_leftovers(out)


def test_max_seq_len_beyond_model_limit(tiny_model, tmp_path, run_cli):
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(4))
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--out", tmp_path / "o",
                           "--max-seq-len", 4096)
    _assert_one_line_error(code, err, "--max-seq-len 4096", "limit of 256")


def test_unknown_model(tmp_path, run_cli):
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(4))
    code, _, err = run_cli("calibrate", "--model", "no-such-model", "--dataset", data, "--out", tmp_path / "o")
    _assert_one_line_error(code, err, "model 'no-such-model' not found")


def test_fewer_records_than_requested_warns_and_uses_all(tiny_model, tmp_path, run_cli):
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(3))
    out = tmp_path / "o"
    code, _, err = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--out", out, "--num-samples", 50)
    assert code == 0
    assert "only 3 records available" in err
    assert json.loads((out / "manifest.json").read_text())["samples"]["count"] == 3


def test_interrupted_run_leaves_no_directory(tiny_model, tmp_path, run_cli, monkeypatch):
    real = calibration_run.collect_statistics

    def interrupted(model, input_ids, on_layer=None):
        def stop_after_first_layer(done, total):
            raise KeyboardInterrupt
        return real(model, input_ids, stop_after_first_layer)

    monkeypatch.setattr(calibration_run, "collect_statistics", interrupted)
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(6))
    out = tmp_path / "o"
    code, _, _ = run_cli("calibrate", "--model", tiny_model, "--dataset", data, "--out", out)
    assert code != 0
    assert _no_leftovers(out)
