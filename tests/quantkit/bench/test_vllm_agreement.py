import json
import sys

import pytest
import torch
from safetensors.torch import save_file

from quantkit.bench import vllm_agreement
from quantkit.bench.vllm_agreement import agreement, greedy, has_kv_scales, matching_prefix, run_vllm, scheme


def test_matching_prefix_and_agreement_counting():
    assert matching_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert matching_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert matching_prefix([1, 2, 3], [1, 2]) == 2  # a short answer never counts as full agreement
    ours = [[1, 2, 3, 4]] * 9 + [[1, 2, 3, 4]]
    theirs = [[1, 2, 3, 4]] * 9 + [[1, 2, 0, 4]]
    result = agreement(ours, theirs, new_tokens=4)
    assert result["agree"] == 9 and result["prompts"] == 10 and result["passed"]
    assert result["mean_prefix"] == pytest.approx((9 * 4 + 2) / 10)
    assert not agreement(ours, [[0]] * 2 + theirs[2:], new_tokens=4)["passed"]  # 7/10 < 90%
    with pytest.raises(ValueError):
        agreement(ours, theirs[:-1], new_tokens=4)


def _checkpoint(path, tensors, quantization_config=None):
    path.mkdir()
    config = {"dtype": "float16"} | ({"quantization_config": quantization_config} if quantization_config else {})
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, path / "model.safetensors")
    return path


def test_kv_scales_found_by_tensor_name_or_config(tmp_path):
    weight = {"model.layers.0.self_attn.k_proj.weight": torch.zeros(2, 2)}
    plain = _checkpoint(tmp_path / "plain", weight)
    scaled = _checkpoint(tmp_path / "scaled", weight | {"model.layers.0.self_attn.k_scale": torch.ones(()),
                                                        "model.layers.0.self_attn.v_scale": torch.ones(())})
    scheme_only = _checkpoint(tmp_path / "scheme", weight, {"quant_method": "compressed-tensors",
                                                            "format": "float-quantized",
                                                            "kv_cache_scheme": {"num_bits": 8, "type": "float"}})
    assert not has_kv_scales(plain) and has_kv_scales(scaled) and has_kv_scales(scheme_only)
    assert scheme(plain) == "dense float16"
    assert scheme(scheme_only) == "compressed-tensors float-quantized"
    (plain / "quantkit.json").write_text(json.dumps({"recipe": "rtn-w4a16-g64"}))
    assert scheme(plain) == "rtn-w4a16-g64"


FAKE_WORKER = """
import json, os, sys
print("INFO vllm loading", flush=True)
print(json.dumps({"token_ids": [[1, 2]], "load_s": 1.0, "generate_s": 0.1, "tokens_per_s": 20.0,
                  "scale_log": [sys.argv[4]]}), flush=True)
os.abort() if sys.argv[4] == "fp8" else sys.exit(3)
"""


def test_run_vllm_trusts_a_complete_line_over_an_abort_at_exit(tmp_path, monkeypatch):
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    monkeypatch.setattr(vllm_agreement, "WORKER", worker)
    result = run_vllm(sys.executable, tmp_path, tmp_path / "prompts.json", 2, "fp8", 1)
    assert result["token_ids"] == [[1, 2]] and result["exit_code"] == -6 and result["scale_log"] == ["fp8"]
    worker.write_text("import sys; print('boom', file=sys.stderr); sys.exit(1)")
    with pytest.raises(RuntimeError, match="boom"):
        run_vllm(sys.executable, tmp_path, tmp_path / "prompts.json", 2, "auto", 1)


def test_greedy_matches_argmax_without_cache_and_never_stops_early(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompt = [5, 17, 42, 8]
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(6):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert greedy(model, prompt, 6) == ids[len(prompt):]


def test_divergence_gap_is_the_logit_difference_at_the_first_mismatch(tiny_model):
    from transformers import AutoModelForCausalLM

    from quantkit.bench.vllm_agreement import divergence_gap

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompt = [5, 17, 42, 9]
    ours = greedy(model, prompt, 6)
    theirs = ours[:3] + [(ours[3] + 1) % 300] + ours[4:]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ours[:3]])).logits[0, -1]
    expected = float(logits[ours[3]] - logits[theirs[3]])
    assert divergence_gap(model, prompt, ours, theirs) == pytest.approx(expected, abs=1e-5)
    assert expected > 0  # ours is the argmax
    assert divergence_gap(model, prompt, ours, list(ours)) is None


