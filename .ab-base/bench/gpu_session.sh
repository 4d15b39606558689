#!/usr/bin/env bash
# One scripted GPU call for a session that changed the engine's structure (2026-12-06): the GPU test
# suite on this tree, then the short engine speed rows (decode steps/s at batch 1 and 32, host time per
# step) on a Qwen3-8B-shaped Q4_K_M file for the tree before the change (BASE, a carried `git archive` of
# its app/ and bench/) and for this tree, alternating, so both figures come from the same card and call.
#
#   git archive <base-commit> app bench pyproject.toml | tar -x -C .base   # here, once
#   bench/fetch_wheels.sh                                                   # here, once
#   device run: carry [".whl", ".base"], command `OUT=$OUT bash bench/gpu_session.sh`
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/site" .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PADDOCK_KERNEL_CACHE=/tmp/paddock-kernels
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
PYTHONPATH=$PWD:$HOME/site timeout ${TEST_S:-300} python3 -m pytest -q -m gpu tests/engine/cuda -p no:cacheprovider -rf \
  2>&1 | tee "$OUT/tests.log" | tail -15
PYTHONPATH=$PWD:$HOME/site python3 bench/make_random_gguf.py --shape qwen3-8b --mix q4_k_m --out /tmp/qwen3-8b.gguf
for round in 1 2; do
  for tree in base this; do
    root=$PWD; [[ $tree == base ]] && root=$PWD/.base
    echo "== $tree round $round" | tee -a "$OUT/speed.log"
    (cd "$root" && PYTHONPATH=$root:$HOME/site timeout 150 python3 bench/suite/gpu_engine.py speed /tmp/qwen3-8b.gguf \
      --batch 1 32 2>&1 | tee -a "$OUT/speed.log" | grep '^{')
  done
done
echo "run took $SECONDS s"
