#!/usr/bin/env bash
# Checks a CUDA build of pace on a GPU machine, in one bounded run, and prints one table last.
#
#   bash deploy/gpu-check.sh [PACE]
#
# PACE: the pace binary built with `cargo build --release --features cuda` (stripped), or that
# binary xz-compressed (PACE.xz, unpacked to /tmp with python3's lzma). Default: .gpu/pace, else
# .gpu/pace.xz. The machine needs an NVIDIA driver for CUDA 13 and python3; the CUDA 13 runtime
# libraries pace links (libcudart.so.13, libcublas.so.13, libcublasLt.so.13, libcurand.so.10)
# are taken from the system, a CUDA install, or python3's site-packages (torch's nvidia-* wheels),
# whichever has them. No Rust, no network.
#
# Parts, each under its own timeout so one failing part cannot eat the others' time (the whole
# run stays under GPU_CHECK_BUDGET seconds, default 480):
#   kernels  CUDA paged attention and KV-cache write against the CPU ops (pace gpu-check kernels)
#   model    dummy:smollm2-135m logits, GPU against CPU                  (pace gpu-check model)
#   bench    dummy:llama-3-8b bf16: decode / prefill / attention against measured ceilings
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
BUDGET=${GPU_CHECK_BUDGET:-480}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-check.log
: >"$LOG"
START=$(date +%s)
WORK=$(mktemp -d /tmp/pace-gpu-check.XXXXXX)
AB_DIR=$WORK/ab
declare -A PART_RC

say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }

# --- the binary -------------------------------------------------------------------------------
PACE=${1:-}
if [ -z "$PACE" ]; then
  if [ -f "$ROOT/.gpu/pace" ]; then PACE=$ROOT/.gpu/pace; else PACE=$ROOT/.gpu/pace.xz; fi
fi
if [ ! -f "$PACE" ]; then
  say "FAIL setup: no pace binary at $PACE (build it with: cargo build --release --features cuda -p pace-server)"
  exit 1
fi
case "$PACE" in
  *.xz)
    say "unpacking $PACE"
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$PACE" "$WORK/pace" || { say "FAIL setup: cannot unpack $PACE"; exit 1; }
    PACE=$WORK/pace
    ;;
esac
chmod +x "$PACE" 2>/dev/null || { cp "$PACE" "$WORK/pace" && chmod +x "$WORK/pace" && PACE=$WORK/pace; }

# --- the CUDA libraries -----------------------------------------------------------------------
# Directories holding each library pace needs at start (first hit wins), added to the loader path.
lib_dirs=()
add_dir() { case ":$(IFS=:; echo "${lib_dirs[*]:-}"):" in *":$1:"*) ;; *) lib_dirs+=("$1") ;; esac; }
candidates=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib)
[ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME/lib64" "$CUDA_HOME/lib")
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && candidates+=("$d")
done
while IFS= read -r sp; do
  [ -d "$sp/nvidia" ] || continue
  while IFS= read -r d; do candidates+=("$d"); done < <(find "$sp/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null)
done < <(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
for lib in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
  found=""
  for d in "${candidates[@]}"; do
    if [ -e "$d/$lib" ]; then found=$d; break; fi
  done
  if [ -n "$found" ]; then add_dir "$found"; say "found $lib in $found"; else say "WARN setup: $lib not found"; fi
done
LD_LIBRARY_PATH=$(IFS=:; echo "${lib_dirs[*]:-}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export RUST_LOG=${RUST_LOG:-info}

{
  echo "=== environment"
  echo "pace: $PACE ($(stat -c %s "$PACE") bytes)"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: unavailable"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$PACE" 2>&1 | grep -E "cuda|cublas|curand|not found" || true
  timeout 20 "$PACE" --version 2>&1
} 2>&1 | tee -a "$LOG"
if ldd "$PACE" 2>&1 | grep -q "not found"; then
  say "FAIL setup: the loader cannot find every library pace needs (above); the parts will fail"
fi

# --- the parts --------------------------------------------------------------------------------
# run_part NAME MAX_SECONDS COMMAND...: runs under min(MAX, what the budget has left).
run_part() {
  local name=$1 max=$2 reserve=25
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
run_part bench 180 "$PACE" gpu-check bench --out "$OUT"
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
