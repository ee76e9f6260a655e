#!/usr/bin/env bash
# fcfs against smooth with the official OpenAI Python client's users (benches/scripts/openai_users.py:
# 16 users, 3 questions each, default retries, time counted from the user's call), a fresh
# `pace serve` per policy and repeat, the order alternating; then `pace bench score` on all.
#
#   benches/scripts/ab-openai-users.sh OUT_DIR [REPEATS] [USERS] [QUESTIONS]
set -euo pipefail
out=${1:?OUT_DIR}
repeats=${2:-3}
users=${3:-16}
questions=${4:-3}
pace=${PACE:-target/release/pace}
py=${PY:-target/clients-venv/bin/python}
port=${PORT:-18431}
mkdir -p "$out"
for r in $(seq 1 "$repeats"); do
  if (( r % 2 == 1 )); then order="fcfs smooth"; else order="smooth fcfs"; fi
  for p in $order; do
    "$pace" serve --scheduler "$p" --port "$port" > "$out/serve-$p-$r.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.2; done
    "$py" benches/scripts/openai_users.py --base-url "http://127.0.0.1:$port/v1" --users "$users" \
      --questions "$questions" --seed "$r" --out "$out/$p-repeat-$r.json"
    kill -TERM "$pid"; wait "$pid" || true
  done
done
"$pace" bench score "$out"/fcfs-repeat-*.json "$out"/smooth-repeat-*.json | tee "$out/score.txt"
