#!/usr/bin/env bash
# The serving benchmark, measured as ../shared/docs/evaluation.md asks, side by side in one run:
# llama.cpp's server with 16 slots, then `pace serve` with each scheduler policy, all on the
# default model, the same seeded workload and the same seeded clients:
# - chat prompts whose answers end by themselves (benches/data/chat-prompts.jsonl; greedy with
#   frequency_penalty 0.5, mean 172 output tokens, 2% reach 1024), max_tokens cap:1024;
# - clients with exp:20 patience, q = 5 tok/s, alpha 2.5;
# - Poisson arrivals at 0.5x, 1x, 1.5x and 2x of pace's saturation for SPAN seconds each (so
#   every load has the same time to reach its steady state: the simulator shows fcfs's overload
#   settling after about 80 s on this workload), of which the arrivals between 30% and 80% of
#   the span are counted (115 to 460 requests), every run until its counted requests end, with
#   arrivals going on after the span (ARRIVAL_SPAN, twice SPAN) so the load stays on until then:
#   when arrivals stopped at the span (the published report of 2026-12-01), the counted answers
#   still running finished on a draining machine, which flattered fcfs's slow streams
#   (benches/scripts/ab-repeats.sh says more);
# - then the three ablations at 1.5x (a second report, ablations/; smooth and fcfs at 1.5x are in
#   the first, on the same seeded workload).
#
# usage: benches/scripts/ab-vs-llama-cpp.sh [RESULT_DIR]
#   SATURATION (2.06 req/s, measured 2026-12-03: `pace serve --scheduler fcfs` delivered 359
#   tok/s inside the window under overload, and the answers average 174 tokens; it was 1.64 on
#   2026-12-01, 280 tok/s, the simulator's cpu-smollm2 preset's estimate), FACTORS (0.5,1,1.5,2),
#   SPAN (280 s), ARRIVAL_SPAN (twice SPAN), PATIENCE (exp:20), THREADS (2),
#   LLAMA_DIR (/tmp/llama-cpp, built by tools/build-llama-cpp.sh), PACE
#   (target/release/pace), POLICIES (smooth,fcfs,drop-late), ABLATIONS (smooth:door=0,
#   smooth:start=0,smooth:chunk=0,smooth:order=0; empty to skip), SEED (42), RESUME (set to 1 to keep every point
#   already in RESULT_DIR and run only the missing ones: `pace bench ab --resume`).
# About 100 minutes on this project's 2-core machine, which should be otherwise quiet.
# llama-server stays up, idle, while pace runs (pace bench ab runs URL targets first); it is
# stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-pace-bench-ab-vs-llama-cpp}
SATURATION=${SATURATION:-2.06}
FACTORS=${FACTORS:-0.5,1,1.5,2}
SPAN=${SPAN:-280}
ARRIVAL_SPAN=${ARRIVAL_SPAN:-$((2 * SPAN))}
PATIENCE=${PATIENCE:-exp:20}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-smooth,fcfs,drop-late}
ABLATIONS=${ABLATIONS-smooth:door=0,smooth:start=0,smooth:chunk=0,smooth:order=0}
SEED=${SEED:-42}
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama-cpp}
PACE=${PACE:-target/release/pace}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
SLO="ttft:5000 tpot:100"
[ -x "$LLAMA_DIR/bin/llama-server" ] || { echo "build llama.cpp first (tools/build-llama-cpp.sh $LLAMA_DIR)" >&2; exit 1; }
[ -x "$PACE" ] || { echo "build pace first (cargo build --release)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
mkdir -p "$OUT"
rates=$(python3 -c "print(','.join(f'{float(f) * $SATURATION:.3g}' for f in '$FACTORS'.split(',')))")
rate15=$(python3 -c "print(f'{1.5 * $SATURATION:.3g}')")
# Enough prompts for the highest load's span (they repeat in a new order beyond the 600).
prompts=$(python3 -c "import math; print(math.ceil(max(float(f) for f in '$FACTORS'.split(',')) * $SATURATION * $ARRIVAL_SPAN * 1.2))")
read -r wstart wend < <(python3 -c "print(0.3 * $SPAN / $ARRIVAL_SPAN, 0.8 * $SPAN / $ARRIVAL_SPAN)")

# The workload every target gets (flags after the targets').
common=(--endpoint /v1/chat/completions --dataset-name jsonl --dataset-path benches/data/chat-prompts.jsonl
  --num-prompts "$prompts" --duration "$ARRIVAL_SPAN" --warmup-fraction "$wstart" --window-end-fraction "$wend"
  --max-tokens-rule cap:1024 --patience "$PATIENCE" --temperature 0
  --extra-body '{"frequency_penalty": 0.5}' --tokenizer "$MODEL" --goodput ttft:5000 tpot:100
  --reading-rate 5 --alpha 2.5 --seed "$SEED" --time-limit 900 --disable-tqdm ${RESUME:+--resume})
serve=(--pace-bin "$PACE" "--serve-arg=--slo=$SLO" "--serve-arg=--threads=$THREADS")

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# 16 slots with room for a prompt (at most 50 tokens with the template) and 1024 output tokens.
# No prompt cache: llama-server stays up across loads, which replay the same seeded prompts, so
# its cache would find whole prompts prefilled at an earlier load. pace's prefix cache is on (its
# default, as vLLM's) and starts empty with each point's fresh server: it finds the chat
# template's system prompt (about 30 tokens) that every request shares and, past the 600 distinct
# prompts, whole prompts again; with prompts this short it saves pace a few ms of prefill a request.
"$LLAMA_DIR/bin/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" -np 16 -c $((16 * 1152)) \
  -t "$THREADS" --no-webui --no-cache-prompt >"$OUT/llama-server.log" 2>&1 &
lpid=$!
trap 'kill $lpid 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done

echo "loads: $rates req/s (x $SATURATION req/s saturation)"
"$PACE" bench ab --base-urls "http://127.0.0.1:$port" --labels "llama.cpp -np 16" --scheduler "$POLICIES" \
  "${serve[@]}" --request-rates "$rates" --result-dir "$OUT" "${common[@]}"
kill $lpid 2>/dev/null || true
if [ -n "$ABLATIONS" ]; then
  "$PACE" bench ab --scheduler "$ABLATIONS" "${serve[@]}" --request-rates "$rate15" --result-dir "$OUT/ablations" "${common[@]}"
fi
