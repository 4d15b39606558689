# session 28, call B: gemv_mma2 fetch/unpack + cluster splits (tests, micro, step A/B), the cached-prefix TTFT
# against 4aafe64 (.ab-old), the cascade step per kernel; ~390 s
O=$OUT; export BUDGET=400
OUT=$O/tests STAGES=tests TEST_PROCS=4 TEST_S=110 TESTS="tests/engine/cuda/test_cuda_gemv_mma.py tests/engine/cuda/test_cuda_fused.py tests/engine/cuda/test_linear_routing.py" bash bench/gpu_run.sh 2>&1 | grep -E 'passed|failed|FAILED|Error' | head -20
export PYTHONPATH=$PWD:$HOME/site PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
mkdir -p $O/micro; timeout 80 python3 bench/micro/gemv_mma_times.py --models 8b --products gate+up down --tokens 8 32 --methods v2 cublas16 2>&1 | tee $O/micro/gemv-mma.jsonl | cut -c1-330
export PADDOCK_KERNEL_DEFINES=DEC_PVEC=1
OUT=$O/ab STAGES=ab MODELS=qwen3-8b:q4_k_m AB_BASE=.ab-base AB="PADDOCK_GEMV_MMA_SPLITS=2 PADDOCK_GEMV_MMA_SPLITS=8" AB_BATCH="8 32 128" BUDGET=$((330-SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -12
unset PADDOCK_KERNEL_DEFINES
f=/tmp/qwen3-8b-q4_k_m.gguf
for tree in .ab-old . .ab-old .; do
  (( SECONDS < 420 )) || break
  echo "== hit $tree" | tee -a $O/hit.log
  timeout 60 python3 $tree/bench/suite/agent_engine.py $f --cases hit 2>&1 | grep '^{' | tee -a $O/hit.log | cut -c1-300
done
if (( SECONDS < 440 )); then  # the cascade step at c=8 over an 8,000-token prefix, per kernel
  p=/tmp/prof-qwen3-8b-8.gguf; [[ -e $p ]] || python3 bench/make_random_gguf.py --shape qwen3-8b --layers 8 --out $p > /dev/null
  timeout 100 python3 bench/micro/decode_kernel_times.py $p --batch 8 --context 8000 --shared --out $O 2>&1 | tail -1 | tee $O/cascade-kernels.jsonl | cut -c1-1800
fi
echo "total $SECONDS s"
