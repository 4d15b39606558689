#!/usr/bin/env bash
# One call on the GPU machine: the GPU test suite, fused-kernel micro-benchmarks, engine
# parity, engine-level decode speed, and the server workloads of bench/suite/serve_workloads.sh
# (serve: ISL 128 / OSL 128 at concurrency 1 and 32; agent: 8,000-token prompts, a shared prefix,
# a multi-turn replay) on random-weight checkpoints: MODELS lists shape:mix pairs
# (bench/make_random_gguf.py), by default the Qwen3-0.6B- and Qwen3-8B-shaped Q4_K_M ones, e.g.
# MODELS="llama3-8b:q4_k_m qwen3-8b:q8_0 qwen3-8b:mxfp4 qwen3-8b:st-fp8-block"; AGENT_MODELS the agent stage's.
# The machine lacks the server's wheels and gguf: run bench/fetch_wheels.sh here first, then call
# the device tool with carry [".whl"] and `STAGES="..." bash bench/gpu_run.sh`. Logs go to $OUT
# (or /tmp/gpu-run). Every stage has its own timeout and a stage is skipped once the whole run
# nears BUDGET seconds, so the call ends inside its limit.
set -u
OUT=${OUT:-/tmp/gpu-run}
BUDGET=${BUDGET:-540}
mkdir -p "$OUT"
compgen -G ".whl/*.whl" > /dev/null || { echo "no wheels in .whl/: run bench/fetch_wheels.sh and carry .whl" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/site" .whl/*.whl || exit 1
# Compiled kernels cached outside $OUT (only 8 files come back from it), shared by every stage.
export PYTHONPATH=$PWD:$HOME/site PYTHONUNBUFFERED=1 PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
STAGES=${STAGES:-tests micro parity speed serve}  # also: hostpath, dattn, agent, cascade, sweep (bench/micro/gemv_sweep.py --int), ab (see below), prefill, q4r, pattn, llamabuild, side, profile, spec, mma, wave, moe, curve, tiers
MODELS=${MODELS:-qwen3-0.6b:q4_k_m qwen3-8b:q4_k_m}  # SERVE_C1 / SERVE_C32: requests of the serve runs
AGENT_MODELS=${AGENT_MODELS:-qwen3-8b:q4_k_m}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv

# stage NAME: whether STAGES names it (whole words: "llamabuild" does not ask for "ab")
stage() { [[ " $STAGES " == *" $1 "* ]]; }
# left SECONDS: true while at least $1 seconds of the budget remain
left() { (( BUDGET - SECONDS >= $1 )); }

if stage llamabuild; then  # llama.cpp's server, built in the background (outlives this call; carry .llama)
  setsid bash bench/llama_cpp.sh build > /tmp/llama-build.out 2>&1 < /dev/null &
fi
# tests: TESTS (default tests/engine/cuda); TEST_SHARD=K/N runs the K-th of N shares of its test files (sorted, every
# N-th from the K-th), so a suite longer than one call's 10 minutes (515 s on the H100 for 1,324 tests) spans calls
# TEST_PROCS=N: N pytest processes at once on the one card, each a share of the files (the suite is mostly NVRTC
# compiles and small launches, so the CPUs, not the GPU, bound it); their logs follow each other in tests.log
shares() {  # DIR K N: every N-th test file of DIR from the K-th (sorted)
  find $1 -name 'test_*.py' | sort | awk -v k="$2" -v n="$3" '(NR - k) % n == 0'
}
if stage tests; then
  tests=${TESTS:-tests/engine/cuda}
  if [[ ${TEST_PROCS:-1} -gt 1 ]]; then
    for k in $(seq 1 "$TEST_PROCS"); do
      timeout ${TEST_S:-200} python3 -m pytest -q -m gpu $(shares "$tests" "$k" "$TEST_PROCS") ${PYTEST_ARGS-} -rf \
        -p no:cacheprovider > "/tmp/tests-$k.log" 2>&1 &
    done
    wait
    for k in $(seq 1 "$TEST_PROCS"); do echo "== share $k/$TEST_PROCS"; cat "/tmp/tests-$k.log"; done > "$OUT/tests.log"
    grep -E '^(FAILED|ERROR)|^== share| (passed|failed|error)' "$OUT/tests.log" | tail -40
  else
    [[ -n ${TEST_SHARD:-} ]] && tests=$(shares "$tests" "${TEST_SHARD%/*}" "${TEST_SHARD#*/}")
    timeout ${TEST_S:-200} python3 -m pytest -q -m gpu $tests ${PYTEST_ARGS--x} -rf -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25
  fi
fi
if stage micro && left 180; then
  timeout 100 python3 bench/suite/gpu_check.py --out /tmp/check --no-tests --only "copy bandwidth,fused" 2>&1 \
    | tee "$OUT/micro.log" | sed -n '/=== summary ===/,$p'
  cp /tmp/check/results.json "$OUT/micro.json" 2>/dev/null
fi
if stage sweep && left 150; then
  timeout 200 python3 bench/micro/gemv_sweep.py --int 2>&1 | tee "$OUT/sweep.log" | grep -o '"op": "[^"]*"\|"best": "[^"]*"\|"(.float.,)": [0-9.]*'
fi
python3 bench/make_random_gguf.py --shape tiny --out /tmp/tiny.gguf
if stage parity && left 150; then
  timeout 120 python3 bench/suite/gpu_engine.py parity /tmp/tiny.gguf 2>&1 | tee "$OUT/parity.log" | tail -3
fi
# shape:mix -> its file; a mix "st-FORMAT" (st-fp8-block, st-nvfp4, st-mix) is a safetensors folder
gguf_of() { [[ ${1##*:} == st-* ]] && echo "/tmp/${1%%:*}-${1##*:}" || echo "/tmp/${1%%:*}-${1##*:}.gguf"; }
{ stage agent || stage cascade; } && MADE="$MODELS $AGENT_MODELS" || MADE=$MODELS
# make_model SHAPE:MIX: its file, once (the hybrid Qwen 3.5 shapes and GPT-OSS have their own makers, one mix each)
make_model() {
  local model=$1 file; file=$(gguf_of "$1")
  [[ -e $file ]] && return 0
  if [[ ${model##*:} == st-* ]]; then
    python3 bench/make_random_safetensors.py --shape "${model%%:*}" --format "${model##*:st-}" --out "$file"
  elif [[ ${model%%:*} == qwen35* ]]; then
    python3 bench/make_random_hybrid_gguf.py --shape "${model%%:*}" --out "$file"
  elif [[ ${model%%:*} == gpt-oss* ]]; then  # MXFP4 experts, Q8_0 elsewhere (llama-quantize's MXFP4_MOE): gpt-oss-20b:mxfp4
    python3 bench/make_random_gpt_oss_gguf.py --shape "${model%%:*}" --out "$file"
  else
    python3 bench/make_random_gguf.py --shape "${model%%:*}" --mix "${model##*:}" --out "$file"
  fi
}
for model in $MADE; do
  make_model "$model"
done
if stage speed; then
  for model in $MODELS; do  # one process per model, both batch sizes in it
    left 90 || break
    timeout 120 python3 bench/suite/gpu_engine.py speed "$(gguf_of "$model")" --batch 1 32 2>&1 | tee -a "$OUT/speed.log" | grep '^{'
  done
fi
# ab: AB="PADDOCK_PDL=0 PADDOCK_PDL=1": quick engine speed under each setting (A=1+B=2: both). AB_BASE=DIR (an older
# tree's app/ and bench/ copied into the working tree before the call, e.g. `git archive COMMIT app bench | tar -x -C
# .ab-base`; delete it before committing): each setting runs from there too, base then tree, as "base:SETTING"
if stage ab; then
  for model in $MODELS; do
    for setting in ${AB:-PADDOCK_PDL=0 PADDOCK_PDL=1}; do
      for tree in ${AB_BASE:-} .; do
        left 60 || break 2
        label=$setting; [[ $tree != . ]] && label="base:$setting"
        echo "== $model $label" | tee -a "$OUT/ab.log"  # bench/ab_table.py reads these headers
        env ${setting//+/ } SPEED_QUICK=1 timeout 100 python3 "$tree/bench/suite/gpu_engine.py" speed "$(gguf_of "$model")" \
          --batch ${AB_BATCH:-1 32} 2>&1 | tee -a "$OUT/ab.log" | grep '^{' | sed "s/^{/{\"setting\": \"$label\", /"
      done
    done
  done
  python3 bench/ab_table.py "$OUT/ab.log"
fi
if stage prefill; then  # prefill graph replay per prompt bucket, ops of a 160-token prefill
  for model in $MODELS; do
    left 60 || break
    timeout 120 python3 bench/suite/gpu_engine.py prefill "$(gguf_of "$model")" 2>&1 | tee -a "$OUT/prefill.log" | grep '^{'
  done
fi
# profile: per PROFILE_MODELS entry (SHAPE:LAYERS, a file cut to that many layers: the per-layer cost is
# the real model's), Nsight Compute's per-kernel times of one decode step at each PROFILE_BATCHES size, then the
# engine's decode step rate and its prefill ops; JSON lines in $OUT/profile.jsonl
if stage profile; then
  for entry in ${PROFILE_MODELS:-qwen35-27b:8 qwen35-35b-a3b:8}; do
    file=/tmp/prof-${entry/:/-}.gguf
    left 120 || break
    if [[ ! -e $file && ${entry%%:*} == qwen35* ]]; then
      python3 bench/make_random_hybrid_gguf.py --shape "${entry%%:*}" --layers "${entry##*:}" --out "$file"
    elif [[ ! -e $file ]]; then  # the other shapes of make_random_gguf.py (gemma4-31b:6: five sliding layers, a global one)
      python3 bench/make_random_gguf.py --shape "${entry%%:*}" --layers "${entry##*:}" --out "$file"
    fi
    for batch in ${PROFILE_BATCHES:-1 32}; do
      left 60 || break
      timeout 180 python3 bench/micro/decode_kernel_times.py "$file" --batch "$batch" 2>&1 | tail -1 | tee -a "$OUT/profile.jsonl" | cut -c1-400
    done
    left 60 && SPEED_QUICK=1 timeout 150 python3 bench/suite/gpu_engine.py speed "$file" --batch ${PROFILE_BATCHES:-1 32} 2>&1 | grep '^{' | tee -a "$OUT/profile.jsonl"
    left 60 && timeout 90 python3 bench/suite/gpu_engine.py hostprof "$file" 1 2>&1 | tee -a "$OUT/hostprof.log" | sed -n '/tottime/,+12p'
    left 60 && timeout 120 python3 bench/suite/gpu_engine.py prefill "$file" 2>&1 | grep '^{' | tee -a "$OUT/profile.jsonl" | cut -c1-400
  done
fi
# spec: speculative decoding's verify cost (k = 2..8 drafted tokens against one decode step, c=1 and c=8) and the
# draft-model speed-up, projected from the measured costs and acceptance and measured (bench/lab/spec_verify_gpu.py),
# on SPEC_TARGET with SPEC_DRAFT, then with the target as its own draft (every greedy draft accepted: the upper
# bound); JSON lines in $OUT/spec.jsonl
if stage spec; then
  target=${SPEC_TARGET:-qwen3-8b:q4_k_m} draft=${SPEC_DRAFT:-qwen3-0.6b:q4_k_m}
  make_model "$target" && make_model "$draft"
  for d in "$draft" "$target"; do
    left 90 || break
    timeout 200 python3 bench/lab/spec_verify_gpu.py "$(gguf_of "$target")" --draft "$(gguf_of "$d")" --device cuda \
      --out "$OUT/spec.jsonl" 2>&1 | tail -4 | cut -c1-300
  done
fi
# mma: products of 2..64 tokens on quantized weights (bench/micro/gemv_mma_times.py: gemv_mma's kernels against
# cuBLAS on a float16 copy and against expanding the weight first, 8B and 27B/31B shapes); JSON lines in $OUT/mma.jsonl
if stage mma; then
  timeout 100 python3 bench/micro/gemv_mma_times.py ${MMA_ARGS:-} 2>&1 | tee "$OUT/mma.jsonl" | cut -c1-300
fi
# q4r: products of 1-128 tokens on Q4_K repacked for the tensor cores (bench/micro/gemv_q4r_times.py: gemv_q4r.cu
# against cuBLAS on a float16 copy, gemv_mma2.cu and the one-token GEMV, the Qwen3-8B's Q4_K shapes) under each of
# Q4R_DEFINES (PADDOCK_KERNEL_DEFINES values, "none" for the build as it is; "Q4R_WSMEM=0,Q4R_STAGES=3" is the
# build before the weights moved into the shared-memory stages, "Q4R_STAGES=6" a deeper pipeline); $OUT/q4r.jsonl.
# Q4R_NCU=1 adds Nsight Compute's sections of one o-product call at 32 tokens (graph nodes profiled one by one),
# $OUT/q4r-ncu.txt
if stage q4r; then
  for defines in ${Q4R_DEFINES:-none}; do
    left 60 || break
    [[ $defines == none ]] && defines=""
    echo "== PADDOCK_KERNEL_DEFINES=$defines" | tee -a "$OUT/q4r.jsonl"
    PADDOCK_KERNEL_DEFINES=$defines timeout 200 python3 bench/micro/gemv_q4r_times.py ${Q4R_ARGS:-} 2>&1 \
      | tee -a "$OUT/q4r.jsonl" | cut -c1-400
  done
  if [[ ${Q4R_NCU:-0} == 1 ]] && left 90; then
    timeout 120 ncu --graph-profiling node --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats -k regex:^gemv_q4r$ -c 1 \
      python3 bench/micro/gemv_q4r_times.py --products o --tokens 32 > "$OUT/q4r-ncu.txt" 2>&1
    grep -E "Duration|Throughput|Achieved Occupancy|Registers|Issue Slots|Stall|Executed Ipc" "$OUT/q4r-ncu.txt" | head -30
  fi
fi
# hostpath: the server's event loop per streamed token on this host's CPU (bench/lab/host_path.py: the real server
# and engine over a simulated 8.6 ms step; no GPU used), c=32 and c=128; $OUT/hostpath.jsonl. At c=128 the loop's
# CPU a token bounds tok/s (bench/results/server-loop-cpu-2026-12-07.md); under each of HOSTPATH_SETTINGS ("none": as
# it is; e.g. "PADDOCK_JOIN_BACKLOG=0 PADDOCK_JOIN_BACKLOG=1"), in turn per concurrency
if stage hostpath; then
  make_model qwen3-0.6b:q4_k_m
  for c in ${HOSTPATH_CS:-32 128}; do
    for setting in ${HOSTPATH_SETTINGS:-none}; do
      left 60 || break 2
      [[ $setting == none ]] && setting=""
      echo "== c=$c $setting" | tee -a "$OUT/hostpath.jsonl"
      env PADDOCK_ASYNC_DECODE=1 ${setting//+/ } timeout 120 python3 bench/lab/host_path.py \
        --model "$(gguf_of qwen3-0.6b:q4_k_m)" --concurrency $c --requests $((3 * c)) --decode-ms 8.6 --prefill-us 25 \
        --max-model-len 4096 2>&1 | tail -1 | tee -a "$OUT/hostpath.jsonl" | cut -c1-300
    done
  done
fi
# pattn: prefill attention alone at the last 2,048-token chunk of 2k/8k/32k prompts (bench/micro/prefill_attention_times.py)
# under each of PATTN_DEFINES ("none": the build as it is; e.g. "none PF_LAZY=8"), $OUT/pattn.jsonl; PATTN_NCU=1 adds
# Nsight Compute's sections for one 8k call of the first setting ($OUT/pattn-ncu.txt)
if stage pattn; then
  for defines in ${PATTN_DEFINES:-none}; do
    left 45 || break
    [[ $defines == none ]] && defines=""
    PADDOCK_KERNEL_DEFINES=$defines timeout 120 python3 bench/micro/prefill_attention_times.py 2>&1 | tee -a "$OUT/pattn.jsonl"
  done
  if [[ ${PATTN_NCU:-0} == 1 ]] && left 90; then
    defines=${PATTN_DEFINES%% *}; [[ $defines == none ]] && defines=""
    PADDOCK_KERNEL_DEFINES=$defines timeout 120 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats -k regex:attn_prefill -c 1 \
      python3 bench/micro/prefill_attention_times.py --once --ctx 8192 > "$OUT/pattn-ncu.txt" 2>&1
    grep -E "Duration|Throughput|Achieved Occupancy|Registers|Issue Slots|Stall|Executed Ipc" "$OUT/pattn-ncu.txt" | head -30
  fi
fi
# wave: a 32-request wave of short prompts on a Qwen3.5-27B-shaped file cut to 8 layers, step by step
# (bench/lab/hybrid_serve_trace.py --steps: prefill tokens, first tokens, state copies, GPU and host ms per step),
# with the scheduler's cuts of today and (WAVE_LEGACY=1) the old ones; JSON lines in $OUT/wave.log
if stage wave; then
  [[ -e /tmp/qwen35-27b-8.gguf ]] || python3 bench/make_random_hybrid_gguf.py --shape qwen35-27b --layers 8 --out /tmp/qwen35-27b-8.gguf > /dev/null
  for cuts in "" ${WAVE_LEGACY:+--legacy-cuts}; do
    left 70 || break
    echo "== cuts ${cuts:-today}" | tee -a "$OUT/wave.log"
    timeout 60 python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-27b-8.gguf --concurrency 32 --requests 32 --warmup 32 \
      --prompt-tokens 139 --output-tokens 8 --snapshot-rows 66 --kv-host-gb 0.52 --steps $cuts 2>&1 | tee -a "$OUT/wave.log" | tail -12
  done
fi
# moe: the MoE kernels at Qwen3.5-35B-A3B's layer shape, decode sizes and prefill sizes (bench/micro/moe_*times.py)
if stage moe; then
  timeout 90 python3 bench/micro/moe_times.py ${MOE_ARGS---compare} 2>&1 | tee "$OUT/moe.jsonl" | cut -c1-300
  [[ ${MOE_PREFILL:-1} == 1 ]] && timeout 120 python3 bench/micro/moe_prefill_times.py 2>&1 | tee -a "$OUT/moe.jsonl" | cut -c1-300
fi
# serve_paddock FILE MAX_CTX MAX_BATCH LOG WAIT: `paddock serve` on port 11660 in the background ($server: its pid),
# then up to WAIT seconds for its /health (no longer once it has exited); SERVE_ARGS: more flags (e.g.
# "--experts-on-gpu 64": issue 38's Qwen3-30B-A3B-shaped row with half its experts on the GPU). Its in-flight limit is raised past the
# default 256: a closed-loop client at c=256 sends its next request when the last one's stream ends, which can be
# before the server has let that one's slot go (a 429 ended 2026-12-06's c=256 curve row).
serve_paddock() {
  python3 -m app.cli serve --model "$1" --device cuda --max-ctx "$2" --max-batch "$3" --port 11660 --no-mcp \
    --no-embeddings --max-concurrent-requests 1024 --log-level warning ${SERVE_ARGS:-} > "$4" 2>&1 &
  server=$!
  for _ in $(seq 1 "$5"); do curl -sf localhost:11660/health > /dev/null && break; kill -0 $server 2> /dev/null || break; sleep 1; done
}
# serve_workloads WORKLOAD MAX_CTX LOG MODEL...: per model, `paddock serve` on port 11660 (its log under $OUT),
# then suite/serve_workloads.sh WORKLOAD, its JSON lines appended to $OUT/LOG
serve_workloads() {
  local workload=$1 max_ctx=$2 log=$3 model server need=75 limit=180
  [[ $workload == agent ]] && need=150 limit=300  # four runs with 8,000-token prompts
  shift 3
  for model in "$@"; do
    left $need || break
    serve_paddock "$(gguf_of "$model")" "$max_ctx" 32 "$OUT/serve-${model/:/-}.log" 90
    timeout $limit bash bench/suite/serve_workloads.sh "$workload" | tee -a "$OUT/$log"
    kill $server; wait $server 2>/dev/null
  done
}
if stage serve; then
  serve_workloads short 4096 bench.jsonl $MODELS
fi
# cascade: decode attention at agent contexts under each of CASCADE_DEFINES (default: plain loop, prefetch; "" skips),
# then bench/suite/agent_engine.py's CASCADE_CASES (c8,decode32k) under each of CASCADE_SETTINGS (cascade off / on)
# and each of CASCADE_KV (the KV cache's element type: auto by default, e.g. "f16 fp8"). CASCADE_NCU=1 first takes the
# cascade step's per-kernel times (8 sessions over an 8,000-token prefix, an 8-layer cut: decode_kernel_times.py
# --shared) into $OUT/cascade-kernels.jsonl; CASCADE_PARTS=1 the cascade's launches alone at several splits of the shared
# keys (attention_decode_times.py --cascade) into $OUT/cascade-parts.jsonl
if stage cascade; then
  if [[ ${CASCADE_PARTS:-0} == 1 ]] && left 90; then
    timeout 150 python3 bench/micro/attention_decode_times.py --cascade 2>&1 | tee "$OUT/cascade-parts.jsonl" | cut -c1-900
  fi
  if [[ ${CASCADE_NCU:-0} == 1 ]] && left 120; then
    cut8=/tmp/prof-qwen3-8b-8.gguf
    [[ -e $cut8 ]] || python3 bench/make_random_gguf.py --shape qwen3-8b --layers 8 --out $cut8 > /dev/null
    timeout 100 python3 bench/micro/decode_kernel_times.py $cut8 --batch 8 --context 8000 --shared --out "$OUT" 2>&1 \
      | tail -1 | tee "$OUT/cascade-kernels.jsonl" | cut -c1-1200
  fi
  for defines in ${CASCADE_DEFINES-"" DEC_PREFETCH=1}; do
    echo "== PADDOCK_KERNEL_DEFINES=$defines" | tee -a "$OUT/cascade.log"
    PADDOCK_KERNEL_DEFINES=$defines timeout 90 python3 bench/micro/attention_decode_times.py --long 2>&1 \
      | tee -a "$OUT/cascade.log" | grep '^{'
  done
  for setting in ${CASCADE_SETTINGS:-PADDOCK_CASCADE=0 PADDOCK_CASCADE=1 PADDOCK_CASCADE=1+PADDOCK_KERNEL_DEFINES=DEC_PREFETCH=1}; do
    for kv in ${CASCADE_KV:-auto}; do
      left 120 || break 2
      echo "== $setting kv $kv" | tee -a "$OUT/cascade.log"
      env ${setting//+/ } timeout 240 python3 bench/suite/agent_engine.py "$(gguf_of "${AGENT_MODELS%% *}")" \
        --cases ${CASCADE_CASES:-c8,decode32k} --kv-dtype "$kv" 2>&1 | tee -a "$OUT/cascade.log" | grep '^{' | cut -c1-600
    done
  done
fi
# dattn: decode attention alone at 16-128 sequences of short contexts and 32 of 4k (bench/micro/
# attention_decode_times.py --batch: block counts, clusters on and off; DATTN_ARGS=--plan-only: the serving plan only)
# under each of DATTN_DEFINES ("none": as it is);
# DATTN_NCU=1 adds Nsight Compute's sections of one launch at 128 sequences x 256 keys, the first setting ($OUT/dattn-ncu.txt)
if stage dattn; then
  for defines in ${DATTN_DEFINES:-none}; do
    left 45 || break
    [[ $defines == none ]] && defines=""
    echo "== PADDOCK_KERNEL_DEFINES=$defines" | tee -a "$OUT/dattn.jsonl"
    PADDOCK_KERNEL_DEFINES=$defines timeout 150 python3 bench/micro/attention_decode_times.py --batch ${DATTN_ARGS:-} 2>&1 | tee -a "$OUT/dattn.jsonl" | cut -c1-600
  done
  if [[ ${DATTN_NCU:-0} == 1 ]] && left 90; then
    defines=${DATTN_DEFINES%% *}; [[ $defines == none ]] && defines=""
    PADDOCK_KERNEL_DEFINES=$defines timeout 120 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section SourceCounters \
      -k regex:^attn_dec -s 1 -c 1 python3 bench/micro/attention_decode_times.py --ncu 128 256 > "$OUT/dattn-ncu.txt" 2>&1
    grep -E "Duration|Throughput|Achieved Occupancy|Registers|Issue Slots|Stall|Executed Ipc|Block Limit" "$OUT/dattn-ncu.txt" | head -40
  fi
fi
# side: per SIDE_MODELS entry, ISL/OSL 128 at c=1 and c=32 and an 8,000-token TTFT on our server, then on
# llama.cpp's (bench/llama_cpp.sh; the llamabuild stage of this call or an earlier one on the same warm
# machine builds it) with the same file; JSON lines tagged with engine and model in $OUT/side.jsonl. Each
# file is deleted after its rows (the machine's disk holds ~60 GB).
SIDE_MODELS=${SIDE_MODELS:-qwen35-27b:q4_k_m qwen35-35b-a3b:q4_k_m}  # SIDE_LLAMA: those of them llama.cpp runs too (default all)
# SIDE_ONLY_C1=1: the c=1 row alone (no c=32, no 8,000-token TTFT)
side_rows() {  # ENGINE MODEL PORT
  local tag="{\"engine\": \"$1\", \"model\": \"$2\", "
  if [[ ${SIDE_ONLY_C1:-0} == 1 ]]; then
    timeout 120 python3 -m app.cli bench --url "http://127.0.0.1:$3" --json --output-tokens 128 --concurrency 1 \
      --requests ${SIDE_C1:-8} --input-tokens 128 | sed "s/^{/$tag/" | tee -a "$OUT/side.jsonl"
    return
  fi
  URL=http://127.0.0.1:$3 SERVE_C1=${SIDE_C1:-8} SERVE_C32=${SIDE_C32:-64} timeout 240 \
    bash bench/suite/serve_workloads.sh short | sed "s/^{/$tag/" | tee -a "$OUT/side.jsonl"
  timeout 120 python3 -m app.cli bench --url "http://127.0.0.1:$3" --json --concurrency 1 --requests ${SIDE_TTFT:-3} \
    --warmup 1 --input-tokens 8000 --output-tokens 16 | sed "s/^{/$tag\"workload\": \"ttft8k\", /" | tee -a "$OUT/side.jsonl"
}
if stage side; then
  for model in $SIDE_MODELS; do
    left 240 || break
    make_model "$model"
    file=$(gguf_of "$model")
    serve_paddock "$file" 16384 32 "/tmp/serve-${model/:/-}.log" 240
    side_rows paddock "$model" 11660
    # expert bytes copied from host RAM over the rows (--experts-on-gpu below the experts' count) and tokens made
    curl -s http://127.0.0.1:11660/metrics | grep -E "^paddock_engine_(expert_copied_bytes|generation_tokens)" \
      | sed "s/^/$model ${SERVE_ARGS:-} /" | tee -a "$OUT/side.log"
    kill $server; wait $server 2> /dev/null
    for _ in $(seq 1 ${LLAMA_WAIT:-300}); do [[ -x /tmp/llama-build/bin/llama-server ]] && break; sleep 1; done
    if [[ ${SIDE_LLAMA:-all} != all && " $SIDE_LLAMA " != *" $model "* ]]; then
      echo "llama.cpp: not asked for $model (SIDE_LLAMA)" | tee -a "$OUT/side.log"
    elif left 100 && bash bench/llama_cpp.sh serve "$file" 32 131072; then
      side_rows llama.cpp "$model" 11661
      kill "$(cat /tmp/llama-server.pid)"; sleep 2
    else
      echo "llama.cpp: no rows for $model" | tee -a "$OUT/side.log"; tail -5 /tmp/llama-build.out /tmp/llama-build.log 2> /dev/null
    fi
    # the servers' logs stay in /tmp (only 8 files come back from $OUT): their ends go into side.log
    tail -n 12 "/tmp/serve-${model/:/-}.log" "/tmp/llama-server-$(basename "$file" .gguf).log" >> "$OUT/side.log" 2> /dev/null
    [[ ${KEEP_FILES:-0} == 1 ]] || rm -f "$file"
  done
fi
# tiers: issue 38's KV tiers through `paddock serve` (suite/tiers_session.py) on TIERS_MODEL: a 16-turn agent
# session (8,000-token prefix, 1,000 new and 64 out a turn) on a GPU pool of its longest turn, another client's
# prompt between turns spilling its history to host RAM (cached tokens per tier, bytes moved, TTFT per turn);
# then an 8,000-token prompt kept by the disk tier over a SIGTERM and a restart, against its recompute. Three
# server starts; TIERS_ARGS passes more flags (e.g. "--kv-blocks 1200 --other-tokens 12000"). $OUT/tiers.jsonl
# curve: output rate against concurrency on one server (`paddock serve --max-batch CURVE_MAX_BATCH`, default 256)
# per MODELS entry: ISL/OSL 128 at each of CURVE_CS (default 1 32 64 128 256), CURVE_WAVES x C requests each (at
# least 4; default 3 waves, so the rate is the steady state's, not one wave's prefill), after `paddock bench`'s
# warm-up of C requests; JSON lines in $OUT/curve.jsonl
if stage curve; then
  for model in $MODELS; do
    left 120 || break
    serve_paddock "$(gguf_of "$model")" 4096 "${CURVE_MAX_BATCH:-256}" "/tmp/curve-${model/:/-}.log" 120
    for c in ${CURVE_CS:-1 32 64 128 256}; do
      left 30 || break
      requests=$(( c * ${CURVE_WAVES:-3} > 4 ? c * ${CURVE_WAVES:-3} : 4 ))
      timeout 120 python3 -m app.cli bench --url http://127.0.0.1:11660 --json --concurrency "$c" --requests $requests \
        --input-tokens 128 --output-tokens 128 | sed "s/^{/{\"engine\": \"paddock\", \"model\": \"$model\", /" | tee -a "$OUT/curve.jsonl" | cut -c1-200
    done
    kill $server; wait $server 2> /dev/null
    tail -n 12 "/tmp/curve-${model/:/-}.log" >> "$OUT/curve.log"
    # CURVE_LLAMA=1: the same points on llama.cpp's server (a slot per stream at the largest c), same file and client
    if [[ ${CURVE_LLAMA:-0} == 1 ]] && left 60; then
      cs=(${CURVE_CS:-1 32 64 128 256}); top=${cs[-1]}
      for _ in $(seq 1 ${LLAMA_WAIT:-300}); do [[ -x /tmp/llama-build/bin/llama-server ]] && break; sleep 1; done
      if bash bench/llama_cpp.sh serve "$(gguf_of "$model")" "$top" $(( top * 512 )); then
        for c in "${cs[@]}"; do
          left 30 || break
          requests=$(( c * ${CURVE_WAVES:-3} > 4 ? c * ${CURVE_WAVES:-3} : 4 ))
          timeout 150 python3 -m app.cli bench --url http://127.0.0.1:11661 --json --concurrency "$c" --requests $requests \
            --input-tokens 128 --output-tokens 128 | sed "s/^{/{\"engine\": \"llama.cpp\", \"model\": \"$model\", /" \
            | tee -a "$OUT/curve.jsonl" | cut -c1-200
        done
        kill "$(cat /tmp/llama-server.pid)"; sleep 2
      fi
    fi
  done
fi
if stage tiers && left 180; then
  make_model "${TIERS_MODEL:-qwen3-8b:q4_k_m}"
  timeout -k 60 ${TIERS_S:-240} python3 bench/suite/tiers_session.py "$(gguf_of "${TIERS_MODEL:-qwen3-8b:q4_k_m}")" \
    --device cuda --out "$OUT/tiers.jsonl" ${TIERS_ARGS:-} 2>&1 | tail -30
fi
if stage agent; then
  serve_workloads agent 16384 agent.jsonl $AGENT_MODELS
  python3 bench/suite/bench_table.py "$OUT/agent.jsonl"
fi
echo "run took $SECONDS s"
