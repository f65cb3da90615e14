"""The Llama family (Llama 1-3.x, SmolLM2, Mistral without sliding window, Qwen2 with q/k/v biases, Qwen3 with
per-head q/k norms) on runtime layers; what differs between them is declared in quantkit.architectures.

Module names follow HF's except the fused projections (qkv_proj, gate_up_proj), which the loader builds.
Forward takes the flattened tokens of every scheduled sequence, [T], and returns hidden states [T, H].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from quantkit.architectures import architecture_of
from quantkit.errors import QuantkitError
from quantkit.runtime.context import ForwardContext
from quantkit.runtime.kernels import cpu_fused
from quantkit.runtime.layers.attention import PagedAttention
from quantkit.runtime.layers.norm import RMSNorm
from quantkit.runtime.layers.rotary import RotaryEmbedding

LOGITS_SLICE = 2048
LLAMA3_ROPE = ("factor", "high_freq_factor", "low_freq_factor", "original_max_position_embeddings")  # vocabulary rows per lm_head product on CPU


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_proj_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3)
    rope: tuple[tuple[str, float], ...] = ()  # Llama 3's rope scaling parameters (LLAMA3_ROPE), or none
    # the attention window of a sliding-window model: attention here is not bounded by it, so the model runner
    # refuses a max_model_len beyond it (within it, the window never cuts anything)
    window: int | None = None

    @classmethod
    def from_hf(cls, config: dict, attention_bias: bool, o_proj_bias: bool = False) -> LlamaConfig:
        architecture = architecture_of(config)
        if architecture.sandwich_norms:
            raise QuantkitError(f"the runtime does not run {architecture.name} (sandwich norms, local/global layers) "
                                "yet", hint="serve the checkpoint with vLLM")
        if architecture.experts:
            raise QuantkitError(f"the runtime does not run mixture-of-experts models ({architecture.name}) yet",
                                hint="serve the checkpoint with vLLM, which loads its per-expert layout")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type not in architecture.rope_types:
            raise QuantkitError(f"rope type {rope_type!r} is not supported by the runtime yet",
                                hint=f"supported: {', '.join(architecture.rope_types)}")
        heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"], num_layers=config["num_hidden_layers"],
            num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta") or config.get("rope_theta", 10000.0),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=config.get("tie_word_embeddings", False), attention_bias=attention_bias,
            o_proj_bias=o_proj_bias, qk_norm=architecture.qk_norm, window=architecture.window(config),
            rope=tuple((k, float(rope[k])) for k in LLAMA3_ROPE) if rope_type == "llama3" else (),
        )


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary
        self.attn = PagedAttention(*self.shape)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        heads, kv_heads, d = self.shape
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:  # each head's vector normed on its own: rows of [tokens * heads, d]
            q = self.q_norm(q.reshape(-1, d))[0]
            k = self.k_norm(k.reshape(-1, d))[0]
        q, k = self.rotary(ctx.positions, q.reshape(-1, heads, d), k.reshape(-1, kv_heads, d))
        return self.o_proj(self.attn(q, k, v.view(-1, kv_heads, d), ctx))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.native = True  # the fused CPU SiLU-and-mul where it runs; False: the torch code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.native and cpu_fused.supports(gate_up):
            return self.down_proj(cpu_fused.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(MLP output, residual stream before it): each residual add is fused into the norm after it."""
        normed, residual = self.input_layernorm(x, residual)
        normed, residual = self.post_attention_layernorm(self.self_attn(normed, ctx), residual)
        return self.mlp(normed), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, dict(cfg.rope))
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, rotary) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, ctx)
        return self.norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(input_ids, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.lm_head
        if hidden.device.type != "cpu" or type(head) is not nn.Linear or head.out_features <= LOGITS_SLICE:
            return head(hidden)
        # On CPU MKL runs a [64, 576] x [576, 49152] product 15-25% faster in vocabulary slices whose output
        # stays in cache than in one call (1 thread; see docs/runtime.md).
        return torch.cat([F.linear(hidden, rows) for rows in head.weight.split(LOGITS_SLICE)], dim=1)

    def use_native_ops(self, enabled: bool) -> None:
        """Whether norms, rotary and SiLU-and-mul take the fused CPU ops (kernels/cpu_fused.py) where they
        run, or the torch code (kernels="reference")."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding, LlamaMLP)):
                module.native = enabled

    def attention_layers(self) -> list[PagedAttention]:
        return [layer.self_attn.attn for layer in self.model.layers]
