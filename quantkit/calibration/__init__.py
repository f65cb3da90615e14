"""Sequential, layer-by-layer calibration: activation statistics for quantization."""
