#!/usr/bin/env bash
# llama.cpp beside us on the GPU machine, from the same source our comparisons name (the llama.cpp
# vendored in the llama-cpp-python 0.3.36 sdist), built there: the machine has nvcc, CMake, ninja and
# cuBLAS (CUDA's own, or the nvidia-cublas wheel torch brings) but no network.
#
#   bench/llama_cpp.sh pack                 # here, once: the sdist's sources -> .llama/src.tar.xz (~7 MB,
#                                           # git-ignored; carry [".llama"] in the device call)
#   bench/llama_cpp.sh build                # there: llama-server for sm_90 into /tmp/llama-build (~10 min on
#                                           # 16 cores; kept while the machine stays warm), or at once from
#                                           # .llama/llama-server.xz where `prebuilt` made one
#   bench/llama_cpp.sh prebuilt             # here, where nvcc 13 and cuBLAS's headers and libraries are: the same
#                                           # build, statically linked but for CUDA's runtime libraries, into
#                                           # .llama/llama-server.xz (a device call then needs no build time)
#   bench/llama_cpp.sh serve FILE NP CTX    # there: llama-server on port 11661, FILE fully on the GPU, NP
#                                           # parallel slots sharing CTX tokens (one unified KV cache, so a
#                                           # single 8,000-token prompt fits too); returns once healthy
# The build logs to /tmp/llama-{cmake,build}.log (a build started in the background outlives the call).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${LLAMA_BUILD:-/tmp/llama-build}
PORT=${LLAMA_PORT:-11661}

pack() {
  local work; work=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$work"
  tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
  local src=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
  mkdir -p .llama
  # Only what a CUDA build of the server reads: other backends, docs and the web UI's tests stay behind.
  tar -C "$src" --exclude='*.md' --exclude='ggml/src/ggml-'{vulkan,sycl,metal,opencl,cann,musa,hip,webgpu} \
    -cJf .llama/src.tar.xz CMakeLists.txt cmake ggml src include common tools vendor licenses LICENSE app scripts
  rm -rf "$work"
  ls -la .llama/src.tar.xz
}

