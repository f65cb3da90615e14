"""Shared fixtures: a tiny random Llama with a real (small) BPE tokenizer, the real SmolLM2, and a CLI runner."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Triton reads TRITON_INTERPRET when triton.language is first imported, and transformers may import it long
# before the kernel tests' conftest runs: set it here, first. On a GPU machine run with TRITON_INTERPRET=0.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
CORPUS = [
    "How do I reset my password? Go to settings, then security, then reset.",
    "Your order 12345 shipped yesterday and should arrive on Friday.",
    "def add(a, b):\n    return a + b\n",
    "The meeting decided to move the launch to March; Dana owns the checklist.",
    "退款会在三到五个工作日内原路返回。",
    "The storage API returns 429 when the request rate exceeds the plan limit.",
] * 20


def build_tiny_model(out: Path, layers: int = 2, max_positions: int = 256, architecture: str = "llama",
                     kv_heads: int = 2, heads: int = 4) -> Path:
    """A random Llama-family model with a small BPE tokenizer: llama, llama3 (Llama 3.x rope scaling), qwen2
    (q/k/v biases), qwen3 (per-head q/k norms, head_dim 32 so q is wider than the hidden size), mistral, phi3
    (q/k/v and gate/up fused in the checkpoint), gemma3 (sandwich norms, a local and a global layer), or the
    MoE qwen3_moe and mixtral (four experts, two per token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                              Gemma3ForCausalLM, Gemma3TextConfig, MixtralConfig, MixtralForCausalLM, Phi3Config,
                              Phi3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        unk_token="<unk>", pad_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config_type, model_type = {"llama": (LlamaConfig, LlamaForCausalLM), "llama3": (LlamaConfig, LlamaForCausalLM),
                               "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
                               "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
                               "mixtral": (MixtralConfig, MixtralForCausalLM), "phi3": (Phi3Config, Phi3ForCausalLM),
                               "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
                               "mistral": (MistralConfig, MistralForCausalLM)}[architecture]
    extra = {}
    if architecture == "llama3":  # a short original context, so every regime of the scaling shows at 16 dims
        extra["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    if architecture == "qwen3":
        extra["head_dim"] = 32
    if architecture == "qwen3_moe":  # four experts of width 64, two per token
        extra.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)
    if architecture == "phi3":  # its config would take token ids beyond this vocabulary
        extra.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if architecture == "gemma3":  # a local layer (window 8 tokens, its own rope base) and a global one
        extra.update(head_dim=64 // heads, sliding_window=8, query_pre_attn_scalar=64 // heads,
                     layer_types=["full_attention" if i % 2 else "sliding_attention" for i in range(layers)])
    if architecture == "mixtral":  # four experts of width 128 (its intermediate_size), two per token
        extra.update(num_local_experts=4, num_experts_per_tok=2)
    config = config_type(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=True, **extra)
    torch.manual_seed(0)
    model = model_type(config)
    with torch.no_grad():  # transformers initializes biases to zero and norms to one, which would hide how
        for name, parameter in model.named_parameters():  # they are handled
            if name.endswith(".bias"):
                parameter.normal_(0, 0.5)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.uniform_(0.5, 1.5)
            elif architecture == "gemma3" and name.endswith("norm.weight"):  # Gemma scales by 1 + w, w = 0 at init
                parameter.uniform_(-0.5, 0.5)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real embedded default, converted once into the user's quantkit cache."""
    from quantkit.models import resolve_model

    return resolve_model("smollm2-135m")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def chat_rows(n: int, task: str = "support", lang: str = "en") -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Order {i} is late, where is it? " * (1 + i % 4)},
                          {"role": "assistant", "content": "It shipped yesterday. " * (1 + i % 3)}],
             "task": task if i % 3 else f"{task}_b", "lang": lang} for i in range(n)]


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `quantkit ARGS...` in-process through the real entry point; return (exit code, stdout, stderr)."""
    from quantkit.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["quantkit", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run
