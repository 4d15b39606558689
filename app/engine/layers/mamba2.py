"""Mamba-2 (SSD) mixer (Nemotron-H, Granite 4 hybrid). SKELETON: being written (issue 34).

Contract with the decoder (models/decoder.py) and the runner:
- `Mamba2(backend, tensors, prefix, spec: Mamba2Spec, eps)` builds from the layer's
  tensors under `prefix` ("blk.3"), in the GGUF names llama.cpp uses for nemotron_h/granitehybrid.
- `__call__(x [T, hidden], meta, state) -> [T, hidden]`, where `state = (conv_state, ssm_state)`
  are the layer's arrays `[num_slots, *shape]` for `spec.state_shapes()` (float32). Sequence i of the
  batch owns flat rows `meta.query_start_loc[i]:[i+1]`, its state row is `meta.state_slots[i]`, and it
  continues that state when `meta.has_initial_state[i]`, else starts from zeros. The layer updates the
  rows in place so the next chunk / decode step continues from them.
"""

from __future__ import annotations

from typing import Any

from app.engine.specs import Mamba2Spec


class Mamba2:
    def __init__(self, backend: Any, tensors: dict, prefix: str, spec: Mamba2Spec, eps: float) -> None:
        raise NotImplementedError("Mamba-2 is being written")

    def __call__(self, x: Any, meta: Any, state: tuple[Any, Any]) -> Any:
        raise NotImplementedError
