#!/usr/bin/env bash
# Checks a CUDA build of pace on a GPU machine, in one bounded run, and prints one table last.
#
#   bash deploy/gpu-check.sh [PACE]
#
# PACE: the pace binary built with `cargo build --profile cuda-release --features cuda`, or that
# binary xz-compressed (PACE.xz, unpacked with python3's lzma; what travels to a GPU host, well
# under 64 MiB). Default: .gpu/pace, else .gpu/pace.xz. The machine needs an NVIDIA driver for
# CUDA 13 (580 or newer) and python3; no Rust, no network. The CUDA 13 libraries pace links
# (libcudart.so.13, libcublas.so.13, libcublasLt.so.13, libcurand.so.10) are looked for in CUDA
# installs, $CONDA_PREFIX/lib, torch's lib and the nvidia-* wheels in python3's site-packages,
# and the loader cache (ldconfig -p), first hit wins.
#
# Setup, before any part, stops the run early with one "FAIL setup: ..." line (exit status 2)
# when the binary, a library it needs or a new enough driver is missing. It prints the driver's
# version and the CUDA version it supports, torch.version.cuda, and the libraries the binary
# NEEDs (readelf -d). PTX is compiled once per run into a writable CUDA_CACHE_PATH (in the
# scratch directory unless set; CUDA_CACHE_MAXSIZE 4 GiB). The binary is unpacked into a
# temporary directory, or into $OUT when the temporary directory is mounted noexec.
#
# Parts, each under its own timeout so one failing part cannot eat the others' time (the whole
# run stays under GPU_CHECK_BUDGET seconds, default 540):
#   kernels  CUDA paged attention, KV-cache write and greedy argmax against the CPU ops, and the
#            build's ptxas record                                         (pace gpu-check kernels)
#   model    dummy:smollm2-135m logits, GPU against CPU, and 300 greedy engine steps against the
#            plain forward pass                                           (pace gpu-check model)
#   bench    dummy:llama-3-8b bf16: decode / prefill / attention against measured ceilings, with
#            diagnostics (GEMV alone, host enqueue vs GPU time, kernel launches per step)
#   ab       a short `pace bench ab --scheduler smooth,fcfs` on the GPU (dummy:smollm2-135m)
#   summary  the table                                                   (pace gpu-check summary)
# If the tensor-core prefill kernel fails its check while the query-at-a-time kernel passes,
# the later parts run with PACE_ATTN_TENSOR_CORES=0 (and say so).
#
# Output: the console, and in $OUT (default ./gpu-check-out): gpu-check.log (everything),
# kernels.json, model.json, bench.json, summary.md, ab-report.md, ab-sweep.json.
set -uo pipefail # not -e: every part runs whatever happened to the others

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-./gpu-check-out}
BUDGET=${GPU_CHECK_BUDGET:-540}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-check.log
: >"$LOG"
START=$(date +%s)
declare -A PART_RC

say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }
# setup_fail WHY: the one line that ends a run that cannot start.
setup_fail() {
  say "FAIL setup: $*"
  exit 2
}

# A scratch directory that can hold an executable: the temporary directory, else $OUT.
can_exec_in() {
  local probe="$1/.pace-exec-probe"
  printf '#!/bin/sh\nexit 0\n' >"$probe" 2>/dev/null && chmod +x "$probe" && "$probe" 2>/dev/null
  local rc=$?
  rm -f "$probe"
  return $rc
}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pace-gpu-check.XXXXXX" 2>/dev/null || true)
if [ -z "$WORK" ] || ! can_exec_in "$WORK"; then
  [ -n "$WORK" ] && rm -rf "$WORK"
  WORK=$OUT/work
  rm -rf "$WORK" && mkdir -p "$WORK"
  can_exec_in "$WORK" || setup_fail "neither ${TMPDIR:-/tmp} nor $OUT lets a program run (both mounted noexec?)"
  say "NOTE: ${TMPDIR:-/tmp} is mounted noexec: working in $WORK"
fi
AB_DIR=$WORK/ab
trap 'rm -rf "$WORK"' EXIT

# --- the binary -------------------------------------------------------------------------------
PACE=${1:-}
if [ -z "$PACE" ]; then
  if [ -f "$ROOT/.gpu/pace" ]; then PACE=$ROOT/.gpu/pace; else PACE=$ROOT/.gpu/pace.xz; fi
fi
[ -f "$PACE" ] || setup_fail "no pace binary at $PACE (build it with: cargo build --profile cuda-release --features cuda -p pace-server --bin pace; xz it to .gpu/pace.xz)"
case "$PACE" in
  *.xz)
    say "unpacking $PACE ($(stat -c %s "$PACE") bytes)"
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$PACE" "$WORK/pace" || setup_fail "cannot unpack $PACE (python3 with lzma needed)"
    PACE=$WORK/pace
    ;;
