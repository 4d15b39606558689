# Session 30's calls (PART=1 and 2 written in session 29, and run in session 30: bench/results/gpu-s30-2026-12-07.md;
# PART=3 written after them): what session 29 changed but could not measure. Carry [".whl"].
# Before them: `mkdir .ab-base && git archive 948b59d app bench | tar -x -C .ab-base` (delete it before committing).
# run returns at most 8 files: each stage works in /tmp and copies one or two files into $OUT as it ends, so what
# finished still comes back if the time runs out.
# PART=1 (about 420 s on an H100):
# 1. The GPU tests of session 29's changes: the cascade (both builds of its shared part, the own keys on 2 blocks a
#    pair, its merge in float16), float16 x into gemv_mma2 (its pre-pass skipped), the norm in float16 before a fused
#    product on gemv_mma2, the gated result and the attention output in float16 before one.
# 2. gemv_mma2 alone with GM_XSTAGE=0 (x staged as before session 30: its sources worked out from scratch each
#    super-step) against as built, twice; each on float32 x (its pre-pass timed) and on float16 x (v2h: as the float16
#    hand-offs give it). (Session 30 ran GM_AHEAD=2 here too: it lost everywhere, and the build is gone.)
# 3. The engine's decode step at 8, 16 and 32 sequences against 948b59d (before the float16 hand-offs into
#    gemv_mma2: up to three pre-pass launches a layer fewer).
# PART=2 (about 380 s):
# 4. The cascade's launches alone (its own keys on 1/2/4 blocks a pair against the plain plan's), and the c=8
#    shared-prefix row with PADDOCK_CASCADE_OWN_BLOCKS=0 and 2 (the cascade's output now in float16 before o).
# 5. Prefill attention alone at the last 2,048-token chunk of 2k/8k/32k prompts: as built (the block size built
#    in since session 29), with it at run time again (PF_BS=0), and with PF_EARLY_KV=1; then Nsight's sections of
#    one 8k launch (stall reasons: attention is ~40 % of the 8k TTFT at ~150 TFLOP/s).
# PART=3 (written after the first two ran, about 560 s): the forced-splits attention tests (a forced count past the
# merge's 32 now runs at 32); gemv_mma2's float16-pair decode (GM_HDEC=1, an A/B build): its GPU tests, the products
# alone and the engine step at 8 and 16 sequences; the c=8 shared-prefix row under PADDOCK_CASCADE_OWN_BLOCKS=4 and 0;
# then the served agent rows and the c=1/32/128 curve of the 8B on main's head, as far as the time goes.
# Then the whole GPU suite: `OUT=/tmp/t STAGES=tests TEST_PROCS=4 TEST_S=480 bash bench/gpu_run.sh; cp
# /tmp/t/tests.log $OUT/` (about 250 s; it last ran before session 28's gemv_mma2 changes).
O=$OUT; export BUDGET=570
W=/tmp/s30; rm -rf $W; mkdir -p $W/tests $W/ab $W/c8 $W/pattn $W/sv
if [[ ${PART:-1} == 1 ]]; then
OUT=$W/tests STAGES=tests TEST_PROCS=4 TEST_S=150 \
  TESTS="tests/engine/cuda/test_cuda_cascade.py tests/engine/cuda/test_cuda_gemv_mma.py tests/engine/cuda/test_cuda_fused.py tests/engine/cuda/test_cuda_attention.py" \
  bash bench/gpu_run.sh 2>&1 | grep -E '^== share|passed|failed|FAILED|Error' | head -30
