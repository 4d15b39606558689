"""Resident memory one hostile request adds to a running `paddock serve` (issue 40): the server's peak RSS
during each request above its RSS before it, beside the size of what the request sent and got back.

    python bench/lab/request_memory.py                  # starts `paddock serve --device cpu` on a free port
    python bench/lab/request_memory.py --only rerank,embeddings  # the probes whose names hold these
    python bench/lab/request_memory.py --audio-mb 150   # the noise WAV's size (default 150)
    python bench/lab/request_memory.py --only transcription --hang-up 30  # leave after 30 s

Each probe runs once on a warm server (a small request of its kind goes first, so the embedding and
Whisper models are loaded before the baseline is read). The peak is the kernel's own high-water mark
(VmHWM), reset before each request through /proc/PID/clear_refs, so short spikes between samples count.
With --hang-up S the client gives up on each request after S seconds (closing its connection), and the
row says how long the server's process kept using the CPU after that (`busy_after_hang_up_s`: until a
half second passes with under 0.05 s of CPU time, read from /proc/PID/stat). Linux only. Figures are
for the note of the change that asked for them, not a pass/fail line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

MIB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _busy_after(pid: int, limit: float = 120.0) -> float:
    """Seconds until the process spends under 0.05 s of CPU in half a second."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        used = _cpu_seconds(pid)
        time.sleep(0.5)
        if _cpu_seconds(pid) - used < 0.05:
            return round(time.monotonic() - started - 0.5, 1)
    return limit


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _noise_wav(megabytes: int) -> bytes:
    samples = megabytes * MIB // 2
    data = np.random.default_rng(0).integers(-8000, 8000, size=samples, dtype=np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16_000)
        writer.writeframes(data.tobytes())
    return out.getvalue()


def _probes(audio_mb: int, embedding_model: str) -> dict[str, tuple[Callable[[httpx.Client], httpx.Response], int]]:
    """name -> (send the request, bytes it sends)"""
    big = "word " * (3 * MIB)  # 15 MB of text
    rerank = {"query": big, "documents": ["a short document", "another one"]}
    embed = {"model": embedding_model, "input": big}
    many = {"model": embedding_model, "input": ["word " * 6000] * 1000}  # 30 MB in 1,000 inputs
    docs = {"query": "which one", "documents": ["word " * 30_000] * 100}  # 15 MB in 100 documents
    audio = _noise_wav(audio_mb)
    files = {"file": ("noise.wav", audio, "audio/wav")}
    return {
        "rerank 15 MB query": (lambda c: c.post("/v1/rerank", json=rerank), len(big)),
        "rerank 100 x 150 kB documents": (lambda c: c.post("/v1/rerank", json=docs), 15 * MIB),
        "embeddings 15 MB input": (lambda c: c.post("/v1/embeddings", json=embed), len(big)),
        "embeddings 1,000 x 30 kB inputs": (lambda c: c.post("/v1/embeddings", json=many), 30 * MIB),
        f"transcription {audio_mb} MB noise WAV": (
            lambda c: c.post("/v1/audio/transcriptions", files=files, data={"model": "whisper-1"}),
            len(audio),
        ),
    }


def _embedding_model(client: httpx.Client) -> str:
    chat = client.get("/health").json()["model"]
    ids = [card["id"] for card in client.get("/v1/models").json()["data"]]
    return next(name for name in ids if name != chat and "whisper" not in name)


def _warm(client: httpx.Client, embedding_model: str) -> None:
    client.post("/v1/rerank", json={"query": "q", "documents": ["d"]}).raise_for_status()
    client.post("/v1/embeddings", json={"model": embedding_model, "input": "hi"}).raise_for_status()
    client.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", _noise_wav(1))}, data={"model": "whisper-1"}
    ).raise_for_status()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="run the probes whose name contains one of these (a,b)")
    parser.add_argument("--audio-mb", type=int, default=150)
    parser.add_argument("--hang-up", type=float, default=None, metavar="S", help="leave each request after S s")
    args = parser.parse_args()
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="paddock-serve-", suffix=".log", delete=False)  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--device", "cpu", "--port", str(port), "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    rows = []
    try:
        timeout = httpx.Timeout(600, read=args.hang_up or 600)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout) as client:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start; see {log.name}")
                time.sleep(0.5)
            embedding_model = _embedding_model(client)
            _warm(client, embedding_model)
            for name, (send, sent) in _probes(args.audio_mb, embedding_model).items():
                if args.only and not any(part in name for part in args.only.split(",")):
                    continue
                before = _status(server.pid, "VmRSS")
                _reset_peak(server.pid)
                started = time.monotonic()
                try:
                    reply: httpx.Response | None = send(client)
                except httpx.ReadTimeout:  # --hang-up: the client left, its connection closed
                    reply = None
                seconds = time.monotonic() - started
                busy = _busy_after(server.pid) if reply is None else None
                peak = _status(server.pid, "VmHWM")
                after = _status(server.pid, "VmRSS")
                failed = reply is not None and reply.status_code >= 400
                error = reply.json().get("error", {}).get("message", "") if failed else ""  # type: ignore[union-attr]
                rows.append({
                    "probe": name, "status": reply.status_code if reply else "hung up",
                    "sent_mb": round(sent / MIB, 1), "reply_kb": round(len(reply.content) / 1024, 1) if reply else 0,
                    "seconds": round(seconds, 2), "busy_after_hang_up_s": busy,
                    "rss_before_mb": round(before / MIB), "peak_above_mb": round((peak - before) / MIB),
                    "left_above_mb": round((after - before) / MIB), "error": error[:160],
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    finally:
        server.terminate()
        server.wait(30)
    os.unlink(log.name)  # kept when a probe failed, for its traceback
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
