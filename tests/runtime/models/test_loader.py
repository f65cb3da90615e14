"""Loading checkpoints into the runtime model: quantized weights, FP8 KV cache and its scales."""

import json
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.models import load_model
from quantkit.quantize.run import QuantizeOptions, quantize
from quantkit.runtime.kernels import cpu_int4
from tests.runtime.conftest import TEXTS, first_token_logits


@pytest.fixture(scope="module")
def int4_checkpoint(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("int4") / "ckpt"
    quantize(QuantizeOptions(model=str(tiny_model), recipe="rtn-w4a16-g64", out=out))
    return out


def sqnr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()))


def test_int4_checkpoint_logits_match_its_dequantized_transformers_model(make_llm, int4_checkpoint):
    """The reference path dequantizes per call in float32: float tolerance against transformers."""
    llm = make_llm(int4_checkpoint, kernels="reference")
    prompts = [llm.tokenizer.encode(t) for t in TEXTS[:4]]
    hf = load_model(int4_checkpoint)
    for ids, logits in zip(prompts, first_token_logits(llm, prompts)):
        torch.testing.assert_close(logits, hf(torch.tensor([ids])).logits[0, -1], rtol=1e-4, atol=1e-4)
    dense = make_llm()  # and the quantization did change the model
    assert not torch.allclose(first_token_logits(dense, prompts[:1])[0], first_token_logits(llm, prompts[:1])[0])


def test_cpu_int4_path_keeps_weights_packed_and_tracks_the_reference(make_llm, int4_checkpoint):
    """The native CPU path (bf16 AMX tiles for a prompt, where the CPU has them) stays within bf16 rounding of
    the float32 reference, and holds 4-bit weights, not dequantized ones."""
    fast, exact = make_llm(int4_checkpoint, kernels="auto"), make_llm(int4_checkpoint, kernels="reference")
    qkv = fast.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.backend == "cpu-native"
    assert qkv.codes.dtype == torch.int32 and qkv.codes.numel() * 8 == qkv.in_features * qkv.out_features
    # "reference" also keeps norms, rotary and SiLU-and-mul on the torch code; "auto" takes the fused ops.
    assert all(m.native for m in fast.engine.runner.model.modules() if hasattr(m, "native"))
    assert not any(m.native for m in exact.engine.runner.model.modules() if hasattr(m, "native"))
    prompts = [fast.tokenizer.encode(t) for t in TEXTS[:4]]
    # Prompts are longer than cpu_int4.SMALL_M rows: AMX computes in bf16 (close, not float32-exact);
    # without AMX the blocks path decodes to float32 and multiplies in float32.
    for got, want in zip(first_token_logits(fast, prompts), first_token_logits(exact, prompts)):
        assert (25 < sqnr_db(want, got) < 80) if cpu_int4.amx() else sqnr_db(want, got) > 80


def with_kv_scales(src, dst, k_scale, v_scale):
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    tensors = load_file(weights)
    layers = json.loads((dst / "config.json").read_text())["num_hidden_layers"]
    for i in range(layers):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor([k_scale])
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([v_scale])
    save_file(tensors, weights, metadata={"format": "pt"})
    return dst


def test_fp8_kv_cache_without_scales_warns_and_stays_close(make_llm):
    with pytest.warns(UserWarning, match="no KV-cache scales"):
        fp8 = make_llm(kv_cache_dtype="fp8")
    assert fp8.engine.runner.kv_cache.dtype == torch.uint8 and fp8.engine.capacity.bytes_per_token == 128
    layers = fp8.engine.runner.model.attention_layers()
    assert all(a.k_scale is None and a.v_scale is None for a in layers)
    ids = [fp8.tokenizer.encode(TEXTS[4])]
    got, want = first_token_logits(fp8, ids)[0], first_token_logits(make_llm(), ids)[0]
    assert all(a.k_scale > 0 and a.v_scale > 0 for a in layers)  # taken from the first batch
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.99
    assert not torch.equal(got, want)


