"""Sampling: the numpy reference sampler, its row arithmetic, and the same on the GPU."""
