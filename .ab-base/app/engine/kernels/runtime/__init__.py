"""Kernel runtime: NVRTC compilation with an on-disk cache, launches, programmatic dependent launch."""
