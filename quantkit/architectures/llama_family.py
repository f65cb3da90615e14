"""The Llama family: pre-norm decoder layers with rotary attention (grouped KV heads) and a SwiGLU MLP.
Llama 1-3.x, SmolLM2, Mistral, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) differ only in what is declared here."""

from quantkit.architectures.spec import Architecture, InputGroup

LLAMA_GROUPS = (
    InputGroup(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), fused_as="self_attn.qkv_proj",
               scales_into="input_layernorm"),
    # v -> o only folds where shapes match (no grouped KV heads): AWQ checks that on the layer
    InputGroup(("self_attn.o_proj",), scales_into="self_attn.v_proj"),
    InputGroup(("mlp.gate_proj", "mlp.up_proj"), fused_as="mlp.gate_up_proj", scales_into="post_attention_layernorm"),
    InputGroup(("mlp.down_proj",), scales_into="mlp.up_proj"),
)

LLAMA = Architecture("llama", ("LlamaForCausalLM",), LLAMA_GROUPS)
MISTRAL = Architecture("mistral", ("MistralForCausalLM",), LLAMA_GROUPS, sliding_window=True)
QWEN2 = Architecture("qwen2", ("Qwen2ForCausalLM",), LLAMA_GROUPS)
QWEN3 = Architecture("qwen3", ("Qwen3ForCausalLM",), LLAMA_GROUPS, qk_norm=True)

DECLARATIONS = (LLAMA, MISTRAL, QWEN2, QWEN3)
