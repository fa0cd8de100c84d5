#!/usr/bin/env bash
# Build the sample binaries into bin/ (the directory pytest --cudastack-scan checks).
#
#   ./build.sh                 bin/train_ppo against the CUDA 12 runtime (libcudart.so.12)
#   ./build.sh --with-cuda13   also bin/train_tft against libcublas.so.13 + libcudart.so.13 (the incident),
#                              and bin/saxpy with nvcc when nvcc is on PATH
#   ./build.sh --stubs ...     link against stub libraries with the real sonames (CI runners without CUDA)
#
# Where the real libraries come from (override with the variables):
#   CUDA12_LIB  dir with libcudart.so.12  (default: the nvidia-cuda-runtime-cu12 wheel in the active Python)
#   CUDA13_LIB  dir with libcublas.so.13 and libcudart.so.13 (default: the nvidia cu13 wheels, nvidia/cu13/lib)
set -euo pipefail
cd "$(dirname "$0")"

stubs=0
cuda13=0
for arg in "$@"; do
    case "$arg" in
        --stubs) stubs=1 ;;
        --with-cuda13) cuda13=1 ;;
        *) echo "usage: $0 [--stubs] [--with-cuda13]" >&2; exit 2 ;;
    esac
done

CC=${CC:-gcc}
PYTHON=${PYTHON:-python3}
rm -rf bin
mkdir -p bin

stub() {  # stub DIR SONAME SYMBOL...: a shared library with that soname defining the symbols
    local dir=$1 soname=$2; shift 2
    mkdir -p "$dir"
    local src="$dir/$soname.c"
    : > "$src"
    for sym in "$@"; do echo "int $sym(void *p) { (void)p; return 100; }" >> "$src"; done
    "$CC" -shared -fPIC -o "$dir/$soname" -Wl,-soname,"$soname" "$src"
    rm -f "$src"
}

site_lib() {  # site_lib RELDIR: an installed wheel's library directory, if any
    "$PYTHON" - "$1" <<'PY' 2>/dev/null || true
import os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    p = os.path.join(d, sys.argv[1])
    if os.path.isdir(p):
        print(p)
        break
PY
}

if [ "$stubs" = 1 ]; then
    CUDA12_LIB=$PWD/lib/cu12
    CUDA13_LIB=$PWD/lib/cu13
    stub "$CUDA12_LIB" libcudart.so.12 cudaGetDeviceCount
    stub "$CUDA13_LIB" libcudart.so.13 cudaGetDeviceCount
    stub "$CUDA13_LIB" libcublas.so.13 cublasCreate_v2
fi
CUDA12_LIB=${CUDA12_LIB:-$(site_lib nvidia/cuda_runtime/lib)}
if [ -z "$CUDA12_LIB" ] || [ ! -e "$CUDA12_LIB/libcudart.so.12" ]; then
    echo "build.sh: no libcudart.so.12: pip install nvidia-cuda-runtime-cu12, set CUDA12_LIB, or use --stubs" >&2
    exit 1
fi
"$CC" -o bin/train_ppo src/train_ppo.c "$CUDA12_LIB/libcudart.so.12" -Wl,-rpath,"$CUDA12_LIB"
echo "built bin/train_ppo   -> libcudart.so.12 ($CUDA12_LIB)"

if [ "$cuda13" = 1 ]; then
    CUDA13_LIB=${CUDA13_LIB:-$(site_lib nvidia/cu13/lib)}
    if [ -z "$CUDA13_LIB" ] || [ ! -e "$CUDA13_LIB/libcublas.so.13" ]; then
        echo "build.sh: no libcublas.so.13: pip install nvidia-cublas (CUDA 13), set CUDA13_LIB, or use --stubs" >&2
        exit 1
    fi
    "$CC" -o bin/train_tft src/train_tft.c "$CUDA13_LIB/libcublas.so.13" "$CUDA13_LIB/libcudart.so.13" \
        -Wl,-rpath,"$CUDA13_LIB" -Wl,-rpath-link,"$CUDA13_LIB" -Wl,--allow-shlib-undefined
    echo "built bin/train_tft   -> libcublas.so.13, libcudart.so.13 ($CUDA13_LIB)"
    if [ "$stubs" = 0 ] && command -v nvcc >/dev/null; then
        cudalib=$(dirname "$(command -v nvcc)")/../lib
        [ -e "$cudalib/libcudart.so" ] || cudalib=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib
        nvcc -o bin/saxpy src/saxpy.cu -cudart shared -gencode arch=compute_90,code=sm_90 \
            -Xlinker -rpath -Xlinker "$(readlink -f "$cudalib")"
        echo "built bin/saxpy       -> $(nvcc --version | tail -1)"
    fi
fi
