from pathlib import Path

import pytest

from quantkit.bench import peers
from quantkit.bench.peers import LLMCOMPRESSOR, VLLM, Peer, peer_python


def test_stamps_name_every_pin_and_removal():
    # The llm-compressor stamp must stay what existing venvs hold, or they would all reinstall.
    assert LLMCOMPRESSOR.stamp() == "torch==2.13.0\nllmcompressor==0.14.0.1\n"
    assert VLLM.stamp() == "torch==2.13.0\nvllm-cpu==0.32.0\n-torchvision\n-torchaudio\n-torchcodec\n"


def _record_steps(monkeypatch) -> list[list[str]]:
    steps = []

    def step(message, cmd):
        steps.append(cmd)
        if cmd[:3] == ["python3", "-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").touch()

    monkeypatch.setattr(peers, "_step", step)
    return steps


def test_first_use_installs_in_order_then_the_stamp_skips_it(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    steps = _record_steps(monkeypatch)
    peer = Peer("demo", ("demo==1.0",), uninstall=("torchvision",))
    python = peer_python(peer)
    assert python == tmp_path / "peers" / "demo" / "bin" / "python"
    assert [cmd[-1] for cmd in steps] == [str(tmp_path / "peers" / "demo"), "torch==2.13.0", "demo==1.0",
                                          "torchvision"]
    assert steps[-1][3:5] == ["uninstall", "-y"]
    steps.clear()
    assert peer_python(peer) == python and steps == []
    # A changed pin reinstalls into the same venv, without recreating it.
    peer_python(Peer("demo", ("demo==2.0",), uninstall=("torchvision",)))
    assert [cmd[-1] for cmd in steps] == ["torch==2.13.0", "demo==2.0", "torchvision"]


def test_a_failed_install_leaves_no_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    venv = tmp_path / "peers" / "demo"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()

    def fail(message, cmd):
        raise RuntimeError("pip failed")

    monkeypatch.setattr(peers, "_step", fail)
    with pytest.raises(RuntimeError):
        peer_python(Peer("demo", ("demo==1.0",)))
    assert not (venv / ".installed").exists()


def test_the_peer_computes_in_what_quantkit_resolves_auto_to_on_this_machine():
    # the peer worker cannot import quantkit, so it probes the CPU itself: both must agree, or the
    # time ratios compare a bfloat16 run with a float32 one
    from quantkit.compute_dtype import resolve_compute_dtype
    from quantkit.bench.peer_llmcompressor import compute_dtype

    assert compute_dtype() == resolve_compute_dtype("auto")