# cuBLAS where CMake's FindCUDAToolkit looks (the toolkit's own folders), linked from the pip wheel
# when the toolkit on the machine came without it.
link_cublas() {
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  compgen -G "$cuda/lib64/libcublas.so*" > /dev/null && return 0
  local wheel
  wheel=$(python3 -c "import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))" 2>/dev/null) \
    || wheel=$(dirname "$(find / -name 'libcublas.so.1*' -path '*nvidia*' 2>/dev/null | head -1)")/..
  [[ -d $wheel ]] || { echo "no cuBLAS on this machine" >&2; return 1; }
  local lib; lib=$(dirname "$(find "$wheel" -name 'libcublas.so.1*' | head -1)")
  for f in "$lib"/libcublas*.so*; do
    ln -sf "$f" "$cuda/lib64/"
    local base=${f##*/}; ln -sf "$f" "$cuda/lib64/${base%%.so*}.so"
  done
  ln -sf "$(find "$wheel" -name cublas_v2.h -printf '%h' -quit)"/cublas*.h "$cuda/include/" 2>/dev/null || true
  echo "cuBLAS linked from $lib"
}

# cmake + ninja of llama-server from the packed sources into $1, with extra CMake flags after it
compile() {
  local build=$1 src=/tmp/llama-src
  shift
  rm -rf "$src" && mkdir -p "$src" && tar xJf .llama/src.tar.xz -C "$src"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "$@" \
    > /tmp/llama-cmake.log 2>&1 || { tail -30 /tmp/llama-cmake.log; return 1; }
  local started=$SECONDS
  nice -n 10 ninja -C "$build" -j "$(nproc)" llama-server > /tmp/llama-build.log 2>&1 \
    || { tail -30 /tmp/llama-build.log; return 1; }
  echo "llama-server built in $((SECONDS - started)) s"
}

# A machine with nvcc but no GPU driver: a stub libcuda.so exporting the driver calls ggml-cuda makes (its VMM
# pool), for the link only (the real libcuda.so.1 is the GPU machine's), and cuBLAS from its pip wheel
# (`pip download nvidia-cublas==13.0.*`, unzipped into CUBLAS_WHEEL) where the toolkit has none.
host_cuda_libs() {
  local cuda=${CUDA_HOME:-/usr/local/cuda} stub=/tmp/libcuda-stub.c
  if ! compgen -G "$cuda/lib64/stubs/libcuda.so" > /dev/null; then
    for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate \
      cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
      echo "int $f(void) { return 0; }"
    done > "$stub"
    mkdir -p "$cuda/lib64/stubs" && gcc -shared -fPIC -o "$cuda/lib64/stubs/libcuda.so" "$stub" -Wl,-soname,libcuda.so.1
  fi
  if ! compgen -G "$cuda/lib64/libcublas.so" > /dev/null && [[ -n ${CUBLAS_WHEEL:-} ]]; then
    local lib=$CUBLAS_WHEEL/nvidia/cu13
    for f in "$lib"/lib/libcublas*.so.13; do
      ln -sf "$f" "$cuda/lib64/"
      local base=${f##*/}; ln -sf "$f" "$cuda/lib64/${base%%.so*}.so"
    done
    ln -sf "$lib"/include/cublas*.h "$cuda/include/"
  fi
}

prebuilt() {
  local build=${LLAMA_PREBUILD:-/tmp/llama-prebuild}
  host_cuda_libs
  [[ -e .llama/src.tar.xz ]] || pack
  compile "$build" -DBUILD_SHARED_LIBS=OFF
  strip "$build/bin/llama-server"
  xz -T0 -6 -c "$build/bin/llama-server" > .llama/llama-server.xz
  ls -la .llama/llama-server.xz
}

# The CUDA runtime libraries a prebuilt server links (cuBLAS from torch's nvidia wheel where the toolkit has none)
runtime_libs() {
  local found
  found=$(compgen -G "/usr/local/cuda/lib64/libcublas.so.13" \
    || python3 -c "import nvidia, glob; print(*glob.glob(nvidia.__path__[0] + '/**/libcublas.so.13', recursive=True))" \
    2> /dev/null | head -1)
  [[ -n $found ]] || found=$(find / -xdev -name 'libcublas.so.13' 2> /dev/null | head -1)
  export LD_LIBRARY_PATH=$(dirname "${found:-/usr/local/cuda/lib64/x}"):/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

build() {
  [[ -x $BUILD/bin/llama-server ]] && { echo "llama-server already built"; return 0; }
  if [[ -e .llama/llama-server.xz ]]; then
    mkdir -p "$BUILD/bin" && xz -dc .llama/llama-server.xz > "$BUILD/bin/llama-server" && chmod +x "$BUILD/bin/llama-server"
    runtime_libs
    "$BUILD/bin/llama-server" --version 2>&1 | tail -2
    echo "llama-server unpacked from .llama/llama-server.xz"
    return 0
  fi
  link_cublas
  compile "$BUILD"
}

serve() {
  local file=$1 np=$2 ctx=$3
  runtime_libs
  "$BUILD/bin/llama-server" -m "$file" -ngl 999 -np "$np" -c "$ctx" --kv-unified --port "$PORT" --no-webui \
    > "${LLAMA_LOGS:-/tmp}/llama-server-$(basename "$file" .gguf).log" 2>&1 &
  echo $! > /tmp/llama-server.pid
  for _ in $(seq 1 120); do
    curl -sf "localhost:$PORT/health" > /dev/null && return 0
    kill -0 "$(cat /tmp/llama-server.pid)" 2> /dev/null || break
    sleep 1
  done
  echo "llama-server did not come up" >&2
  tail -20 "${LLAMA_LOGS:-/tmp}/llama-server-$(basename "$file" .gguf).log" >&2
  return 1
}

case ${1:-} in
  pack) pack ;;
  build) build ;;
  prebuilt) prebuilt ;;
  serve) shift; serve "$@" ;;
  *) echo "usage: $0 pack | prebuilt | build | serve FILE NP CTX" >&2; exit 2 ;;
esac
