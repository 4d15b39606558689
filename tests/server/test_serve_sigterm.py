"""`paddock serve` stopped with SIGTERM (kill, systemd, docker stop) shuts down as Ctrl-C does: the engine
thread's last act, moving the prefix cache down to the KV disk tier, happens, so a restart finds it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "tests" / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_persists_the_prefix_cache_to_the_disk_tier(tmp_path) -> None:
    port, disk = free_port(), tmp_path / "kv"
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--model", str(QWEN3), "--device", "cpu", "--port", str(port),
         "--kv-disk-gb", "0.1", "--kv-disk-dir", str(disk), "--no-mcp", "--no-embeddings", "--log-level", "info"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            assert server.poll() is None, Path(log.name).read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        body = {"model": "qwen3-kquants", "prompt": list(range(5, 90)), "max_tokens": 2, "temperature": 0}  # 85 tokens: 5 full blocks
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200
        assert not list(disk.rglob("*.kvb"))  # nothing written while it serves (host tier room)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 128 + signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    output = Path(log.name).read_text()
    assert "Traceback" not in output
    assert len(list(disk.rglob("*.kvb"))) == 5, output[-2000:]
