"""The runtime on the real SmolLM2: greedy tokens identical to transformers generate (float32, CPU) for 20
varied prompts, with prefix caching on and off and under forced preemption; an INT4 checkpoint's logits
equal its dequantized transformers model's."""

from __future__ import annotations

import pytest
import torch

from quantkit.runtime import LLM, SamplingParams
from tests.runtime.conftest import first_token_logits, hf_greedy

pytestmark = pytest.mark.e2e
NEW_TOKENS = 16
PLAIN = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
    "Translate to French: Good morning, how are you?",
    "import numpy as np\n\ndef normalize(x):",
    "Q: What is 12 times 7?\nA:",
    "The storage API returns 429 when",
    "退款会在三到五个工作日内",
    "Dear customer, thank you for your patience. Your order",
    "SELECT name, email FROM users WHERE",
]
CHATS = [
    "My order has not arrived yet. What should I do?",
    "Write a haiku about autumn.",
    "How do I reset my password?",
    "Summarize: the meeting moved the launch to March and Dana owns the checklist.",
    "What is the boiling point of water?",
    "Give me three tips for better sleep.",
    "Explain recursion in one sentence.",
    "How do I reset my password on the mobile app?",
]


@pytest.fixture(scope="module")
def prompts(smollm2):
    from quantkit.models import load_tokenizer

    tok = load_tokenizer(smollm2)
    chats = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
             for c in CHATS]
    return [tok.encode(p) for p in PLAIN] + [tok.encode(c, add_special_tokens=False) for c in chats]


@pytest.fixture(scope="module")
def reference(smollm2, prompts):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.inference_mode():
        return hf_greedy(hf, prompts, NEW_TOKENS, eos_token_id=hf.generation_config.eos_token_id)


@pytest.mark.parametrize("options", [
    dict(),
    dict(enable_prefix_caching=False),
    dict(num_kv_blocks=24, max_model_len=128, max_num_batched_tokens=256),  # 368 tokens of KV for ~1,200
], ids=["prefix-cache", "no-prefix-cache", "forced-preemption"])
def test_greedy_tokens_equal_transformers(smollm2, prompts, reference, options):
    llm = LLM(str(smollm2), dtype="float32", max_model_len=options.pop("max_model_len", 512), **options)
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    # Two waves, so the second wave's chat prompts can hit the template prefix the first chat cached.
    first = len(PLAIN) + 1
    outs = llm.generate(prompts[:first], greedy) + llm.generate(prompts[first:], greedy)
    assert len(prompts) >= 20
    mismatched = [i for i, (o, ref) in enumerate(zip(outs, reference)) if o.token_ids != ref]
    assert not mismatched, f"prompts {mismatched} differ from transformers"
    stats = llm.stats()
    if options.get("enable_prefix_caching", True):
        assert stats.prefix_cache_hits > 0  # the chat prompts share the template's system prompt
    if "num_kv_blocks" in options:
        assert stats.num_preemptions > 0


@pytest.fixture(scope="module")
def rtn_checkpoint(smollm2, tmp_path_factory):
    from quantkit.quantize.run import QuantizeOptions, quantize

    out = tmp_path_factory.mktemp("rtn") / "ckpt"
    quantize(QuantizeOptions(model="smollm2-135m", recipe="rtn-w4a16-g64", out=out))
    return out


def test_int4_checkpoint_logits_equal_dequantized_transformers(rtn_checkpoint, prompts):
    """kernels="reference" dequantizes per call in float32: transformers' logits to float tolerance."""
    from quantkit.models import load_model

    llm = LLM(str(rtn_checkpoint), dtype="float32", max_model_len=256, kernels="reference")
    hf = load_model(rtn_checkpoint)
    picked = prompts[::5]
    with torch.inference_mode():
        for ids, logits in zip(picked, first_token_logits(llm, picked)):
            torch.testing.assert_close(logits, hf(torch.tensor([ids])).logits[0, -1], rtol=1e-3, atol=1e-3)


def test_native_cpu_int4_path_holds_quarter_size_weights_and_follows_the_reference(smollm2, rtn_checkpoint, prompts):
    """The default CPU path (torch's int4pack kernel, bf16 activations) keeps the linears at 4 bits and
    generates what the float32 reference path generates, bar bf16 near-ties."""
    from quantkit.bench.offline import tensor_mib

    fast = LLM(str(rtn_checkpoint), dtype="float32", max_model_len=256)
    exact = LLM(str(rtn_checkpoint), dtype="float32", max_model_len=256, kernels="reference")
    dense = LLM(str(smollm2), dtype="float32", max_model_len=256)
    def linears(llm):
        return sum(tensor_mib(m) for layer in llm.engine.runner.model.model.layers
                   for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj))

    assert linears(fast) < linears(dense) / 6  # 4-bit codes + bf16 scales/offsets vs float32
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    picked = prompts[::2]  # the reference path dequantizes every layer per call: slow
    got, want = fast.generate(picked, greedy), exact.generate(picked, greedy)
    same_first_8 = sum(g.token_ids[:8] == w.token_ids[:8] for g, w in zip(got, want))
    assert same_first_8 >= 0.8 * len(picked), f"{same_first_8}/{len(picked)} prompts agree on 8 tokens"
