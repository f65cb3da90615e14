"""Quantization math as pure functions on tensors. Hooks, loops and state live in quantkit.quantize."""