esac
if ! chmod +x "$PACE" 2>/dev/null || ! can_exec_in "$(dirname "$PACE")"; then
  cp "$PACE" "$WORK/pace" && chmod +x "$WORK/pace" && PACE=$WORK/pace
fi

# --- what the binary needs, and where it is -------------------------------------------------
# The shared libraries the binary NEEDs: readelf -d, else the ELF dynamic section read by python3.
needed_libs() {
  if command -v readelf >/dev/null 2>&1; then
    readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
  else
    python3 - "$1" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
if d[:4] != b"\x7fELF" or d[4] != 2:
    sys.exit(0)
e = "<" if d[5] == 1 else ">"
shoff, = struct.unpack_from(e + "Q", d, 0x28)
shentsize, shnum = struct.unpack_from(e + "HH", d, 0x3A)
secs = [struct.unpack_from(e + "IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
for s in secs:
    if s[1] != 6:  # SHT_DYNAMIC
        continue
    strtab = secs[s[6]]
    for off in range(s[4], s[4] + s[5], 16):
        tag, val = struct.unpack_from(e + "qQ", d, off)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            name = d[strtab[4] + val:d.index(b"\0", strtab[4] + val)]
            print(name.decode())
PY
  fi
}
NEEDED=$(needed_libs "$PACE")
# The driver's directories first, so the system's libcuda.so.1 wins over a compat copy elsewhere.
candidates=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib)
[ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME/lib64" "$CUDA_HOME/lib")
[ -n "${CUDA_PATH:-}" ] && candidates+=("$CUDA_PATH/lib64")
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib /opt/cuda/lib64; do
  [ -d "$d" ] && candidates+=("$d")
done
[ -n "${CONDA_PREFIX:-}" ] && candidates+=("$CONDA_PREFIX/lib")
while IFS= read -r sp; do
  [ -d "$sp/torch/lib" ] && candidates+=("$sp/torch/lib")
  [ -d "$sp/nvidia" ] || continue
  while IFS= read -r d; do candidates+=("$d"); done < <(find "$sp/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | sort)
done < <(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | sort -u)
while IFS= read -r d; do candidates+=("$d"); done < <(ldconfig -p 2>/dev/null | sed -n 's/.* => \(.*\)\/[^/]*$/\1/p' | sort -u)

# Directories holding each library (first candidate wins), put on the loader path in the
# candidates' order, so the loader takes the copy this script reports.
lib_dirs=()
add_dir() { case ":$(IFS=:; echo "${lib_dirs[*]:-}"):" in *":$1:"*) ;; *) lib_dirs+=("$1") ;; esac; }
in_candidate_order() {
  local d l
  for d in "${candidates[@]}"; do
    for l in "${lib_dirs[@]:-}"; do [ "$d" = "$l" ] && echo "$d"; done
  done | awk '!seen[$0]++'
}
find_lib() {
  local d
  for d in "${candidates[@]}"; do
    if [ -e "$d/$1" ]; then echo "$d"; return 0; fi
  done
  return 1
}
# The driver library first: without it nothing else matters.
want="libcuda.so.1"
for lib in $NEEDED; do
  case "$lib" in libcuda.so* | libcudart* | libcublas* | libcurand* | libnvrtc* | libcufft* | libcusparse*) want="$want $lib" ;; esac
done
missing=""
for lib in $(echo "$want" | tr ' ' '\n' | awk '!seen[$0]++'); do
  if dir=$(find_lib "$lib"); then
    add_dir "$dir"
    say "found $lib in $dir"
  else
    missing="$missing $lib"
  fi
done
LD_LIBRARY_PATH=$(in_candidate_order | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export RUST_LOG=${RUST_LOG:-info}
# PTX the driver compiles at load is compiled once for the run's processes, not by each of them.
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$WORK/cuda-cache}
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
mkdir -p "$CUDA_CACHE_PATH" 2>/dev/null

# The CUDA version the driver supports (cuDriverGetVersion: 13000 is 13.0), or empty.
driver_cuda=$(python3 -c '
import ctypes, sys
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError:
    sys.exit(0)
v = ctypes.c_int(0)
if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
    print(v.value)
' 2>/dev/null)
{
  echo "=== environment"
  echo "pace: $PACE ($(stat -c %s "$PACE") bytes)"
  echo "NEEDED: $(echo $NEEDED)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  else
    echo "nvidia-smi: not installed"
  fi
  echo "driver supports CUDA: ${driver_cuda:+$((driver_cuda / 1000)).$((driver_cuda % 1000 / 10))}${driver_cuda:-unknown (no libcuda.so.1 the loader can open)}"
  echo "torch.version.cuda: $(timeout 15 python3 -c 'import torch; print(torch.version.cuda)' 2>/dev/null || echo 'no torch (or it took over 15 s)')"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "CUDA_CACHE_PATH=$CUDA_CACHE_PATH (max $CUDA_CACHE_MAXSIZE bytes)"
  ldd "$PACE" 2>&1 | grep -E "cuda|cublas|curand|nvrtc|not found" || true
} 2>&1 | tee -a "$LOG"
case " $missing " in
  *" libcuda.so.1 "*) setup_fail "no NVIDIA driver: libcuda.so.1 is nowhere the loader or this script looks" ;;
