"""THE on-disk layouts (compressed-tensors, AutoAWQ, GPTQ): tensor names, shapes, packing, quantization_config.

The quantizer writes through this package and the runtime reads through it.
"""
