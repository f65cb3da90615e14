"""quantkit.runtime: the paired serving runtime (paged KV cache, continuous batching, kernels).

Not built yet: see the runtime issue. Nothing in quantkit imports this package yet.
"""
