"""bench/suite/tiers_session.py: its sizing (the pool holds the longest turn, the other client's prompt spills
the session from the first turn on), and a whole small run on the CPU through `paddock serve` processes:
host-tier hits every turn after the first with the bytes /metrics counts for them (recomputed without the
host tier), and a disk-tier restart that serves the stored prompt from disk."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("tiers_session", ROOT / "bench" / "suite" / "tiers_session.py")
tiers = importlib.util.module_from_spec(SPEC)  # type: ignore[arg-type]
SPEC.loader.exec_module(tiers)  # type: ignore[union-attr]


def workload(**overrides) -> SimpleNamespace:
    fields = dict(kv_blocks=None, other_tokens=None, prefix_tokens=8000, input_tokens=1000, output_tokens=64,
                  turns=16, disk_prompt_tokens=8000)  # fmt: skip
    return SimpleNamespace(**{**fields, **overrides})


def test_the_default_pool_holds_the_longest_turn_and_the_other_prompt_spills_the_first() -> None:
    args = workload()
    blocks = tiers.pool_blocks(args)
    longest = 8000 + 16 * (1000 + 64)  # the last turn re-sends everything, before its template tokens
    assert (blocks - 1) * 16 >= longest + 16 * tiers.TEMPLATE_SLACK
    other = tiers.other_tokens(args, blocks)
    assert 8000 + 1000 + other > (blocks - 1) * 16  # the first turn and the other prompt overflow the pool
    assert other < (blocks - 1) * 16  # but the other prompt alone fits
    assert tiers.pool_blocks(workload(kv_blocks=1200)) == 1200
    assert tiers.other_tokens(workload(other_tokens=0), 1200) == 0


def test_moved_is_the_difference_of_two_metrics_readings() -> None:
    before = {"device": 16, "host": 0, "host_to_device": 0, "device_to_host": 4096, "evicted_blocks": 1}
    after = {"device": 48, "host": 64, "host_to_device": 8192, "device_to_host": 4096, "evicted_blocks": 3,
             "disk": 0, "to_disk": 0, "from_disk": 0}  # fmt: skip
    assert tiers.moved(before, after) == {
        "cached_device": 32, "cached_host": 64, "cached_disk": 0, "bytes_host_to_device": 8192,
        "bytes_device_to_host": 0, "bytes_from_disk": 0, "bytes_to_disk": 0, "evicted_blocks": 2,
    }  # fmt: skip


@pytest.mark.slow  # four `paddock serve` starts and a small session on the CPU: ~20-40 s on 2 busy cores
def test_a_small_cpu_run_hits_the_host_tier_every_turn_and_restarts_from_disk(tmp_path, capsys) -> None:
    model = tmp_path / "tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "bench" / "make_random_gguf.py"), "--shape", "tiny", "--out",
                    str(model)], check=True, capture_output=True)  # fmt: skip
    out = tmp_path / "tiers.jsonl"
    tiers.main([str(model), "--device", "cpu", "--turns", "4", "--prefix-tokens", "300", "--input-tokens", "60",
                "--output-tokens", "8", "--disk-prompt-tokens", "400", "--kv-host-gb", "0.05", "--kv-disk-gb", "0.05",
                "--port", str(_free_port()), "--out", str(out), "--phases", "recompute,session,session_nohost,disk"])  # fmt: skip
    lines = {line["phase"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert set(lines) == {"recompute", "session", "session_nohost", "disk_write", "disk_restart"}
    session = lines["session"]
    assert session["complete"] and session["turns_hitting_host"] == 3  # every turn after the first
    block_bytes = 2 * 2 * 2 * 64 * 4 * 16  # the tiny shape: 2 layers, K and V, 2 KV heads of 64, float32
    for turn in session["turns"][1:]:
        assert turn["cached_host"] > 0 and turn["cached_tokens"] == turn["cached_device"] + turn["cached_host"]
        assert turn["bytes_host_to_device"] == turn["cached_host"] // 16 * block_bytes
    control = lines["session_nohost"]  # the same turns without the host tier: the spilled history is recomputed
    assert control["complete"] and control["cached_host_total"] == control["bytes_host_to_device_total"] == 0
    assert control["recomputed_tokens_total"] > session["recomputed_tokens_total"] + session["cached_host_total"] // 2
    recompute, written, restart = lines["recompute"], lines["disk_write"], lines["disk_restart"]
    assert recompute["cached_tokens"] == 0 and written["cached_tokens"] == 0
    assert written["disk_files"] >= 400 // 16
    assert restart["prompt_tokens"] == recompute["prompt_tokens"]
    assert restart["cached_tokens"] == restart["cached_disk"] >= restart["prompt_tokens"] - 16
    assert restart["bytes_from_disk"] == restart["cached_disk"] // 16 * block_bytes
    assert "disk restart TTFT / recompute TTFT" in capsys.readouterr().out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
