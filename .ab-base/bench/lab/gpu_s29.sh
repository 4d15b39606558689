# The next lease's first call (written in session 28): what session 28 changed but could not measure.
# Before it: `mkdir .ab-base && git archive 1f303f5 app bench | tar -x -C .ab-base` (delete it before committing);
# call with carry [".whl"]. About 520 s on an H100.
O=$OUT; export BUDGET=540
# 1. GPU tests of the changed kernels: one process a file (an empty share would run the whole tree)
OUT=$O/tests STAGES=tests TEST_PROCS=4 TEST_S=200 TESTS="tests/engine/cuda/test_cuda_cascade.py tests/engine/cuda/test_cuda_gemv_mma.py tests/engine/cuda/test_cuda_prefill_graphs.py tests/engine/cuda/test_cuda_fused.py" \
  bash bench/gpu_run.sh 2>&1 | grep -E '^== share|passed|failed|FAILED|Error' | head -20
# 2. the cascade's launches alone (the rewritten merge; the shared part at 8/16/32 splits), its step per kernel, and c8
# (session 29: the shared part's key-split build, PF_KEY_WARPS, beside the default build in every row: `_kw` in the parts,
# PADDOCK_CASCADE_KEY_WARPS=0 / 32 in the c8 case)
PADDOCK_CASCADE_KEY_WARPS=32 OUT=$O/cascade STAGES=cascade MODELS=qwen3-8b:q4_k_m CASCADE_PARTS=1 CASCADE_NCU=1 CASCADE_DEFINES="" \
  CASCADE_SETTINGS="PADDOCK_CASCADE_KEY_WARPS=0 PADDOCK_CASCADE_KEY_WARPS=32" CASCADE_CASES=c8 \
  BUDGET=$((400 - SECONDS)) bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-900
PYTHONPATH=$PWD:$HOME/site PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels timeout 60 \
  python3 bench/micro/attention_decode_times.py --cascade --seqs 16 2>&1 | tee $O/cascade16.jsonl | cut -c1-900
# 2b. prefill attention alone at the last 2,048-token chunk of 2k/8k/32k prompts, as built and with the next K and V
# issued before a tile's products (PF_EARLY_KV, an A/B build: 84 bytes of spills in the wide head-dim-128 tile); then
# Nsight's sections of one 8k call (stall reasons: attention is ~40 % of the 8k TTFT at ~150 TFLOP/s)
(( SECONDS < 330 )) && OUT=$O/pattn STAGES=pattn PATTN_DEFINES="none PF_EARLY_KV=1" PATTN_NCU=1 \
  BUDGET=$((440 - SECONDS)) bash bench/gpu_run.sh 2>&1 | grep -E '^\{|Duration|Throughput|Occupancy|Stall|Ipc' | cut -c1-400
# 3. the engine step under the new split rule (gate+up unsplit at 8-16 tokens, q/o in clusters of 4) against 1f303f5
export PADDOCK_KERNEL_DEFINES=DEC_PVEC=1  # the base's build as the tree's default
OUT=$O/ab STAGES=ab MODELS=qwen3-8b:q4_k_m AB_BASE=.ab-base AB="PADDOCK_GEMV_MMA_SPLITS=8 PADDOCK_GEMV_MMA_SPLITS=8" \
  AB_BATCH="8 16 32" BUDGET=$((500 - SECONDS)) bash bench/gpu_run.sh 2>&1 | tail -9
unset PADDOCK_KERNEL_DEFINES
# 4. the split rule on the 27B shapes, then gemv_mma2 with a register cap of 4 blocks a multiprocessor (GM_MIN_BLOCKS=4:
# 128 registers at 32 tokens with 60 bytes of spills, 64 at 8 with 4; ptxas, sm_90) against the build as it is
export PYTHONPATH=$PWD:$HOME/site PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
for defines in "" GM_MIN_BLOCKS=4; do
  (( SECONDS < 480 )) || break
  echo "== PADDOCK_KERNEL_DEFINES=$defines" | tee -a $O/gemv-mma.jsonl
  PADDOCK_KERNEL_DEFINES=$defines timeout 60 python3 bench/micro/gemv_mma_times.py --models 8b 27b --methods v2 cublas16 \
    --tokens 8 16 32 2>&1 | tee -a $O/gemv-mma.jsonl | cut -c1-300
done
# 5. moe_mma with its next stage's weights fetched apart from their scale arithmetic (session 28, not yet measured):
# the MoE kernels' rows (the moe stage), if time is left; compare with bench/results/moe-kernels-gpu-2026-12-06.jsonl
(( SECONDS < 500 )) && OUT=$O/moe STAGES=moe BUDGET=$((580 - SECONDS)) bash bench/gpu_run.sh 2>&1 | grep '^{' | cut -c1-300
echo "total $SECONDS s"
