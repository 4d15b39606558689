"""bench/lab/hybrid_serve_trace.py's wave step by step (--steps) and its replay of the cuts before session 17
(--legacy-cuts) on the CPU: the same wave's prefill chunks and first tokens under both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hybrid_serve_trace import ARGS, _trace, tiny  # noqa: F401 (a fixture): sibling module


def wave(tiny: Path, out: Path, *extra: str) -> list[dict]:  # noqa: F811
    trace = _trace()
    trace.main([str(tiny), *ARGS, "--concurrency", "8", "--requests", "8", "--warmup", "0", "--output-tokens", "2",
                "--max-num-batched-tokens", "128", "--prompt-tokens", "43", "--steps", "--json", str(out),
                *extra])  # fmt: skip
    return json.loads(out.read_text())["steps"]


def test_steps_show_the_wave_and_the_legacy_cuts_replay_the_old_order(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 8 prompts of 51 tokens (48 = 3 blocks of 16, then a 3-token tail: a 1-token one always went with the
    # decodes) in a budget of 128 tokens a step
    now = wave(tiny, tmp_path / "now.json")
    printed = capsys.readouterr().out
    assert "prefill chunks (tokens x count)" in printed and "48x2" in printed
    before = wave(tiny, tmp_path / "before.json", "--legacy-cuts")
    for steps in (now, before):
        assert sum(s["first_tokens"] for s in steps) == 8
        assert sum(s["prefill_tokens"] for s in steps) == 8 * 51
        assert all(int(size) <= 48 for s in steps for size in s["chunk_sizes"])  # cut at 48 or by the budget
    firsts_now = [s["first_tokens"] for s in now]
    firsts_before = [s["first_tokens"] for s in before]
    # the tails go with the decodes now: the first heads' first tokens come in step 2, where before every
    # newcomer was admitted first and they waited for step 3
    assert firsts_now[:3] == [0, 2, 2] and firsts_before[:3] == [0, 0, 4]
