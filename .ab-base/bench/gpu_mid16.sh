#!/usr/bin/env bash
# Session 16's mid-session GPU call (not kept): the new MoE kernels' timings, their GPU tests, the hybrid serve
# trace, and the decode profiles again.
set -u
OUT=${OUT:-/tmp/mid}
python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/site" .whl/*.whl || exit 1
export PYTHONPATH=$PWD:$HOME/site PYTHONUNBUFFERED=1 PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 bench/micro/moe_times.py 2>&1 | tee "$OUT/moe.jsonl" | cut -c1-300
timeout 120 python3 bench/micro/moe_prefill_times.py 2>&1 | tee -a "$OUT/moe.jsonl" | cut -c1-300
echo "== at $SECONDS s: tests"
timeout 210 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --durations=8 tests/engine/cuda/test_cuda_moe.py \
  tests/engine/cuda/test_cuda_moe_model.py tests/engine/cuda/test_cuda_moe_mma.py tests/engine/cuda/test_cuda_hybrid_qwen.py \
  tests/engine/cuda/test_cuda_hybrid_mamba.py tests/engine/cuda/test_cuda_families2.py tests/engine/cuda/test_cuda_verify_graphs.py \
  tests/engine/cuda/test_cuda_muse_glimmer_image.py tests/engine/cuda/test_cuda_fit.py 2>&1 | tee "$OUT/tests.log" | tail -15
echo "== at $SECONDS s: traces"
for shape in qwen35-27b qwen35-35b-a3b; do
  python3 bench/make_random_hybrid_gguf.py --shape $shape --layers 8 --out /tmp/$shape-8.gguf > /dev/null
done
timeout 110 python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-27b-8.gguf --concurrency 32 --requests 64 > "$OUT/trace27.txt" 2>&1
tail -25 "$OUT/trace27.txt"
echo "== at $SECONDS s: profiles"
for f in qwen35-35b-a3b qwen35-27b; do
  for b in 1 32; do
    (( SECONDS < 500 )) || break
    timeout 80 python3 bench/micro/decode_kernel_times.py /tmp/$f-8.gguf --batch $b 2>&1 | tail -1 | tee -a "$OUT/profile.jsonl" | cut -c1-600
  done
done
(( SECONDS < 470 )) && timeout 100 python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-35b-a3b-8.gguf --concurrency 32 --requests 64 > "$OUT/trace35.txt" 2>&1
echo "run took $SECONDS s"
