"""Issue 38's KV-tier measurement, unattended, through `paddock serve` (one JSON line per phase to --out).

    python3 bench/suite/tiers_session.py MODEL.gguf --device cuda --out tiers.jsonl
    python3 bench/suite/tiers_session.py /tmp/tiny.gguf --device cpu --prefix-tokens 1000 --input-tokens 150 \\
        --output-tokens 16 --disk-prompt-tokens 2000 --out tiers.jsonl       # the CPU run on a tiny file

Phases, each on a fresh `paddock serve` whose KV pool is `--kv-blocks` blocks, each measured after a warm-up
request:
- recompute: the disk prompt (`--disk-prompt-tokens` of fresh text) on the session's server, no disk tier:
  TTFT with nothing cached.
- session: the agent replay of `paddock bench --turns 16 --concurrency 1 --prefix-tokens 8000 --input-tokens
  1000 --output-tokens 64` (app/commands/bench_load.py's requests), turn by turn, with another client's
  one-off prompt of `--other-tokens` fresh tokens after each turn. One session alone can never spill: a
  running request's KV must all be on the device (the engine caps the context at the pool), and between
  turns the tree keeps its whole history. The other prompt is what makes the history outgrow what the pool
  keeps: it evicts the session's least recently used blocks to host RAM (`--kv-host-gb`), and the next turn
  takes them back from there. Per turn: prompt and cached tokens, TTFT, and from /metrics the cached tokens
  per tier and the bytes copied host<->device.
- disk_write: a server with `--kv-disk-gb`/`--kv-disk-dir` serves the disk prompt, then is stopped with
  SIGTERM, which has the engine move its prefix cache down to the disk tier (persist_prefix_cache).
- disk_restart: a new server on the same folder serves the same prompt: TTFT and cached tokens, against
  the recompute phase's.
The pool defaults to the session's longest turn and a margin (rounded to blocks), the other prompt to what
evicts the session's tail from the first turn on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from app.commands.bench_load import Plan, exact_text, stream_turn, turn_messages  # noqa: E402

BLOCK = 16  # EngineConfig.block_size: the serve command has no flag for it
TEMPLATE_SLACK = 24  # chat-template tokens per turn around the two messages
# A random-weight model's reply re-tokenizes into more tokens than it generated (measured: 16 -> ~40 on the tiny
# shape): the pool counts each re-sent reply this many times its length.
REPLY_GROWTH = 2
WARMUP_TOKENS = 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a .gguf file or model folder")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per phase (appended)")
    parser.add_argument("--port", type=int, default=11670)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=8000)
    parser.add_argument("--input-tokens", type=int, default=1000)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--kv-blocks", type=int, default=None, help="the GPU pool (default: the longest turn's)")
    parser.add_argument("--other-tokens", type=int, default=None,
                        help="another client's prompt between turns (default: the pool less half the first turn)")
    parser.add_argument("--kv-host-gb", type=float, default=16.0)
    parser.add_argument("--disk-prompt-tokens", type=int, default=8000)
    parser.add_argument("--kv-disk-gb", type=float, default=4.0)
    parser.add_argument("--kv-disk-dir", type=Path, default=None, help="default: a temporary folder, removed after")
    parser.add_argument("--phases", default="recompute,session,disk",
                        help="which of recompute, session, session_nohost (the session without the host tier), disk")
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here (default: removed)")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds a server may take to load")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)  # fmt: skip


def pool_blocks(args: argparse.Namespace) -> int:
    """--kv-blocks, or the session's longest turn (prompt and output) with 5 % to spare, plus the null block."""
    if args.kv_blocks:
        return args.kv_blocks
    turn = args.input_tokens + REPLY_GROWTH * args.output_tokens + TEMPLATE_SLACK
    longest = args.prefix_tokens + args.turns * turn
    return math.ceil(max(longest, args.disk_prompt_tokens + WARMUP_TOKENS) * 1.05 / BLOCK) + 1


def other_tokens(args: argparse.Namespace, blocks: int) -> int:
    """--other-tokens, or the pool less half the first turn: with it, the first turn's tail already spills."""
    if args.other_tokens is not None:
        return args.other_tokens
    return (blocks - 1) * BLOCK - (args.prefix_tokens + args.input_tokens) // 2


