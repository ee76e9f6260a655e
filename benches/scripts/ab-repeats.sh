#!/usr/bin/env bash
# The serving benchmark's pace half (smooth, fcfs, drop-late; no llama.cpp), repeated with new
# seeds: `pace bench ab --repeats`. One run's interval comes from the spread of its own requests'
# benefits; a new seed brings other prompts, arrivals and clients (and the few answers that run
# to 1024 tokens land elsewhere), so the repeats show how much a point really moves, and the
# paired differences (same seed, same workload) are the comparison to read.
# The workload is benches/scripts/ab-vs-llama-cpp.sh's: chat prompts whose answers end by
# themselves, cap:1024, exp:20 patience, q = 5 tok/s, alpha 2.5, SPAN seconds of Poisson arrivals
# at each load, the arrivals between 30% and 80% of the span counted.
#
# usage: benches/scripts/ab-repeats.sh [RESULT_DIR]
#   SATURATION (1.64 req/s), FACTORS (2), REPEATS (5), SEED (43: the first repeat's; 42 is the
#   single-run report's), SPAN (280 s), PATIENCE (exp:20), THREADS (2), PACE (target/release/pace),
#   POLICIES (smooth,fcfs,drop-late).
# About 5 minutes per point: REPEATS x policies x loads of them (75 minutes by default) on this
# project's 2-core machine, which should be otherwise quiet.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-pace-bench-ab-repeats}
SATURATION=${SATURATION:-1.64}
FACTORS=${FACTORS:-2}
REPEATS=${REPEATS:-5}
SEED=${SEED:-43}
SPAN=${SPAN:-280}
PATIENCE=${PATIENCE:-exp:20}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-smooth,fcfs,drop-late}
PACE=${PACE:-target/release/pace}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$PACE" ] || { echo "build pace first (cargo build --release)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
rates=$(python3 -c "print(','.join(f'{float(f) * $SATURATION:.3g}' for f in '$FACTORS'.split(',')))")
prompts=$(python3 -c "import math; print(math.ceil(max(float(f) for f in '$FACTORS'.split(',')) * $SATURATION * $SPAN * 1.2))")
echo "loads: $rates req/s (x $SATURATION req/s saturation), $REPEATS repeats from seed $SEED"
"$PACE" bench ab --scheduler "$POLICIES" --pace-bin "$PACE" "--serve-arg=--slo=ttft:5000 tpot:100" "--serve-arg=--threads=$THREADS" \
  --request-rates "$rates" --repeats "$REPEATS" --result-dir "$OUT" \
  --endpoint /v1/chat/completions --dataset-name jsonl --dataset-path benches/data/chat-prompts.jsonl \
  --num-prompts "$prompts" --duration "$SPAN" --warmup-fraction 0.3 --window-end-fraction 0.8 \
  --max-tokens-rule cap:1024 --patience "$PATIENCE" --temperature 0 \
  --extra-body '{"frequency_penalty": 0.5}' --tokenizer "$MODEL" --goodput ttft:5000 tpot:100 \
  --reading-rate 5 --alpha 2.5 --seed "$SEED" --time-limit 900 --disable-tqdm
