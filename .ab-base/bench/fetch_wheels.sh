#!/usr/bin/env bash
# The wheels the GPU machine lacks, for its Python 3.12 on x86-64, into the git-ignored .whl/ of
# this repo (gpu_run.sh installs them there). Run here, where the package index is reachable:
#
#   bench/fetch_wheels.sh              # what gpu_run.sh needs: the server stack and gguf
#   bench/fetch_wheels.sh PACKAGE ...  # other packages (their dependencies come along)
#
# Then call the device tool with carry [".whl"] and the command `bash bench/gpu_run.sh`.
# PIP picks the pip to download with (default: python3 -m pip).
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=("$@")
[[ ${#PACKAGES[@]} -gt 0 ]] || PACKAGES=(gguf fastapi uvicorn httptools uvloop pydantic python-multipart mcp llguidance)  # mcp: the server's middleware imports it
read -ra PIP <<< "${PIP:-python3 -m pip}"
mkdir -p .whl
"${PIP[@]}" download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl "${PACKAGES[@]}"
# The GPU machine's image has these (read 2026-11): its own versions stay, fewer bytes travel.
ON_IMAGE=(numpy pyyaml requests urllib3 certifi idna charset_normalizer tqdm click h11 anyio
          typing_extensions jinja2 markupsafe safetensors tokenizers httpx httpcore huggingface_hub
          filelock fsspec packaging torch cupy_cuda13x)
for name in "${ON_IMAGE[@]}"; do
  rm -f .whl/"$name"-[0-9]*.whl
done
ls .whl
du -sh .whl  # a call carries 64 MiB in all
