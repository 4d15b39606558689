"""Paddock's inference engine: the public API the server, the Studio and scripts use.

    from app.engine import AsyncEngine, EngineConfig, GenerationRequest, SamplingParams

Names are resolved on first use, so importing a leaf module (`app.engine.config`) or this
package stays cheap and never loads numpy-heavy or CUDA code it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLMEngine": "app.engine.core.engine",
    "AsyncEngine": "app.engine.core.async_engine",
    "EngineConfig": "app.engine.config",
    "SamplingParams": "app.engine.sampling_params",
    "GrammarSpec": "app.engine.text.grammar",
    "RequestOutput": "app.engine.request",
    "TokenLogprob": "app.engine.request",
    "EngineClient": "app.engine.interface",
    "GenerationRequest": "app.engine.interface",
    "ModelInfo": "app.engine.interface",
    "EngineStats": "app.engine.interface",
    "ContextOverflowError": "app.engine.interface",
    "EngineDeadError": "app.engine.interface",
    "RequestFailedError": "app.engine.interface",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names for type checkers, as explicit re-exports
    from app.engine.config import EngineConfig as EngineConfig
    from app.engine.core.async_engine import AsyncEngine as AsyncEngine
    from app.engine.core.engine import LLMEngine as LLMEngine
    from app.engine.interface import ContextOverflowError as ContextOverflowError
    from app.engine.interface import EngineClient as EngineClient
    from app.engine.interface import EngineDeadError as EngineDeadError
    from app.engine.interface import EngineStats as EngineStats
    from app.engine.interface import GenerationRequest as GenerationRequest
    from app.engine.interface import ModelInfo as ModelInfo
    from app.engine.interface import RequestFailedError as RequestFailedError
    from app.engine.request import RequestOutput as RequestOutput
    from app.engine.request import TokenLogprob as TokenLogprob
    from app.engine.sampling_params import SamplingParams as SamplingParams
    from app.engine.text.grammar import GrammarSpec as GrammarSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'app.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
