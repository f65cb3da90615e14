"""quantkit: calibrate, quantize, evaluate and serve quantized language models."""

__version__ = "0.1.0"
