# The next lease's calls (written in session 30). Carry [".whl", ".llama"] (.llama/llama-server.xz: llama.cpp's server,
# prebuilt on the VM with `bench/llama_cpp.sh prebuilt`; without it the side rows of PART=2 have no llama.cpp column).
# PART=4 (about 560 s): the table's other rows: Q8_0 8B at c=1 and c=32; the c=8 shared-prefix row with an FP8 KV
#   cache against float16, at the engine and served (goal: faster than float16).
# run returns at most 8 files: each stage works in /tmp and copies its file into $OUT as it ends.
# PART=3 first: `mkdir .ab-base && git archive 852bf82 app bench | tar -x -C .ab-base` (main before the Q6_K fetch
# change); delete it before committing.
# PART=1 (about 450 s on a fresh machine; 190 s on one whose kernels are compiled):
#   the whole GPU suite under session 30's defaults (gemv_mma2's float16-pair decode, the cascade's own keys on at
#   most 4 blocks a pair). Session 30's call 5 ran two thirds of it before its limit, with no failure.
# PART=2 (about 560 s): issue 38's table on main's head, both engines in the same call, the same file:
#   - side: ISL/OSL 128 at c=1 and c=32 and the 8,000-token TTFT, ours then llama.cpp's;
#   - agent: the 8k TTFT, the cached 8,000-token prefix, the c=8 shared-prefix rows (ours);
#   - the 32,000-token TTFT (ours; last measured in session 18, 3.08 s, before the tensor-core prefill's gains);
#   - curve: c = 1 / 32 / 64 / 128 / 256 (ours).
# PART=3 (about 300 s): what to tune next:
#   - gemv_mma2's column splits at q, q/k/v stacked and gate+up, 8 and 16 tokens (the v2_splits<S>_us columns:
#     session 30 found 2 splits beat the picked 4 on the 8B's q, 13.5 against 14.8 us);
#   - decode attention of one sequence at 64 / 330 / 1,000 / 4,000 keys on 1-64 blocks (the c=1 row's attention,
#     ~10 us a layer in session 27's profile; a decode graph plans its blocks from the model's whole context);
#   - Q6_K's unit fetch with its two scale bytes alone (session 30: gemv_mma2's Q6_K loop 464 -> 398 instructions,
#     98 registers from 103), gemv_mma2 on the 8B's down against .ab-base, and down and the output head (Q6_K)
#     against cuBLAS on their float16 copies, where Q6_K goes today (PADDOCK_GEMV_MMA_COPY_ has Q4_K only): with the
#     float16-pair decode too, does gemv_mma2 now win anywhere on Q6_K?
#   - the decode step at 1 and 8 sequences (contexts 128-336), .ab-base against the tree, and the tree with
#     PADDOCK_DECODE_SHORT_CONTEXT=512 (session 30's opt-in short-context decode graphs: attention planned for the
#     bound, not the whole 4,096); then the c=1 step's per-kernel profile (8-layer cut). If the short graphs win, the GPU tests of decode graphs
#     (tests/engine/cuda/test_cuda_engine.py, test_cuda_async_decode.py) under the switch come before a default.
O=$OUT; export BUDGET=570 PYTHONPATH=$PWD:$HOME/site
W=/tmp/s31; rm -rf $W; mkdir -p $W/tests $W/side $W/sv $W/prof
case ${PART:-1} in
1)
  OUT=$W/tests STAGES=tests TEST_PROCS=4 TEST_S=520 bash bench/gpu_run.sh 2>&1 | grep -E '^== share|passed|failed|FAILED|Error' | head -30
  cp $W/tests/tests.log $O/tests.log
  ;;