def test_fp8_kv_cache_reads_the_checkpoint_scales(make_llm, tiny_model, tmp_path):
    ckpt = with_kv_scales(tiny_model, tmp_path / "scaled", k_scale=0.01, v_scale=0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = make_llm(ckpt, kv_cache_dtype="fp8")
    layers = llm.engine.runner.model.attention_layers()
    assert [(a.k_scale, a.v_scale) for a in layers] == [(pytest.approx(0.01), pytest.approx(0.02))] * len(layers)
    out = llm.generate(TEXTS[0])[0]
    assert out.finished and out.token_ids
    # an fp16/fp32 cache ignores the scales (they only matter to an fp8 cache)
    assert make_llm(ckpt).engine.runner.model.attention_layers()[0].k_scale is None


def int8_state(tiny_model, input_scales: dict[str, float | None]):
    """The tiny model's checkpoint as read_checkpoint returns it, its projections as W8A8 INT8 weights
    (per-channel absmax): input_scales by projection name, None for dynamic per-token activations."""
    from quantkit.formats.checkpoints import read_checkpoint
    from quantkit.formats.quantized import Int8Weight

    config, dense, quantized = read_checkpoint(tiny_model)
    for name in [n for n in dense if n.endswith("_proj.weight")]:
        w = dense.pop(name).float()
        scale = w.abs().amax(1, keepdim=True) / 127
        static = input_scales[name.split(".")[-2]]
        quantized[name.removesuffix(".weight")] = Int8Weight(
            torch.round(w / scale).to(torch.int8), scale, None if static is None else torch.tensor([static]))
    return config, dense, quantized


def test_int8_w8a8_weights_load_as_int8_linear_without_the_weight_only_warning(tiny_model, monkeypatch):
    from quantkit.runtime.layers.int8_linear import Int8Linear
    from quantkit.runtime.models import loader

    scales = {"q_proj": 0.02, "k_proj": 0.03, "v_proj": 0.01, "o_proj": 0.05,
              "gate_proj": None, "up_proj": None, "down_proj": None}
    state = int8_state(tiny_model, scales)
    monkeypatch.setattr(loader, "read_checkpoint", lambda path: state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither "weight-only" nor "dequantized"
        model, _ = loader.load_model(tiny_model, torch.float32, torch.device("cpu"), kernels="reference")
    layer = model.model.layers[0]
    projections = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    assert all(isinstance(p, Int8Linear) for p in projections)
    assert layer.self_attn.qkv_proj.input_scale == float(torch.tensor(0.03))  # q/k/v fused: their largest
    assert layer.mlp.gate_up_proj.input_scale is None
    # the fused layer is the three parts side by side
    parts = [state[2][f"model.layers.0.self_attn.{p}_proj"] for p in "qkv"]
    x = torch.randn(3, layer.self_attn.qkv_proj.in_features)
    want = torch.cat([Int8Linear([p], None, torch.float32, "reference", torch.device("cpu"))(x) for p in parts], 1)
    got = layer.self_attn.qkv_proj(x)
    assert got.shape == want.shape
    # each part alone quantizes x at its own scale; fused, all at 0.03: equal only for the k part
    k = slice(parts[0].shape[0], parts[0].shape[0] + parts[1].shape[0])
    torch.testing.assert_close(got[:, k], want[:, k], rtol=1e-5, atol=1e-5)


def test_fp8_w8a8_still_runs_weight_only_with_a_warning(tiny_model, monkeypatch):
    from quantkit.formats.quantized import Fp8Weight
    from quantkit.runtime.models import loader

    read_fp8 = int8_state(tiny_model, dict.fromkeys(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))
    quantized = read_fp8[2]
    for name, w in quantized.items():
        quantized[name] = Fp8Weight(w.dequantize().to(torch.float8_e4m3fn), torch.ones(1), torch.tensor([0.1]))
    monkeypatch.setattr(loader, "read_checkpoint", lambda path: read_fp8)
    with pytest.warns(UserWarning, match="FP8 W8A8 checkpoints weight-only"):
        loader.load_model(tiny_model, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def int8_checkpoints(tiny_model, tmp_path_factory):
    from quantkit.calibration.run import CalibrateOptions, calibrate
    from tests.conftest import chat_rows, write_jsonl

    root = tmp_path_factory.mktemp("int8")
    calibrate(CalibrateOptions(model=str(tiny_model), dataset=str(write_jsonl(root / "c.jsonl", chat_rows(16))),
                               out=root / "calib", num_samples=8, max_seq_len=64))
    out = {}
    for recipe in ("int8-w8a8-dynamic", "int8-w8a8-static"):
        out[recipe] = root / recipe
        quantize(QuantizeOptions(model=str(tiny_model), recipe=recipe, calib=root / "calib", out=out[recipe]))
    return out


@pytest.mark.parametrize("recipe", ["int8-w8a8-dynamic", "int8-w8a8-static"])
@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_int8_checkpoint_runs_quantized_like_quantkits_simulation(make_llm, int8_checkpoints, recipe, kernels):
    """A checkpoint `quantize` wrote: the runtime quantizes each projection's inputs to int8 as the eval's
    simulation on the dequantized transformers model does (vLLM's convention), so the logits agree."""
    from quantkit.runtime.layers.int8_linear import Int8Linear

    llm = make_llm(int8_checkpoints[recipe], kernels=kernels)
    assert isinstance(llm.engine.runner.model.model.layers[0].mlp.down_proj, Int8Linear)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS[:4]]
    hf = load_model(int8_checkpoints[recipe])
    for ids, logits in zip(prompts, first_token_logits(llm, prompts)):
        torch.testing.assert_close(logits, hf(torch.tensor([ids])).logits[0, -1], rtol=1e-4, atol=1e-4)
