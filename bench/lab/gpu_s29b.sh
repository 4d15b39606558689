# Session 29's second call. run returns at most 8 files: each stage writes one file straight into $OUT (what is
# there when the time runs out still comes back). About 240 s on an H100; carry [".whl"]. Before it:
# `mkdir .ab-base && git archive 948b59d app bench | tar -x -C .ab-base` (delete it before committing).
# 1. The GPU tests of this session's changes: the cascade (both builds of its shared part), float16 x into
#    gemv_mma2 (the norm and attention write it; the pre-pass is skipped), the norm in float16 before a fused
#    product on gemv_mma2, the gated result and the attention output (a cascade's merge too) in float16 before one.
# 2. gemv_mma2 alone with GM_AHEAD=2 (two super-steps of weights in flight) against as built.
# 3. The engine's decode step at 8 and 16 sequences against 948b59d (before the float16 hand-offs into gemv_mma2:
#    three pre-pass launches a layer fewer), as far as the time goes.
O=$OUT; export BUDGET=240
T=/tmp/s29b-tests; mkdir -p $T
OUT=$T STAGES=tests TEST_PROCS=4 TEST_S=120 \
  TESTS="tests/engine/cuda/test_cuda_cascade.py tests/engine/cuda/test_cuda_gemv_mma.py tests/engine/cuda/test_cuda_fused.py tests/engine/cuda/test_cuda_attention.py" \
  bash bench/gpu_run.sh 2>&1 | grep -E '^== share|passed|failed|FAILED|Error' | head -30
cp $T/tests.log $O/tests.log
# gemv_mma2: one super-step of weights in flight, two (GM_AHEAD=2), one again; 8 and 16 tokens
export PYTHONPATH=$PWD:$HOME/site PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
for defines in "" GM_AHEAD=2 ""; do
  echo "== PADDOCK_KERNEL_DEFINES=$defines" >> $O/gemv-ahead.jsonl
  PADDOCK_KERNEL_DEFINES=$defines timeout 40 python3 bench/micro/gemv_mma_times.py --models 8b --methods v2 \
    --tokens 8 16 2>&1 | tee -a $O/gemv-ahead.jsonl | grep -o '"product": "[^"]*", "format[^,]*, "rows[^,]*, "cols[^,]*, "tokens": [0-9]*\|"v2_us": [0-9.]*'
done
OUT=$O STAGES=ab MODELS=qwen3-8b:q4_k_m AB_BASE=.ab-base AB="PADDOCK_PDL=1 PADDOCK_PDL=1" AB_BATCH="8 16" \
  BUDGET=$((235 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -6
echo "total $SECONDS s"