def test_the_float64_control_of_a_dense_model_agrees_with_its_float32_run(tiny_model):
    from quantkit.bench.prompts import Prompt
    from quantkit.bench.vllm_agreement import quantkit_continuations

    prompts = [Prompt(source="t", dataset="t", token_ids=[5 + i, 17, 42, 9]) for i in range(3)]
    ours, gaps = quantkit_continuations(tiny_model, prompts, 5, False, [[1] * 5] * 3)
    control, no_gaps = quantkit_continuations(tiny_model, prompts, 5, False, None, dtype=torch.float64)
    assert control == ours and no_gaps == [] and len(gaps) == 3
    assert agreement(ours, control, 5)["agree"] == 3


def test_token_logprobs_sum_to_the_perplexity_nll(tiny_model):
    from transformers import AutoModelForCausalLM

    from quantkit.bench.vllm_agreement import token_logprobs
    from quantkit.eval.perplexity import sequence_nll

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    sequences = [[5, 17, 42, 9, 100, 7], [3, 250, 11]]
    logprobs = token_logprobs(model, sequences)
    nll, counts = sequence_nll(model, sequences)
    assert [len(x) for x in logprobs] == counts == [5, 2]
    assert [-sum(x) for x in logprobs] == pytest.approx(nll, rel=1e-5)


def _with_kv_scales(tiny_model, out, scale):
    import shutil

    from safetensors.torch import load_file

    shutil.copytree(tiny_model, out)
    tensors = load_file(out / "model.safetensors")
    layers = {int(name.split(".")[2]) for name in tensors if name.startswith("model.layers.")}
    for i in layers:
        for kind in ("k_scale", "v_scale"):
            tensors[f"model.layers.{i}.self_attn.{kind}"] = torch.tensor([scale])
    save_file(tensors, out / "model.safetensors")
    return out, {i: (scale, scale) for i in layers}


def test_an_engine_that_applies_the_kv_scales_is_told_apart_from_one_that_does_not(tiny_model, tmp_path):
    from quantkit.bench.vllm_agreement import VLLM_CPU_KV_TOWARD_ZERO, logprob_gaps, token_logprobs
    from quantkit.eval.kv_cache import fp8_kv_cache
    from quantkit.models import load_model

    checkpoint, scales = _with_kv_scales(tiny_model, tmp_path / "kv", 0.002)
    sequences = [[5 + i, 17, 42, 9, 100, 7, 31, 64] for i in range(4)]
    model = load_model(checkpoint, dtype=torch.float32)
    with fp8_kv_cache(model, scales, toward_zero=VLLM_CPU_KV_TOWARD_ZERO):
        applies = token_logprobs(model, sequences)
    ignores = token_logprobs(model, sequences)  # an engine that runs its cache unquantized

    good = logprob_gaps(checkpoint, sequences, applies, fp8_kv=True)
    assert good["logprob_gap_mean"] < 1e-6 and good["reads_kv_scales"]
    references = good["logprob_gap_references"]
    assert references["no_fp8_cache"] > 0 and references["other_rounding"] > 0 and good["scored_tokens"] == 4 * 7
    bad = logprob_gaps(checkpoint, sequences, ignores, fp8_kv=True)
    assert bad["logprob_gap_mean"] == pytest.approx(good["logprob_gap_references"]["no_fp8_cache"])
    assert not bad["reads_kv_scales"]


def test_every_row_gets_quantkit_float64_as_its_noise_floor(tiny_model):
    from quantkit.bench.vllm_agreement import logprob_gaps, token_logprobs
    from quantkit.models import load_model

    sequences = [[5 + i, 17, 42, 9, 100] for i in range(3)]
    theirs = token_logprobs(load_model(tiny_model, dtype=torch.float32), sequences)
    row = logprob_gaps(tiny_model, sequences, theirs, fp8_kv=False)
    assert row["logprob_gap_mean"] == 0 and "reads_kv_scales" not in row
    assert 0 < row["logprob_gap_references"]["quantkit_float64"] < 1e-4