cp $W/tests/tests.log $O/tests.log
(
  export PYTHONPATH=$PWD:$HOME/site PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
  for defines in "" GM_XSTAGE=0 "" GM_XSTAGE=0; do
    echo "== PADDOCK_KERNEL_DEFINES=$defines"
    PADDOCK_KERNEL_DEFINES=$defines timeout 40 python3 bench/micro/gemv_mma_times.py --models 8b 27b --methods v2 v2h \
      --products q gate+up down --tokens 8 16
  done > $O/gemv-ahead.jsonl 2>&1
  grep -o '^==.*\|"model": "[^"]*", "product": "[^"]*"\|"tokens": [0-9]*\|"v2h\?_us": [0-9.]*' $O/gemv-ahead.jsonl | paste -sd' ' \
    | sed 's/ == /\n== /g' | cut -c1-600
)
OUT=$W/ab STAGES=ab MODELS=qwen3-8b:q4_k_m AB_BASE=.ab-base AB="PADDOCK_PDL=1 PADDOCK_PDL=1" AB_BATCH="8 16 32" \
  BUDGET=$((330 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -6
cp $W/ab/ab.log $O/ab.log
elif [[ $PART == 3 ]]; then
OUT=$W/tests STAGES=tests TESTS=tests/engine/cuda/test_cuda_attention.py PYTEST_ARGS="-k forced_splits" TEST_S=120 \
  bash bench/gpu_run.sh 2>&1 | grep -E 'passed|failed|FAILED|Error' | head
cp $W/tests/tests.log $O/tests-splits.log
OUT=$W/tests STAGES=tests TESTS=tests/engine/cuda/test_cuda_gemv_mma.py PADDOCK_KERNEL_DEFINES=GM_HDEC=1 TEST_S=120 \
  bash bench/gpu_run.sh 2>&1 | grep -E 'passed|failed|FAILED|Error' | head
cp $W/tests/tests.log $O/tests-hdec.log
(
  export PYTHONPATH=$PWD:$HOME/site PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
  for defines in "" GM_HDEC=1 "" GM_HDEC=1; do
    echo "== PADDOCK_KERNEL_DEFINES=$defines"
    PADDOCK_KERNEL_DEFINES=$defines timeout 40 python3 bench/micro/gemv_mma_times.py --models 8b --methods v2h \
      --products q gate+up --tokens 8 16
  done > $O/gemv-hdec.jsonl 2>&1
  grep -o '^==.*\|"product": "[^"]*"\|"tokens": [0-9]*\|"v2h_us": [0-9.]*' $O/gemv-hdec.jsonl | paste -sd' ' \
    | sed 's/ == /\n== /g' | cut -c1-400
)
OUT=$W/ab STAGES=ab MODELS=qwen3-8b:q4_k_m AB="PADDOCK_PDL=1 PADDOCK_PDL=1+PADDOCK_KERNEL_DEFINES=GM_HDEC=1 PADDOCK_PDL=1" \
  AB_BATCH="8 16" BUDGET=$((300 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -5
cp $W/ab/ab.log $O/ab-hdec.log
OUT=$W/c8 STAGES=cascade MODELS=qwen3-8b:q4_k_m CASCADE_DEFINES="" CASCADE_CASES=c8 BUDGET=$((480 - SECONDS)) \
  CASCADE_SETTINGS="PADDOCK_CASCADE_OWN_BLOCKS=4 PADDOCK_CASCADE_OWN_BLOCKS=0" \
  bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-200
cp $W/c8/cascade.log $O/c8-own.log
OUT=$W/sv STAGES="agent curve" MODELS=qwen3-8b:q4_k_m CURVE_CS="1 32 128" BUDGET=$((560 - SECONDS)) \
  bash bench/gpu_run.sh 2>&1 | tail -12
cp $W/sv/agent.jsonl $W/sv/curve.jsonl $O/ 2>/dev/null
else
OUT=$W/c8 STAGES=cascade MODELS=qwen3-8b:q4_k_m CASCADE_PARTS=1 CASCADE_DEFINES="" CASCADE_CASES=c8 \
  CASCADE_SETTINGS="PADDOCK_CASCADE_OWN_BLOCKS=0 PADDOCK_CASCADE_OWN_BLOCKS=2" \
  BUDGET=$((250 - SECONDS)) bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-600
cp $W/c8/cascade.log $O/c8.log; cp $W/c8/cascade-parts.jsonl $O/
OUT=$W/pattn STAGES=pattn PATTN_DEFINES="none PF_BS=0 PF_EARLY_KV=1" PATTN_NCU=1 BUDGET=$((390 - SECONDS)) \
  bash bench/gpu_run.sh 2>&1 | grep -E '^\{|Duration|Throughput|Occupancy|Stall|Ipc|Registers' | cut -c1-300
cp $W/pattn/pattn.jsonl $W/pattn/pattn-ncu.txt $O/ 2>/dev/null
fi
echo "total $SECONDS s"