esac
if [ -n "$driver_cuda" ] && [ "$driver_cuda" -lt 13000 ]; then
  setup_fail "the driver supports CUDA $((driver_cuda / 1000)).$((driver_cuda % 1000 / 10)); this pace build needs CUDA 13.0 (driver 580 or newer)"
fi
[ -z "$missing" ] || setup_fail "missing CUDA libraries:$missing (install the CUDA 13 runtime, or pip install nvidia-cuda-runtime nvidia-cublas nvidia-curand)"
if ldd "$PACE" 2>&1 | grep -q "not found"; then
  setup_fail "the loader cannot resolve every library pace needs: $(ldd "$PACE" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
fi
timeout 20 "$PACE" --version 2>&1 | tee -a "$LOG" || setup_fail "pace does not start (above)"

# --- the parts --------------------------------------------------------------------------------
# run_part NAME MAX_SECONDS COMMAND...: runs under min(MAX, what the budget has left).
run_part() {
  local name=$1 max=$2 reserve=45 # the summary's 30 s and a part's kill-after 10 s
  shift 2
  local left=$((BUDGET - $(elapsed) - reserve))
  local t=$((max < left ? max : left))
  if [ "$t" -lt 10 ]; then
    say "SKIP $name: the time budget (${BUDGET} s) is spent"
    PART_RC[$name]=skipped
    return
  fi
  say "=== $name (timeout ${t} s, $(elapsed) s into the run)"
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$t" "$@" 2>&1 | tee -a "$LOG" "$WORK/$name.log"
  local rc=${PIPESTATUS[0]}
  PART_RC[$name]=$rc
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then say "FAIL $name: timed out after ${t} s"; fi
  say "=== $name: exit status $rc after $(($(date +%s) - t0)) s"
}

run_part kernels 90 "$PACE" gpu-check kernels --out "$OUT"
if grep -q "^FAIL kernels: paged_attention \[default\]" "$WORK/kernels.log" 2>/dev/null &&
  ! grep -q "^FAIL kernels: paged_attention \[query-at-a-time\]" "$WORK/kernels.log"; then
  export PACE_ATTN_TENSOR_CORES=0
  say "NOTE: the tensor-core kernel failed its check and the query-at-a-time kernel passed:" \
    "the model, bench and ab parts run with PACE_ATTN_TENSOR_CORES=0"
fi
run_part model 90 "$PACE" gpu-check model --out "$OUT"
run_part bench 210 "$PACE" gpu-check bench --out "$OUT"
run_part ab 120 "$PACE" bench ab --scheduler smooth,fcfs --pace-bin "$PACE" \
  --serve-model dummy:smollm2-135m --tokenizer dummy:smollm2-135m --serve-arg=--device=cuda \
  --request-rates 4,16 --num-prompts 32 --random-input-len 256 --random-output-len 64 --seed 7 \
  --time-limit 30 --server-start-timeout 60 --server-stop-timeout 10 --result-dir "$AB_DIR" --disable-tqdm
cp "$AB_DIR/report.md" "$OUT/ab-report.md" 2>/dev/null
cp "$AB_DIR/sweep.json" "$OUT/ab-sweep.json" 2>/dev/null
if [ "${PART_RC[ab]:-}" != 0 ]; then
  # The started servers' last words, if the A/B run failed.
  for f in "$AB_DIR"/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; } | tee -a "$LOG"; done
fi

# --- the table --------------------------------------------------------------------------------
say ""
say "=== gpu-check: $(elapsed) s; part exit statuses: kernels=${PART_RC[kernels]:-} model=${PART_RC[model]:-}" \
  "bench=${PART_RC[bench]:-} ab=${PART_RC[ab]:-}${PACE_ATTN_TENSOR_CORES:+ (PACE_ATTN_TENSOR_CORES=0)}"
if ! timeout 30 "$PACE" gpu-check summary --out "$OUT" --ab-dir "$AB_DIR" >"$WORK/summary.out" 2>&1 ||
  [ ! -s "$OUT/summary.md" ]; then
  # pace itself could not make the table (it did not start?): a plain one from the exit statuses.
  cat "$WORK/summary.out" >>"$LOG"
  {
    echo "| part | status |"
    echo "|---|---|"
    for p in kernels model bench ab; do
      rc=${PART_RC[$p]:-skipped}
      echo "| $p | $([ "$rc" = 0 ] && echo PASS || echo "FAIL (exit status $rc)") |"
    done
  } >"$OUT/summary.md"
fi
tee -a "$LOG" <"$OUT/summary.md"
failed=0
for p in kernels model bench ab; do [ "${PART_RC[$p]:-}" = 0 ] || failed=1; done
rm -rf "$WORK"
exit "$failed"
