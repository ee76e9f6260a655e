#!/usr/bin/env bash
# The serving benchmark of the server issue, side by side in one run: llama.cpp's server with 16
# slots, then `pace serve` with each scheduler policy, all on the default model and the same
# seeded workload (ISL 256 / OSL 128, ignore_eos), swept from light load to about twice pace's
# saturation. One `pace bench ab` report: throughput, TTFT/TPOT p50/p99, attainment and goodput
# for ttft:5000 tpot:100, smooth goodput (q 5 tok/s, alpha 2.5), plots.
#
# usage: benches/scripts/ab-vs-llama-cpp.sh [RESULT_DIR]
#   RATES (default 0.25,0.5,0.75,1,1.5,2), PROMPTS (40 per load), DURATION (80 s of sending per
#   load), THREADS (2), LLAMA_DIR (/tmp/llama-cpp, built by tools/build-llama-cpp.sh),
#   PACE (target/release/pace), POLICIES (smooth,fcfs,drop-late).
# The machine should be otherwise quiet. llama-server stays up, idle, while pace runs (pace bench
# ab runs URL targets first); it is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-pace-bench-ab-vs-llama-cpp}
RATES=${RATES:-0.25,0.5,0.75,1,1.5,2}
PROMPTS=${PROMPTS:-40}
DURATION=${DURATION:-80}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-smooth,fcfs,drop-late}
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama-cpp}
PACE=${PACE:-target/release/pace}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
SLO="ttft:5000 tpot:100"
[ -x "$LLAMA_DIR/bin/llama-server" ] || { echo "build llama.cpp first (tools/build-llama-cpp.sh $LLAMA_DIR)" >&2; exit 1; }
[ -x "$PACE" ] || { echo "build pace first (cargo build --release)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
mkdir -p "$OUT"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# 16 slots of 256 + 128 tokens, with room for the BOS and rounding. No prompt cache: every load
# replays the same seeded prompts, which llama-server would otherwise find in its slots and not
# prefill again (pace has no prefix cache yet).
"$LLAMA_DIR/bin/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" -np 16 -c $((16 * 448)) \
  -t "$THREADS" --no-webui --no-cache-prompt >"$OUT/llama-server.log" 2>&1 &
lpid=$!
trap 'kill $lpid 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done

"$PACE" bench ab --base-urls "http://127.0.0.1:$port" --labels "llama.cpp -np 16" \
  --scheduler "$POLICIES" --pace-bin "$PACE" "--serve-arg=--slo=$SLO" "--serve-arg=--threads=$THREADS" \
  --request-rates "$RATES" --num-prompts "$PROMPTS" --duration "$DURATION" \
  --random-input-len 256 --random-output-len 128 --tokenizer "$MODEL" \
  --goodput ttft:5000 tpot:100 --reading-rate 5 --alpha 2.5 --seed 42 --time-limit 240 \
  --result-dir "$OUT" --disable-tqdm
