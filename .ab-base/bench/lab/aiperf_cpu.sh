#!/usr/bin/env bash
# The seed-style aiperf workload against `paddock serve --device cpu` (the embedded Gemma 3 270M):
# streaming chat, synthetic input 128 tokens, output 128 tokens (ignore_eos + min_tokens, as vLLM
# takes them), concurrency 4, a bounded request count. Writes aiperf's summary and a short report
# to bench/results/aiperf-cpu-<date>.{json,md}; aiperf's full artifacts go to bench/results/raw/.
#
#   bench/lab/aiperf_cpu.sh                  # REQUESTS=16 PORT=18123 by default
#   REQUESTS=24 bench/lab/aiperf_cpu.sh
#
# Needs a separate venv with aiperf (it pins its own dependency versions):
#   python3 -m venv .venv-bench && .venv-bench/bin/pip install aiperf
# No network is used: aiperf gets the model's own tokenizer, exported from the GGUF to a folder.
# (aiperf 0.13 mishandles a local tokenizer path when HF_HUB_OFFLINE is set, so it is left unset;
# an absolute path is never looked up on the hub.)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

REQUESTS=${REQUESTS:-16}  # 4 rounds of 4 x 128 tokens: ~10 min on 2 quiet cores, 19 min when they were shared
PORT=${PORT:-18123}
ISL=128
OSL=128
CONCURRENCY=4
MODEL=gemma-3-270m-q4_k_m
STAMP=$(date -u +%Y-%m-%d)
RAW=$ROOT/bench/results/raw/aiperf-cpu-$STAMP
TOKENIZER=$ROOT/bench/results/raw/gemma3-270m-tokenizer
OUT=$ROOT/bench/results/aiperf-cpu-$STAMP

# 1. the served model's tokenizer as a Hugging Face folder, so aiperf counts the tokens the server counts
if [ ! -f "$TOKENIZER/tokenizer.json" ]; then
  .venv/bin/python - "$TOKENIZER" <<'EOF'
import json, pathlib, sys
from app.engine.core.engine import resolve_model_path
from app.engine.loader.gguf import read_gguf
from app.engine.loader.tokenizer import Tokenizer

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
tok = Tokenizer.from_gguf_metadata(read_gguf(resolve_model_path("default")).metadata)
tok._backend.save(str(out / "tokenizer.json"))  # the `tokenizers` object the engine itself encodes with
config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos_token, "eos_token": tok.eos_token}
(out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
EOF
fi

# 2. the server, on loopback, stopped however this script ends
.venv/bin/paddock serve --device cpu --host 127.0.0.1 --port "$PORT" --log-level warning &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { echo "paddock serve exited" >&2; exit 1; }
  sleep 1
done

# 3. the workload, with the machine's load sampled beside it (other work on the cores slows every figure)
mkdir -p "$RAW"
(while true; do cut -d' ' -f1 /proc/loadavg; sleep 30; done) > "$RAW/loadavg.txt" &
SAMPLER=$!
trap 'kill "$SAMPLER" "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true' EXIT
COMMAND=(.venv-bench/bin/aiperf profile
  --model "$MODEL" --tokenizer "$TOKENIZER" --url "http://127.0.0.1:$PORT"
  --endpoint-type chat --streaming
  --isl "$ISL" --isl-stddev 0 --prompt-output-tokens-mean "$OSL" --prompt-output-tokens-stddev 0
  --extra-inputs ignore_eos:true --extra-inputs "min_tokens:$OSL"
  --concurrency "$CONCURRENCY" --request-count "$REQUESTS" --random-seed 0
  --workers-max 1 --record-processor-service-count 1  # leave the two cores to the server
  --ui-type none --output-artifact-dir "$RAW")
"${COMMAND[@]}" | tee "$RAW/console.txt"
kill "$SAMPLER" 2>/dev/null || true

# 4. the summary beside the command that made it
cp "$RAW/profile_export_aiperf.json" "$OUT.json"
.venv/bin/python - "$OUT" "$RAW/loadavg.txt" "${COMMAND[*]}" <<'EOF'
import json, platform, statistics, subprocess, sys

out, load_file, command = sys.argv[1:]
loads = [float(line) for line in open(load_file) if line.strip()]
summary = json.load(open(out + ".json"))
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
aiperf_version = summary.get("aiperf_version", "?")


def stat(name: str, key: str = "p50") -> str:
    metric = summary.get(name) or {}
    value = metric.get(key, metric.get("avg"))
    return "n/a" if value is None else f"{value:,.2f} {metric.get('unit', '')}".strip()


rows = [
    ("Output token throughput", stat("output_token_throughput", "avg")),
    ("TTFT p50", stat("time_to_first_token")),
    ("ITL p50", stat("inter_token_latency")),
    ("TTFT p90", stat("time_to_first_token", "p90")),
    ("ITL p90", stat("inter_token_latency", "p90")),
    ("Request latency p50", stat("request_latency")),
    ("Request throughput", stat("request_throughput", "avg")),
    ("Output tokens per request p50", stat("output_sequence_length")),
    ("Input tokens per request p50", stat("input_sequence_length")),
    ("Requests completed", stat("request_count", "avg")),
    ("Request error rate", stat("request_error_rate", "avg")),
    ("Benchmark duration", stat("benchmark_duration", "avg")),
]
lines = [
    f"# aiperf against `paddock serve --device cpu` ({out.rsplit('aiperf-cpu-', 1)[1]})",
    "",
    f"- Machine: {cpu}, {cores} cores, no GPU; Python {platform.python_version()}; aiperf {aiperf_version}.",
    f"- 1-minute load average every 30 s during the run: min {min(loads):.1f}, median "
    f"{statistics.median(loads):.1f}, max {max(loads):.1f} (above 2, other work shared the two cores).",
    "- Model: embedded Gemma 3 270M Q4_K_M on the numpy backend; server defaults otherwise.",
    "- Workload: streaming chat, synthetic input 128 tokens, output 128 tokens "
    "(`ignore_eos`, `min_tokens` 128), concurrency 4, tokens counted with the model's own tokenizer.",
    "",
    "| metric | value |",
    "| --- | --- |",
    *[f"| {name} | {value} |" for name, value in rows],
    "",
    "Command (bench/lab/aiperf_cpu.sh):",
    "",
    "```",
    command,
    "```",
    "",
]
open(out + ".md", "w").write("\n".join(lines))
print("\n".join(lines))
EOF