class Server:
    """`paddock serve` in a child process: started, waited for on /health, stopped with SIGTERM (graceful:
    the engine thread persists its prefix cache to a disk tier on the way out)."""

    def __init__(self, args: argparse.Namespace, blocks: int, extra: list[str], log: Path) -> None:
        self.url, self.log_path = f"http://127.0.0.1:{args.port}", log
        command = [sys.executable, "-m", "app.cli", "serve", "--model", args.model, "--device", args.device,
                   "--port", str(args.port), "--kv-blocks", str(blocks), "--max-batch", "4", "--no-mcp",
                   "--no-embeddings", "--log-level", "info", *extra]  # fmt: skip
        self._log = log.open("w")
        started = time.perf_counter()
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        while time.perf_counter() - started < args.start_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"paddock serve exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            self.stop()
            raise RuntimeError(f"paddock serve did not answer /health in {args.start_timeout:g} s:\n{self.tail()}")
        self.load_s = time.perf_counter() - started

    def plan_line(self) -> str:
        """The engine's one-line plan (engine_plan.EnginePlan.describe) from the server's log."""
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if "plan: " in line]
        return lines[-1].split("plan: ", 1)[1] if lines else ""

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 180.0) -> float:
        """SIGTERM and wait; the seconds it took to exit (the disk tier's writes included)."""
        started = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return time.perf_counter() - started


async def metrics(client: httpx.AsyncClient) -> dict[str, float]:
    """The tier counters of /metrics: cached tokens per tier, bytes moved per direction, evicted blocks."""
    from prometheus_client.parser import text_string_to_metric_families

    response = await client.get("/metrics")
    response.raise_for_status()
    wanted = {"paddock_engine_prefix_cache_hit_tokens_by_tier_total": "tier",
              "paddock_engine_kv_moved_bytes_total": "direction"}  # fmt: skip
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in wanted:
                values[f"{sample.labels[wanted[sample.name]]}"] = sample.value
            elif sample.name == "paddock_engine_kv_evicted_blocks_total":
                values["evicted_blocks"] = sample.value
    return values


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """What changed between two /metrics readings, under short names."""
    names = {"device": "cached_device", "host": "cached_host", "disk": "cached_disk",
             "host_to_device": "bytes_host_to_device", "device_to_host": "bytes_device_to_host",
             "from_disk": "bytes_from_disk", "to_disk": "bytes_to_disk", "evicted_blocks": "evicted_blocks"}  # fmt: skip
    return {short: int(after.get(key, 0) - before.get(key, 0)) for key, short in names.items()}


async def one_prompt(client: httpx.AsyncClient, model: str, text: str, output_tokens: int = 1) -> dict:
    """One user message, streamed: TTFT, prompt and cached tokens, and the tier traffic it caused."""
    before = await metrics(client)
    plan = Plan(model=model, output_tokens=output_tokens, prefix="", turns=1)
    reply = await stream_turn(client, plan, turn_messages("", [], text))
    usage = reply["usage"]
    return {"ttft_ms": 1000 * reply["ttft"], "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            **moved(before, await metrics(client))}  # fmt: skip


async def texts(client: httpx.AsyncClient, model: str, rng: random.Random, *lengths: int) -> list[str]:
    return [await exact_text(client, model, n, rng) for n in lengths]


async def session(
    client: httpx.AsyncClient, model: str, args: argparse.Namespace, other: int, rows: list[dict]
) -> list[dict]:
    """The agent replay turn by turn, another client's fresh prompt after each turn but the last; each turn's
    row appended to `rows` as it ends (what a run cut short has done stays recorded)."""
    rng = random.Random(args.seed + 1)
    prefix, *news = await texts(client, model, rng, args.prefix_tokens, *[args.input_tokens] * args.turns)
    plan = Plan(model=model, output_tokens=args.output_tokens, prefix=prefix, turns=args.turns)
    history: list[dict] = []
    for turn, text in enumerate(news, start=1):
        before = await metrics(client)
        try:
            reply = await stream_turn(client, plan, turn_messages(prefix, history, text))
        except RuntimeError as exc:  # a turn past the pool (400): recorded, and the session ends there
            rows.append({"turn": turn, "error": str(exc)[:300]})
            print(f"  turn {turn:2}: {rows[-1]['error']}", flush=True)
            break
        usage = reply["usage"]
        row = {"turn": turn, "prompt_tokens": usage.get("prompt_tokens", 0),
               "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
               "ttft_ms": 1000 * reply["ttft"], **moved(before, await metrics(client))}  # fmt: skip
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply["answer"]}]
        if turn < args.turns and other:
            [other_text] = await texts(client, model, rng, other)
            pressure = await one_prompt(client, model, other_text)
            row["other"] = {k: pressure[k] for k in ("prompt_tokens", "ttft_ms", "bytes_device_to_host",
                                                    "evicted_blocks")}  # fmt: skip
        rows.append(row)
        print(f"  turn {turn:2}: prompt {row['prompt_tokens']:6}, cached {row['cached_tokens']} (device "
              f"{row['cached_device']}, host {row['cached_host']}), TTFT {row['ttft_ms']:8.1f} ms, "
              f"host->device {row['bytes_host_to_device'] / 2**20:8.1f} MiB", flush=True)  # fmt: skip
    return rows


