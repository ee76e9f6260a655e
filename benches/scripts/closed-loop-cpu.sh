#!/usr/bin/env bash
# Closed loops on the real server, side by side: `pace serve` with smooth and with fcfs on the
# default model, N clients that each send their next request the moment the last one ends or is
# refused (`--max-concurrencies`), on the serving benchmark's workload and clients (chat prompts
# whose answers end by themselves, cap:1024, exp:20 patience, q = 5 tok/s, alpha 2.5). Scored per
# request sent: the first 10% of the sequence is not counted, nor are requests after 80%.
#
# usage: benches/scripts/closed-loop-cpu.sh [RESULT_DIR]
#   PACE (target/release/pace), THREADS (2), SEED (42). Two reports, because a report holds one
#   workload: 1, 2 and 4 clients with 60 requests each (a few minutes each at 1-4 streams), and
#   8, 16, 32 and 64 clients with 200. About 35 minutes on this project's 2-core machine, which
#   should be otherwise quiet.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-pace-bench-closed-loop}
PACE=${PACE:-target/release/pace}
THREADS=${THREADS:-2}
SEED=${SEED:-42}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$PACE" ] || { echo "build pace first (cargo build --release)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
common=(--endpoint /v1/chat/completions --dataset-name jsonl --dataset-path benches/data/chat-prompts.jsonl
  --max-tokens-rule cap:1024 --patience exp:20 --temperature 0
  --extra-body '{"frequency_penalty": 0.5}' --tokenizer "$MODEL" --goodput ttft:5000 tpot:100
  --reading-rate 5 --alpha 2.5 --seed "$SEED" --time-limit 900 --disable-tqdm
  --warmup-fraction 0.1 --window-end-fraction 0.8 ${RESUME:+--resume})
serve=(--pace-bin "$PACE" "--serve-arg=--slo=ttft:5000 tpot:100" "--serve-arg=--threads=$THREADS")
"$PACE" bench ab --scheduler smooth,fcfs "${serve[@]}" --max-concurrencies 1,2,4 --num-prompts 60 \
  --result-dir "$OUT/1-4-clients" "${common[@]}"
"$PACE" bench ab --scheduler smooth,fcfs "${serve[@]}" --max-concurrencies 8,16,32,64 --num-prompts 200 \
  --result-dir "$OUT/8-64-clients" "${common[@]}"