2)
  OUT=$W/side STAGES="llamabuild side" MODELS=qwen3-8b:q4_k_m SIDE_MODELS=qwen3-8b:q4_k_m KEEP_FILES=1 LLAMA_WAIT=60 BUDGET=250 \
    bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-300
  cp $W/side/side.jsonl $W/side/side.log $O/ 2>/dev/null
  OUT=$W/sv STAGES=agent BUDGET=$((400 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -6
  cp $W/sv/agent.jsonl $O/ 2>/dev/null
  (
    source <(sed -n '/^serve_paddock() {/,/^}/p' bench/gpu_run.sh)
    serve_paddock /tmp/qwen3-8b-q4_k_m.gguf 40960 8 /tmp/serve-32k.log 120
    timeout 100 python3 -m app.cli bench --url http://127.0.0.1:11660 --json --concurrency 1 --requests 2 --warmup 1 \
      --input-tokens 32000 --output-tokens 16 | sed 's/^{/{"workload": "ttft32k", /' | tee $O/ttft32k.jsonl | cut -c1-300
    kill $server; wait $server 2> /dev/null
  )
  OUT=$W/sv STAGES=curve MODELS=qwen3-8b:q4_k_m BUDGET=$((565 - SECONDS)) bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-200
  cp $W/sv/curve.jsonl $O/ 2>/dev/null
  ;;
3)
  timeout 90 python3 bench/micro/gemv_mma_times.py --models 8b 27b --methods v2h --products q qkv gate+up \
    --tokens 8 16 > $O/gemv-splits.jsonl 2>&1
  grep -o '"model": "[^"]*", "product": "[^"]*"\|"tokens": [0-9]*\|"v2_shape": "[^"]*"\|"v2_splits[0-9]_us": [0-9.]*\|"v2h_us": [0-9.]*' \
    $O/gemv-splits.jsonl | paste -sd' ' | sed 's/ "model"/\n"model"/g' | cut -c1-300
  timeout 90 python3 bench/micro/attention_decode_times.py > $O/dattn-c1.jsonl 2>&1; cut -c1-300 $O/dattn-c1.jsonl
  PYTHONPATH=$PWD/.ab-base:$HOME/site timeout 60 python3 .ab-base/bench/micro/gemv_mma_times.py --models 8b \
    --methods v2h --products down --tokens 8 16 > $O/gemv-q6k-base.jsonl 2>&1
  timeout 80 python3 bench/micro/gemv_mma_times.py --models 8b --methods v2h cublas16 --products down lm_head \
    --tokens 8 16 > $O/gemv-q6k.jsonl 2>&1
  grep -ho '"product": "[^"]*"\|"tokens": [0-9]*\|"v2h_us": [0-9.]*\|"cublas16_us": [0-9.]*' $O/gemv-q6k-base.jsonl \
    $O/gemv-q6k.jsonl | paste -sd' '
  OUT=$W/prof STAGES="ab profile" MODELS=qwen3-8b:q4_k_m PROFILE_MODELS=qwen3-8b:8 PROFILE_BATCHES=1 \
    AB_BASE=.ab-base AB="PADDOCK_PDL=1 PADDOCK_PDL=1+PADDOCK_DECODE_SHORT_CONTEXT=512" AB_BATCH="1 8" \
    BUDGET=$((290 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -12
  cp $W/prof/ab.log $O/ 2>/dev/null; cp $W/prof/profile*.jsonl $O/ 2>/dev/null
  ;;
4)
  OUT=$W/sv STAGES=curve MODELS=qwen3-8b:q8_0 CURVE_CS="1 32" BUDGET=200 bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-200
  cp $W/sv/curve.jsonl $O/curve-q8.jsonl 2>/dev/null
  OUT=$W/prof STAGES=cascade MODELS=qwen3-8b:q4_k_m CASCADE_DEFINES="" CASCADE_CASES=c8 CASCADE_SETTINGS=PADDOCK_PDL=1 \
    CASCADE_KV="f16 fp8" BUDGET=$((330 - SECONDS)) bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-200
  cp $W/prof/cascade.log $O/c8-kv.log 2>/dev/null
  OUT=$W/side STAGES=agent SERVE_ARGS="--kv-dtype fp8" BUDGET=$((560 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -6
  cp $W/side/agent.jsonl $O/agent-fp8.jsonl 2>/dev/null
  ;;
esac
echo "total $SECONDS s"
