"""Mixture of experts below the layers: `ops.py` (routing and the per-expert arithmetic over backend ops)
and `residency.py` (which experts sit in which device slots when the rest stream from host RAM;
integers only). The backends use both, so they sit below the backends."""