async def warm_then(server: Server, args: argparse.Namespace, prompt_seed: int, work) -> tuple[str, object]:
    """Warm-up requests of fresh text on `server`, then `work`: the text twice, so both a whole prefill and one
    after a prefix hit (a short chunk over a long cached context: kernels of their own, JIT-compiled on the
    CPU at first use) have run before anything is measured."""
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        [warm] = await texts(client, model, random.Random(prompt_seed), WARMUP_TOKENS)
        for _ in range(2):
            await one_prompt(client, model, warm, output_tokens=4)
        return model, await work(client, model)


def disk_prompt(args: argparse.Namespace):
    """The same --disk-prompt-tokens text on every server (a fixed seed, the server's own tokenizer)."""

    async def send(client: httpx.AsyncClient, model: str) -> dict:
        [text] = await texts(client, model, random.Random(args.seed + 2), args.disk_prompt_tokens)
        return await one_prompt(client, model, text, output_tokens=4)

    return send


def record(out, phase: str, common: dict, **fields) -> dict:
    line = {"phase": phase, **common, **fields}
    out.write(json.dumps(line) + "\n")
    out.flush()
    return line


PHASES = ("recompute", "session", "session_nohost", "disk")


def run(args: argparse.Namespace) -> list[dict]:
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - set(PHASES)
    if unknown:
        raise SystemExit(f"--phases: unknown {', '.join(sorted(unknown))} ({', '.join(PHASES)})")
    blocks = pool_blocks(args)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="tiers-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    common = {"model": Path(args.model).name, "device": args.device, "kv_blocks": blocks,
              "pool_tokens": (blocks - 1) * BLOCK, "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    host = ["--kv-host-gb", f"{args.kv_host_gb:g}"]
    lines: list[dict] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as out:
        if phases & {"recompute", "session"}:
            server = Server(args, blocks, host, logs / "session.log")
            try:
                if "recompute" in phases:
                    _, result = asyncio.run(warm_then(server, args, args.seed + 10, disk_prompt(args)))
                    lines.append(record(out, "recompute", common, disk_tier=False, load_s=server.load_s,
                                        plan=server.plan_line(), **result))  # fmt: skip
                if "session" in phases:
                    lines.append(session_phase(args, server, "session", blocks, common, out))
            finally:
                server.stop()
        if "session_nohost" in phases:  # the control: the same session, the spilled history recomputed
            server = Server(args, blocks, ["--kv-host-gb", "0"], logs / "session-nohost.log")
            try:
                lines.append(session_phase(args, server, "session_nohost", blocks, common, out))
            finally:
                server.stop()
        if "disk" in phases:
            lines += disk_phases(args, blocks, common, host, logs, out)
    if args.logs is None:
        shutil.rmtree(logs, ignore_errors=True)
    return lines


def session_phase(args: argparse.Namespace, server: Server, phase: str, blocks: int, common: dict, out) -> dict:
    """The session replay on `server`, recorded as one line even when cut short."""
    other = other_tokens(args, blocks)
    host_gb = 0.0 if phase == "session_nohost" else args.kv_host_gb
    print(f"{phase}: {args.turns} turns, prefix {args.prefix_tokens}, +{args.input_tokens} in / {args.output_tokens} "
          f"out a turn, another client's {other}-token prompt between turns; pool {blocks} blocks "
          f"({(blocks - 1) * BLOCK} tokens), host tier {host_gb:g} GB")  # fmt: skip
    rows: list[dict] = []

    async def replay(client: httpx.AsyncClient, model: str) -> list[dict]:
        return await session(client, model, args, other, rows)

    started = time.perf_counter()
    try:
        asyncio.run(warm_then(server, args, args.seed + 11, replay))
    finally:  # cut short (SIGTERM from a timeout, an error): the turns done are still a line
        line = record(out, phase, common, kv_host_gb=host_gb, other_tokens=other, turns=rows,
                      wall_s=time.perf_counter() - started, plan=server.plan_line(),
                      complete=len(rows) == args.turns and not any("error" in r for r in rows),
                      **session_totals(rows))  # fmt: skip
    return line


