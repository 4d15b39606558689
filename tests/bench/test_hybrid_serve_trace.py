"""bench/lab/hybrid_serve_trace.py on the CPU: a tiny random Qwen 3.5 file under a closed loop, its steps
classified and its recurrent-state copies counted as the scheduler asked for them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import make_random_hybrid_gguf  # noqa: E402


def _trace():
    spec = importlib.util.spec_from_file_location("hybrid_serve_trace", ROOT / "bench" / "lab" / "hybrid_serve_trace.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hybrid") / "tiny.gguf"
    make_random_hybrid_gguf.write("qwen35-tiny", path)
    return path


ARGS = ["--device", "cpu", "--cpu-kernels", "numpy", "--max-model-len", "512", "--head-tokens", "3",
        "--tail-tokens", "5", "--prompt-tokens", "41", "--kv-host-gb", "0.002"]  # fmt: skip


def test_closed_loop_steps_and_request_times(tiny: Path, tmp_path: Path) -> None:
    trace = _trace()
    out = tmp_path / "trace.json"
    summary = trace.main([str(tiny), *ARGS, "--concurrency", "2", "--requests", "3", "--warmup", "0",
                          "--output-tokens", "6", "--json", str(out)])  # fmt: skip
    kinds = summary["by_kind"]
    # 3 prompts of 49 tokens, 2 in flight: the third arrives when one of the first two ends; every prompt
    # token is prefilled once
    assert sum(k["prefill_tokens_total"] for k in kinds.values()) == 3 * 49
    assert kinds["decode"]["paths"] == {"eager": kinds["decode"]["steps"]}  # no graphs on the CPU
    # 5 decode rows per request after the prefill's first token
    assert sum(k["decode_rows_mean"] * k["steps"] for k in kinds.values()) == pytest.approx(3 * 5)
    # each prompt's snapshot at its last block boundary (48 = 3 x 16): one prefill save each
    assert summary["state_rows_copied"]["saves_prefill"] == 3
    assert summary["state_rows_copied"]["restores"] == 0
    assert summary["ttft_ms_p50"] > 0 and summary["itl_ms_p50"] > 0
    assert out.exists() and '"steps"' in out.read_text()


def test_timed_requests_past_the_pool_resume_warmup_snapshots(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _trace()
    monkeypatch.setattr(trace, "PROMPT_POOL", 2)  # the timed prompts are the warm-up's again, as paddock bench's past 64
    summary = trace.main([str(tiny), *ARGS, "--concurrency", "2", "--requests", "2", "--warmup", "2",
                          "--output-tokens", "4"])  # fmt: skip
    copies = summary["state_rows_copied"]
    assert copies["restores"] == 2  # each resumes the warm-up's snapshot at 48 tokens, computes its last token
    assert sum(k["prefill_tokens_total"] for k in summary["by_kind"].values()) == 2 * 1


def test_gpu_engine_prefill_times_a_hybrid_models_eager_steps(tiny: Path) -> None:
    """bench/suite/gpu_engine.py prefill on a hybrid file (no prefill graphs): its steps run, each batch of
    prompts in one step (the function asserts it), on the CPU's numpy kernels."""
    spec = importlib.util.spec_from_file_location("gpu_engine", ROOT / "bench" / "suite" / "gpu_engine.py")
    gpu_engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_engine)
    got = gpu_engine.hybrid_prefill(str(tiny), (16, 40), batches=(1, 3), reps=1, device="cpu")
    assert set(got["prefill_eager_step_ms"]) == {16, 40} and set(got["prefill_128_batch_step_ms"]) == {1, 3}
    assert all(ms > 0 for ms in [*got["prefill_eager_step_ms"].values(), *got["prefill_128_batch_step_ms"].values()])


def test_a_prompt_chunked_beside_running_decodes_makes_mixed_steps(tiny: Path) -> None:
    """A 32-token step budget and three prompts: the last one's tail is still being prefilled while the first
    two decode, so a step carries both; every prompt token is still prefilled once."""
    summary = _trace().main([str(tiny), *ARGS, "--concurrency", "3", "--requests", "3", "--warmup", "0",
                             "--output-tokens", "6", "--max-num-batched-tokens", "32"])  # fmt: skip
    kinds = summary["by_kind"]
    assert "mixed" in kinds and kinds["mixed"]["decode_rows_mean"] >= 1 and kinds["mixed"]["prefill_tokens_mean"] > 0
    assert sum(k["prefill_tokens_total"] for k in kinds.values()) == 3 * 49
    assert sum(k["decode_rows_mean"] * k["steps"] for k in kinds.values()) == pytest.approx(3 * 5)
