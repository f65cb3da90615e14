"""The Llama family: pre-norm decoder layers with rotary attention (grouped KV heads) and a SwiGLU MLP.
Llama 1-3.x, SmolLM2, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Phi-3 (q/k/v and gate/up fused in the
checkpoint), Gemma 3 (sandwich norms, local and global layers) and Qwen3-MoE and Mixtral (sparse experts
instead of the MLP) differ only in what is declared here."""

from quantkit.architectures.spec import Architecture, Experts, InputGroup

LLAMA_GROUPS = (
    InputGroup(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), fused_as="self_attn.qkv_proj",
               scales_into="input_layernorm"),
    # v -> o only folds where shapes match (no grouped KV heads): AWQ checks that on the layer
    InputGroup(("self_attn.o_proj",), scales_into="self_attn.v_proj"),
    InputGroup(("mlp.gate_proj", "mlp.up_proj"), fused_as="mlp.gate_up_proj", scales_into="post_attention_layernorm"),
    InputGroup(("mlp.down_proj",), scales_into="mlp.up_proj"),
)

ATTENTION_GROUPS = LLAMA_GROUPS[:2]

LLAMA = Architecture("llama", ("LlamaForCausalLM",), LLAMA_GROUPS)
MISTRAL = Architecture("mistral", ("MistralForCausalLM",), LLAMA_GROUPS, sliding_window=True)
QWEN2 = Architecture("qwen2", ("Qwen2ForCausalLM",), LLAMA_GROUPS)
QWEN3 = Architecture("qwen3", ("Qwen3ForCausalLM",), LLAMA_GROUPS, qk_norm=True)
# Every decoder layer sparse (decoder_sparse_step 1, no mlp_only_layers: Qwen3-30B-A3B and -235B-A22B)
QWEN3_MOE = Architecture("qwen3_moe", ("Qwen3MoeForCausalLM",), ATTENTION_GROUPS, qk_norm=True,
                         experts=Experts("mlp", gate="gate_proj", up="up_proj", down="down_proj"))
MIXTRAL = Architecture("mixtral", ("MixtralForCausalLM",), ATTENTION_GROUPS, sliding_window=True,
                       experts=Experts("mlp", gate="w1", up="w3", down="w2", stored_block="block_sparse_moe"))

# q/k/v and gate/up fused in the checkpoint itself: nothing to fuse at load, and no previous op AWQ could scale for
# o_proj or down_proj alone (v and up are only part of the fused outputs)
PHI3 = Architecture("phi3", ("Phi3ForCausalLM",), (
    InputGroup(("self_attn.qkv_proj",), scales_into="input_layernorm"),
    InputGroup(("self_attn.o_proj",)),
    InputGroup(("mlp.gate_up_proj",), scales_into="post_attention_layernorm"),
    InputGroup(("mlp.down_proj",)),
), sliding_window=True)

# Gemma 3 (text): sandwich norms of the form x * (1 + w), q/k norms, GeLU-tanh MLP, scaled embeddings (inside
# transformers' embedding module), local layers with a sliding window and their own rope base (layer_types)
GEMMA3 = Architecture("gemma3", ("Gemma3ForCausalLM",), (
    LLAMA_GROUPS[0], LLAMA_GROUPS[1],
    InputGroup(("mlp.gate_proj", "mlp.up_proj"), fused_as="mlp.gate_up_proj", scales_into="pre_feedforward_layernorm"),
    LLAMA_GROUPS[3],
), qk_norm=True, sliding_window=True, sandwich_norms=True, norm_offset=1.0)

DECLARATIONS = (LLAMA, MISTRAL, QWEN2, QWEN3, QWEN3_MOE, MIXTRAL, PHI3, GEMMA3)
