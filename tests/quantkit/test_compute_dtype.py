import torch

from quantkit.compute_dtype import resolve_compute_dtype


def test_auto_hessian_dtype_is_bfloat16_only_where_the_cpu_multiplies_it_natively(monkeypatch):
    assert resolve_compute_dtype("float32") == torch.float32
    assert resolve_compute_dtype("bfloat16") == torch.bfloat16
    for amx, avx512_bf16, expected in ((True, False, torch.bfloat16), (False, True, torch.bfloat16),
                                       (False, False, torch.float32)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda b=avx512_bf16: b, raising=False)
        assert resolve_compute_dtype("auto") == expected
