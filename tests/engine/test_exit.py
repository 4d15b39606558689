"""A plain script that makes an engine and returns, without closing anything, exits cleanly.

The engine starts building llguidance's view of the vocabulary on a thread as it loads (sample/grammar.py).
When that thread was a daemon, a script that returned while it was still inside llguidance crashed at exit
(SIGSEGV in most runs on the numba backend, whose load is quick): the interpreter tears a daemon thread down
as it retakes the lock, and that forced unwind went through llguidance's Rust frames. Each script here runs
in its own interpreter; three runs, as the crash depended on timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
MODEL = ROOT / "tests" / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"
SCRIPT = f"""
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine

engine = LLMEngine(EngineConfig(model={str(MODEL)!r}, device="cpu", cpu_kernels="numba", num_kv_blocks=64))
print(engine.info.name)
"""


@pytest.mark.parametrize("run", range(3))
def test_a_script_that_leaves_a_numba_engine_open_exits_cleanly(run):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"
    assert "Fatal Python error" not in done.stderr
    assert done.stdout.strip() == "qwen3-kquants"
