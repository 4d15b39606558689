"""The device side of a step: the model runner, decode and prefill CUDA graphs, the look-ahead pipeline."""
