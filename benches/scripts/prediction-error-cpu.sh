#!/usr/bin/env bash
# The cost model's own quality on the real server (issue 12, item 4): `pace serve` (smooth, the
# default model, 2 threads) under the serving benchmark's workload at steady offered loads, one
# after another on the same server; /metrics is scraped before and after each load, and
# benches/scripts/prediction_error.py turns the histograms' differences into the share of steps
# whose predicted time is within 10% of the measured one, and percentiles of the ratio. The
# server also writes every step (shape, prediction, measured time) to steps.jsonl, which
# benches/scripts/step_trace.py studies: the fitted model without the speed correction, the best
# any fixed model of the step's shape does on the same steps, and how the error drifts.
#
# usage: benches/scripts/prediction-error-cpu.sh [RESULT_DIR]
#   SATURATION (1.64 req/s), FACTORS (0.5,1,1.5), SPAN (150 s of arrivals per load), THREADS (2),
#   SCHEDULER (smooth), PACE (target/release/pace), SEED (42), SERVE_CPUS and CLIENT_CPUS (unset;
#   CPU lists in taskset's syntax, e.g. 1 and 0 with THREADS=1: the server and the benchmark
#   client each on their own cores, so the client's work does not land inside the server's
#   steps). About 9 minutes on this project's 2-core machine, which should be otherwise quiet (a
#   busy machine makes steps slower than the model it learned).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-pace-prediction-error}
SATURATION=${SATURATION:-1.64}
FACTORS=${FACTORS:-0.5,1,1.5}
SPAN=${SPAN:-150}
THREADS=${THREADS:-2}
SCHEDULER=${SCHEDULER:-smooth}
SEED=${SEED:-42}
PACE=${PACE:-target/release/pace}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$PACE" ] || { echo "build pace first (cargo build --release)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
mkdir -p "$OUT"
rm -f "$OUT/steps.jsonl"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
${SERVE_CPUS:+taskset -c "$SERVE_CPUS"} "$PACE" serve --host 127.0.0.1 --port "$port" --threads "$THREADS" --scheduler "$SCHEDULER" \
  --slo "ttft:5000 tpot:100" --step-trace "$OUT/steps.jsonl" >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "pace serve did not come up" >&2; cat "$OUT/serve.log" >&2; exit 1; }
{
  echo "command: benches/scripts/prediction-error-cpu.sh $OUT (SATURATION=$SATURATION FACTORS=$FACTORS SPAN=$SPAN THREADS=$THREADS SCHEDULER=$SCHEDULER SEED=$SEED${SERVE_CPUS:+ SERVE_CPUS=$SERVE_CPUS}${CLIENT_CPUS:+ CLIENT_CPUS=$CLIENT_CPUS})"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo -dirty)"
  echo "machine: $(nproc) cores, $(uname -srm), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
} >"$OUT/provenance.txt"
prompts=$(python3 -c "import math; print(math.ceil(max(float(f) for f in '$FACTORS'.split(',')) * $SATURATION * $SPAN * 1.2))")
for f in ${FACTORS//,/ }; do
  rate=$(python3 -c "print(f'{$f * $SATURATION:.3g}')")
  curl -sf "http://127.0.0.1:$port/metrics" >"$OUT/metrics-${f}x-before.prom"
  ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} "$PACE" bench serve --base-url "http://127.0.0.1:$port" --request-rate "$rate" --duration "$SPAN" \
    --endpoint /v1/chat/completions --dataset-name jsonl --dataset-path benches/data/chat-prompts.jsonl \
    --num-prompts "$prompts" --max-tokens-rule cap:1024 --patience exp:20 --temperature 0 \
    --extra-body '{"frequency_penalty": 0.5}' --tokenizer "$MODEL" --goodput ttft:5000 tpot:100 \
    --reading-rate 5 --alpha 2.5 --seed "$SEED" --time-limit 900 --disable-tqdm >"$OUT/bench-${f}x.txt"
  curl -sf "http://127.0.0.1:$port/metrics" >"$OUT/metrics-${f}x-after.prom"
  python3 benches/scripts/prediction_error.py "$OUT/metrics-${f}x-before.prom" "$OUT/metrics-${f}x-after.prom" >"$OUT/error-${f}x.json"
  python3 - "$OUT/error-${f}x.json" "$f" "$rate" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for name, m in d.items():
    w = m["within_10pct"]
    print(f"{sys.argv[2]}x ({sys.argv[3]} req/s) {name}: {m['observations']:.0f} observations, "
          f"{'-' if w is None else f'{100 * w:.1f}%'} within 10%, p05 {m['p05']} p50 {m['p50']} p95 {m['p95']}")
EOF
done | tee "$OUT/summary.txt"
python3 benches/scripts/step_trace.py "$OUT/steps.jsonl" | tee "$OUT/step-trace.txt"
