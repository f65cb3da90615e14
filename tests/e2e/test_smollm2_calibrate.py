"""End to end on the real embedded model (SmolLM2-135M-Instruct), with few samples."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e
QUANTKIT = [sys.executable, "-c", "from quantkit.cli import main; main()"]


def test_two_processes_racing_to_convert_get_one_complete_directory(tmp_path):
    env = os.environ | {"QUANTKIT_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([*QUANTKIT, "models", "show", "smollm2-135m", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
    infos = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert infos[0]["path"] == infos[1]["path"] == str(tmp_path / "cache" / "models" / "smollm2-135m")
    assert infos[0]["num_layers"] == 30 and infos[0]["group_sizes_that_fit"] == [32, 64]
    assert 134_000_000 < infos[0]["num_parameters"] < 135_000_000
    leftovers = [p.name for p in (tmp_path / "cache" / "models").iterdir() if p.name != "smollm2-135m"
                 and not p.name.endswith(".lock")]
    assert leftovers == []


def test_calibrate_real_model_with_shipped_set_flags_zh_traffic(smollm2, tmp_path, run_cli):
    out = tmp_path / "calib"
    code, stdout, err = run_cli("calibrate", "--model", "smollm2-135m", "--dataset", "support_chat_en",
                                "--traffic", "customer_service_zh:eval", "--num-samples", 6,
                                "--max-seq-len", 128, "--out", out)
    assert code == 0, err
    stats = load_file(out / "stats.safetensors")
    assert len([k for k in stats if k.endswith(".input_absmax")]) == 30 * 7
    for i in range(30):
        k = stats[f"model.layers.{i}.self_attn.k_absmax"]
        assert k.shape == (3,) and bool((k > 0).all()) and bool(k.isfinite().all())
    coverage = json.loads((out / "coverage.json").read_text())
    assert coverage["poor_match"]
    assert any("languages in traffic but not in the calibration set: zh" in w for w in coverage["warnings"])
    assert coverage["jsd_unigram"] > 0.3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"]["count"] == 6 and manifest["model"]["path"] == str(smollm2)


def test_sigint_mid_run_leaves_no_directory(smollm2, tmp_path):
    out = tmp_path / "calib"
    proc = subprocess.Popen([*QUANTKIT, "calibrate", "--dataset", "pile_style_en", "--num-samples", "64",
                             "--max-seq-len", "512", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".calib.partial-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert list(tmp_path.glob(".calib.partial-*")), "the run never started writing"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
