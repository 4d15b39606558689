python3 -m pip install -q --no-index --no-deps --no-compile --target $HOME/site .whl/*.whl && export PYTHONPATH=$PWD:$HOME/site PYTHONUNBUFFERED=1
for s in qwen3-0.6b qwen3-4b qwen3-8b; do python3 bench/make_random_gguf.py --shape $s --out /tmp/$s.gguf; done
timeout 400 python3 bench/lab/fit_calibration.py /tmp/qwen3-0.6b.gguf /tmp/qwen3-4b.gguf /tmp/qwen3-8b.gguf 2>&1 | tee $OUT/fit.log
