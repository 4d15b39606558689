# Session 29's second call: what the first call's output lost (run returns at most 8 files: everything goes into one
# archive now). About 300 s on an H100; carry [".whl"].
# 1. The GPU tests of the cascade (both builds of its shared part: the key-split one is the default since this session)
#    and of prefill attention.
# 2. Prefill attention alone at the last 2,048-token chunk of 2k/8k/32k prompts, as built and with PF_EARLY_KV=1,
#    then Nsight's sections of one 8k launch: what holds the tensor-core kernel at ~150 TFLOP/s.
O=$OUT; W=/tmp/s29b; rm -rf $W; mkdir -p $W
OUT=$W/tests STAGES=tests TEST_PROCS=2 TEST_S=150 BUDGET=170 \
  TESTS="tests/engine/cuda/test_cuda_cascade.py tests/engine/cuda/test_cuda_attention.py" \
  bash bench/gpu_run.sh 2>&1 | grep -E '^== share|passed|failed|FAILED|Error' | head -20
OUT=$W/pattn STAGES=pattn PATTN_DEFINES="none PF_EARLY_KV=1" PATTN_NCU=1 BUDGET=$((310 - SECONDS)) \
  bash bench/gpu_run.sh 2>&1 | grep -E '^\{|Duration|Throughput|Occupancy|Stall|Ipc|Registers' | cut -c1-300
tar -czf $O/s29b.tgz -C $W .
echo "total $SECONDS s"
