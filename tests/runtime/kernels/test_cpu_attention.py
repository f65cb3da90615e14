"""The native CPU decode attention against the torch reference: float32 and FP8 caches, GQA, ragged lengths."""

import pytest
import torch

from quantkit.runtime.kernels import cpu_attention, cpu_extension, dispatch, reference

pytestmark = pytest.mark.skipif(not cpu_attention.supports(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1)),
                                reason="the native CPU kernel cannot be built here (no compiler)")


def paged_case(fp8: bool, seed: int = 0, dim: int = 24):
    gen = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, block, blocks = 5, 6, 2, 4, 40
    q = torch.randn(batch, heads, dim, generator=gen)
    k, v = (torch.randn(blocks * block, kv_heads, dim, generator=gen) * 3 for _ in range(2))
    if fp8:
        k, v = ((x / 0.05).to(reference.FP8_DTYPE).view(torch.uint8) for x in (k, v))
    lens = torch.tensor([1, 4, 5, 17, 30])  # one token, a full block, one past it, ragged, many blocks
    tables = torch.zeros(batch, 8, dtype=torch.long)  # padded with the null block
    order = torch.randperm(blocks - 1, generator=gen) + 1  # shuffled blocks: tables are not ranges
    used = 0
    for b, n in enumerate(lens.tolist()):
        need = -(-n // block)
        tables[b, :need] = order[used:used + need]
        used += need
    return q, k, v, tables, lens, block


@pytest.mark.parametrize("dim", [24, 64, 128])  # plain loops; the 16-float vector paths
@pytest.mark.parametrize("fp8", [False, True])
def test_native_decode_attention_matches_the_reference(fp8, dim):
    q, k, v, tables, lens, block = paged_case(fp8, dim=dim)
    scales = (0.05, 0.05) if fp8 else (None, None)
    want = reference.paged_decode_attention(q, k, v, tables, lens, block, 0.2, *scales)
    got = cpu_attention.paged_decode_attention(q, k, v, tables, lens, block, 0.2, *scales)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the one-token sequence attends to its only key: the output is that value row, per query head
    v0 = v[tables[0, 0] * block].view(reference.FP8_DTYPE).float() * 0.05 if fp8 else v[tables[0, 0] * block]
    torch.testing.assert_close(got[0], v0.repeat_interleave(3, dim=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [24, 64])
def test_bfloat16_queries_and_cache_are_computed_in_float32(dim):
    # The bf16 cache is widened exactly, so the only rounding is the bf16 output's: compare with the
    # reference on the same values in float32, rounded once to bf16 (one bf16 ulp allowed for ties).
    q, k, v, tables, lens, block = paged_case(False, dim=dim)
    q, k, v = q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)
    got = cpu_attention.paged_decode_attention(q, k, v, tables, lens, block, 0.2)
    want = reference.paged_decode_attention(q.float(), k.float(), v.float(), tables, lens, block, 0.2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.to(torch.bfloat16).float(), rtol=8e-3, atol=1e-5)


def test_auto_picks_the_native_path_on_cpu_and_reference_stays_reference():
    q, k, _, _, _, _ = paged_case(False)
    assert dispatch.decode_attention_path("auto", q, k) == "native-cpu"
    assert dispatch.decode_attention_path("auto", q.to(torch.bfloat16), k.to(torch.bfloat16)) == "native-cpu"
    assert dispatch.decode_attention_path("reference", q, k) == "reference"
    assert dispatch.decode_attention_path("auto", q.to(torch.float16), k) == "reference"  # no float16 path


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    """torch's loader waits forever on the lock file of a killed build; ours clears locks older than a build."""
    import os
    import time

    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    lock = cpu_extension.build_directory(cpu_attention.SOURCE) / "lock"
    lock.touch()
    assert (cpu_extension.build_directory(cpu_attention.SOURCE) / "lock").exists()  # a build may be running right now
    old = time.time() - cpu_extension.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert not (cpu_extension.build_directory(cpu_attention.SOURCE) / "lock").exists()
