#!/usr/bin/env bash
# The serving benchmark's pace half (smooth, fcfs, drop-late; no llama.cpp), repeated with new
# seeds: `pace bench ab --repeats`. One run's interval comes from the spread of its own requests'
# benefits; a new seed brings other prompts, arrivals and clients (and the few answers that run
# to 1024 tokens land elsewhere), so the repeats show how much a point really moves, and the
# paired differences (same seed, same workload) are the comparison to read.
# The workload is benches/scripts/ab-vs-llama-cpp.sh's (chat prompts whose answers end by
# themselves, cap:1024, exp:20 patience, q = 5 tok/s, alpha 2.5, Poisson arrivals, the arrivals
# between 84 s and 224 s counted), with one difference: arrivals go on for ARRIVAL_SPAN seconds,
# long after the window, so the load stays on until the last counted answer has ended (the run
# stops then, whatever is left of the span). With arrivals stopping 56 s after the window, as
# in ab-vs-llama-cpp.sh, the counted answers still running then (a 1024-token answer at 4 tok/s
# takes over four minutes) finish on a draining machine: the end effect evaluation.md warns of,
# which flatters a policy that lets its streams fall behind.
#
# usage: benches/scripts/ab-repeats.sh [RESULT_DIR]
#   SATURATION (2.06 req/s: measured 2026-12-03, fcfs delivered 359 tok/s inside the window at
#   3.28 req/s, and the answers average 174 tokens; it was 1.64 on 2026-12-01), FACTORS (2),
#   REPEATS (3), SEED (43: the first repeat's; 42 is the single-run report's), WINDOW (84,224:
#   seconds), ARRIVAL_SPAN (560 s), PATIENCE (exp:20), THREADS (2), PACE (target/release/pace),
#   POLICIES (smooth,fcfs,drop-late), PRIORITY_MIX (none; e.g. 0.2:-2 sends a fifth of the
#   requests with vLLM's priority -2, weighs their benefit 4 and scores against the weighted
#   ceiling; each repeat's report gets a "By priority" table), RESUME (set to 1 to reuse every
#   point already in RESULT_DIR and run only the missing ones; with a smaller REPEATS it writes
#   the summary over the repeats that ran), SIDE_BY_SIDE (unset; a CPU set per policy, e.g. 0/1:
#   the policies run at the same time, each server on its own CPUs, so that the machine's speed
#   drifts for all of them at once: `pace bench ab --side-by-side --serve-cpus`; set THREADS to
#   the CPUs in one set, and SATURATION to what one such server sustains).
# About 6 minutes per point at 2x (until the counted answers end: a 1024-token answer at the
# reading rate takes about 3.4 minutes), REPEATS x policies x loads of them (about an hour by
# default) on this project's 2-core machine, which should be otherwise quiet.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-pace-bench-ab-repeats}
SATURATION=${SATURATION:-2.06}
FACTORS=${FACTORS:-2}
REPEATS=${REPEATS:-3}
SEED=${SEED:-43}
WINDOW=${WINDOW:-84,224}
ARRIVAL_SPAN=${ARRIVAL_SPAN:-560}
PATIENCE=${PATIENCE:-exp:20}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-smooth,fcfs,drop-late}
PRIORITY_MIX=${PRIORITY_MIX:-}
PACE=${PACE:-target/release/pace}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$PACE" ] || { echo "build pace first (cargo build --release)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
rates=$(python3 -c "print(','.join(f'{float(f) * $SATURATION:.3g}' for f in '$FACTORS'.split(',')))")
prompts=$(python3 -c "import math; print(math.ceil(max(float(f) for f in '$FACTORS'.split(',')) * $SATURATION * $ARRIVAL_SPAN * 1.2))")
read -r wstart wend < <(python3 -c "a, b = map(float, '$WINDOW'.split(',')); print(a / $ARRIVAL_SPAN, b / $ARRIVAL_SPAN)")
echo "loads: $rates req/s (x $SATURATION req/s saturation), $REPEATS repeats from seed $SEED"
"$PACE" bench ab --scheduler "$POLICIES" --pace-bin "$PACE" "--serve-arg=--slo=ttft:5000 tpot:100" "--serve-arg=--threads=$THREADS" \
  --request-rates "$rates" --repeats "$REPEATS" --result-dir "$OUT" \
  --endpoint /v1/chat/completions --dataset-name jsonl --dataset-path benches/data/chat-prompts.jsonl \
  --num-prompts "$prompts" --duration "$ARRIVAL_SPAN" --warmup-fraction "$wstart" --window-end-fraction "$wend" \
  --max-tokens-rule cap:1024 --patience "$PATIENCE" --temperature 0 \
  --extra-body '{"frequency_penalty": 0.5}' --tokenizer "$MODEL" --goodput ttft:5000 tpot:100 \
  --reading-rate 5 --alpha 2.5 --seed "$SEED" --time-limit 900 --disable-tqdm ${PRIORITY_MIX:+--priority-mix "$PRIORITY_MIX"} ${RESUME:+--resume} \
  ${SIDE_BY_SIDE:+--side-by-side --serve-cpus "$SIDE_BY_SIDE"}
