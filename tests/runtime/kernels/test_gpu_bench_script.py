"""quantkit.bench.gpu_kernels runs only on a GPU; here its cases run on tiny shapes through the interpreted
kernels, with the timer stubbed, so the script is known to work up to the timings."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quantkit.bench import gpu_kernels  # noqa: E402
from tests.runtime.kernels.conftest import DEVICE, interpreted  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreted(), reason="on a GPU, run the script itself")


@pytest.fixture
def fake_timer(monkeypatch):
    monkeypatch.setattr(gpu_kernels, "bench_ms", lambda fn: (fn(), 0.01)[1])  # runs the call once


def test_int4_case_checks_the_kernel_and_reports(fake_timer):
    row = gpu_kernels.int4_case(3, 72, 256, 128, DEVICE)
    assert row["sqnr_db"] > 60 and row["speedup"] == pytest.approx(1.0) and row["gbs"] > 0


def test_attention_case_compares_fp8_with_fp16(fake_timer, monkeypatch):
    monkeypatch.setattr(gpu_kernels, "HEADS", 4)
    monkeypatch.setattr(gpu_kernels, "KV_HEADS", 2)
    monkeypatch.setattr(gpu_kernels, "HEAD_DIM", 16)
    row = gpu_kernels.attention_case(48, 2, DEVICE)
    assert row["fp16_sqnr_db"] > 50 and row["fp8_sqnr_db"] > 50
    assert row["fp8_gbs"] == pytest.approx(row["fp16_gbs"] / 2)  # half the bytes in the same (stub) time


def test_main_without_cuda_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu_kernels.main([]) == 2
    assert "needs a GPU" in capsys.readouterr().err
