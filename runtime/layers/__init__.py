"""Model building blocks on runtime terms: norm, rotary, paged attention, MLP, sampler."""