def disk_phases(args: argparse.Namespace, blocks: int, common: dict, host: list[str], logs: Path, out) -> list[dict]:
    """Serve the disk prompt with a disk tier, stop (it persists), start again on the folder, serve it again."""
    folder = args.kv_disk_dir or Path(tempfile.mkdtemp(prefix="tiers-kv-"))
    disk = [*host, "--kv-disk-gb", f"{args.kv_disk_gb:g}", "--kv-disk-dir", str(folder)]
    lines = []
    try:
        server = Server(args, blocks, disk, logs / "disk-write.log")
        try:
            _, result = asyncio.run(warm_then(server, args, args.seed + 12, disk_prompt(args)))
        finally:
            stop_s = server.stop()
        files = list(folder.rglob("*.kvb"))
        lines.append(record(out, "disk_write", common, load_s=server.load_s, stop_s=stop_s, disk_files=len(files),
                            disk_bytes=sum(f.stat().st_size for f in files), **result))  # fmt: skip
        server = Server(args, blocks, disk, logs / "disk-restart.log")
        try:
            _, result = asyncio.run(warm_then(server, args, args.seed + 13, disk_prompt(args)))
        finally:
            server.stop()
        lines.append(record(out, "disk_restart", common, load_s=server.load_s, **result))
    finally:
        if args.kv_disk_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    return lines


def session_totals(rows: list[dict]) -> dict:
    """The session's sums: cached tokens per tier, bytes back from host RAM, turns that hit the host tier."""
    done = [r for r in rows if "error" not in r]
    return {"turns_done": len(done), "turns_hitting_host": sum(1 for r in done if r["cached_host"] > 0),
            "cached_host_total": sum(r["cached_host"] for r in done),
            "cached_device_total": sum(r["cached_device"] for r in done),
            "ttft_ms_total": sum(r["ttft_ms"] for r in done),
            "recomputed_tokens_total": sum(r["prompt_tokens"] - (r["cached_tokens"] or 0) for r in done),
            "bytes_host_to_device_total": sum(r["bytes_host_to_device"] for r in done),
            "bytes_device_to_host_total": sum(r["bytes_device_to_host"] + r.get("other", {}).get(
                "bytes_device_to_host", 0) for r in done)}  # fmt: skip


def summary(lines: list[dict]) -> str:
    """The phases in a few readable lines."""
    by = {line["phase"]: line for line in lines}
    text = []
    for name in ("session", "session_nohost"):
        if name not in by:
            continue
        s = by[name]
        text.append(f"{name}: {s['turns_done']} turns, {s['turns_hitting_host']} hit the host tier; cached from "
                    f"host {s['cached_host_total']} tokens, from the device {s['cached_device_total']}; "
                    f"{s['bytes_host_to_device_total'] / 2**20:.1f} MiB host->device, "
                    f"{s['bytes_device_to_host_total'] / 2**20:.1f} MiB device->host; {s['recomputed_tokens_total']} "
                    f"prompt tokens computed, TTFT {s['ttft_ms_total'] / 1000:.2f} s over the turns")  # fmt: skip
    if "session" in by and "session_nohost" in by and by["session_nohost"]["ttft_ms_total"]:
        text.append(f"session TTFT with the host tier / without: "
                    f"{by['session']['ttft_ms_total'] / by['session_nohost']['ttft_ms_total']:.2f}")  # fmt: skip
    for phase in ("recompute", "disk_write", "disk_restart"):
        if phase in by:
            p = by[phase]
            text.append(f"{phase}: prompt {p['prompt_tokens']}, cached {p['cached_tokens']} (disk "
                        f"{p['cached_disk']}), TTFT {p['ttft_ms']:.1f} ms" + (
                            f"; {p['disk_files']} block files, {p['disk_bytes'] / 2**20:.1f} MiB, stop "
                            f"{p['stop_s']:.1f} s" if phase == "disk_write" else ""))  # fmt: skip
    if "recompute" in by and "disk_restart" in by:
        text.append(f"disk restart TTFT / recompute TTFT: "
                    f"{by['disk_restart']['ttft_ms'] / by['recompute']['ttft_ms']:.2f}")  # fmt: skip
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # a SIGTERM (the stage's timeout) unwinds through the `finally`s: the servers stop, the lines are written
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        lines = run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summary(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
