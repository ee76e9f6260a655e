#!/usr/bin/env bash
# Sets up a CUDA 13.0 build toolchain from the Python package index wheels, on a machine with no GPU and
# no CUDA install, so that `cargo build --features cuda` (candle's cuda feature, nvcc-compiled kernels)
# can build and .cu files can be compile-checked. It cannot run CUDA code: there is no driver.
#
# Usage:  eval "$(tools/cuda-toolchain.sh [DIR])"     (default DIR: /tmp/cuda13; ~10 s, 1.2 GB)
# Used by server/tests/cuda_build.rs (DIR: target/cuda-toolchain); see ARCHITECTURE.md, Device story.
# It prints the environment to export: CUDA_HOME, PATH, CUDA_COMPUTE_CAP (default 90), LIBRARY_PATH.
#
# Seen on this kind of machine:
# - candle 0.11.1 with features=["cuda"] builds in about 8-10.5 minutes on 2 cores (mostly nvcc/ptxas on
#   candle-kernels' quantized matmul files). CUDAFORGE_THREADS=2 cut that kernel step from 364 s to 203 s here.
# - Keep nvcc at 13.0: the H200 machines' driver (580) is CUDA 13.0, and candle loads its kernels as PTX,
#   which a driver cannot JIT from a newer toolkit. The newest nvidia-cuda-nvcc (13.5) would break that.
# - The cu12 wheel nvidia-cuda-nvcc-cu12 has no nvcc binary; it cannot compile .cu files.
# - With CUDA_COMPUTE_CAP=90, candle's build uses sm_90a (runs on H100/H200 only).
# - The wheels have no libcuda (that is the driver's). candle-core's cudarc links it dynamically, so this
#   script builds a link-time stub with every cu* symbol. A binary linked this way needs the real
#   libcuda.so.1 (and libcudart/libcublas/libcurand .so.13/.so.10) to START: it cannot run on a machine
#   without the driver. cudarc's `dynamic-loading` feature avoids that, but candle-core hard-wires
#   `dynamic-linking`, and Cargo features cannot remove it.
# - nvcc -ptx / -cubin -arch=sm_90 on a .cu file works here in about 0.3 s per file.
set -euo pipefail
DIR=${1:-/tmp/cuda13}
VENV=$DIR/venv
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
have_nvcc=0
for f in "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do [ -x "$f" ] && have_nvcc=1; done
if [ "$have_nvcc" = 0 ]; then
  "$VENV/bin/pip" install -q nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
    nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 >&2
fi
C=$(echo "$VENV"/lib/python3*/site-packages/nvidia/cu13)
ROOT=$DIR/root
mkdir -p "$ROOT/lib64" "$ROOT/stubsrc"
ln -sfn "$C/bin" "$ROOT/bin"; ln -sfn "$C/include" "$ROOT/include"; ln -sfn "$C/nvvm" "$ROOT/nvvm"
for f in "$C"/lib/*.so* "$C"/lib/*.a; do ln -sfn "$f" "$ROOT/lib64/$(basename "$f")"; done
for l in cudart cublas cublasLt nvrtc; do ln -sfn "$C/lib/lib$l.so.13" "$ROOT/lib64/lib$l.so"; done
ln -sfn "$C/lib/libcurand.so.10" "$ROOT/lib64/libcurand.so"
if [ ! -f "$ROOT/lib64/libcuda.so" ]; then
  # Link-time stub of the driver library: every cu* entry point that the cudarc in the cargo registry declares.
  syms=$(grep -ohE "^ *pub (unsafe )?fn cu[A-Za-z0-9_]+" "$HOME"/.cargo/registry/src/*/cudarc-*/src/driver/sys/*.rs 2>/dev/null |
    grep -oE "cu[A-Za-z0-9_]+$" | sort -u)
  if [ -z "$syms" ]; then
    echo "no cudarc sources in the cargo registry yet: run 'cargo fetch' in the project first" >&2
    exit 1
  fi
  for s in $syms; do echo "int $s(void){return 999;}"; done >"$ROOT/stubsrc/cuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$ROOT/lib64/libcuda.so" "$ROOT/stubsrc/cuda_stub.c"
fi
echo "export CUDA_HOME=$ROOT"
echo "export PATH=$ROOT/bin:\$PATH"
echo "export CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-90}"
echo "export LIBRARY_PATH=$ROOT/lib64\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
