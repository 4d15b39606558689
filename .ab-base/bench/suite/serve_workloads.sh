#!/usr/bin/env bash
# The suite's server workloads: `paddock bench` (streaming chat, ignore_eos + min_tokens) against a
# running OpenAI-compatible server, ours or llama.cpp's, one JSON line per run on stdout.
#
#   bench/suite/serve_workloads.sh short   # ISL 128 / OSL 128 at concurrency 1 and 32
#   bench/suite/serve_workloads.sh agent   # 8,000-token prompt at c=1; 8,000-token shared prefix + 140
#                                          # new at c=1 and c=8; a 4-turn replay at c=8 (128 out each)
#
# URL (default http://127.0.0.1:11660); SERVE_C1 / SERVE_C32 requests of the short runs (12 / 96);
# PYTHON (default python3). The agent runs need a context of ~10,000 tokens and 8 sequences at once.
set -uo pipefail  # a failed run prints its error and the next one still runs
cd "$(dirname "$0")/../.."
URL=${URL:-http://127.0.0.1:11660}
bench() { ${PYTHON:-python3} -m app.cli bench --url "$URL" --json --output-tokens 128 "$@"; }
case ${1:-} in
  short)
    bench --concurrency 1 --requests "${SERVE_C1:-12}" --input-tokens 128
    bench --concurrency 32 --requests "${SERVE_C32:-96}" --input-tokens 128
    ;;
  agent)
    bench --concurrency 1 --requests 4 --input-tokens 8000                      # TTFT: a full prefill
    bench --concurrency 1 --requests 8 --prefix-tokens 8000 --input-tokens 140   # TTFT of a cache hit
    bench --concurrency 8 --requests 32 --prefix-tokens 8000 --input-tokens 140  # long-context batched decode
    bench --concurrency 8 --turns 4 --prefix-tokens 8000 --input-tokens 140      # each turn re-sends the last
    ;;
  *)
    echo "usage: $0 short|agent" >&2
    exit 2
    ;;
esac
