"""Evaluation: perplexity and (later) task-level regression against the FP16 baseline."""
