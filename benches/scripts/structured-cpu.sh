#!/usr/bin/env bash
# The cost of constrained decoding (structured outputs) on the default model, 2 CPU threads:
# one pace serve (fcfs), then benches/scripts/structured_client.py runs ROUNDS rounds of plain
# and JSON-schema-constrained decoding side by side (16 streams x 256 tokens, 1 stream x 512).
# Writes report.md (provenance and the table), run.json (raw) and the server log into OUT
# (default docs/bench/structured-cpu-smollm2). Needs a release build and a quiet machine.
#
# usage: benches/scripts/structured-cpu.sh [ROUNDS=8]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-8}
PACE=${PACE:-target/release/pace}
OUT=${OUT:-docs/bench/structured-cpu-smollm2}
mkdir -p "$OUT"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
rm -f "$OUT/steps.jsonl"
"$PACE" serve --port "$port" --threads 2 --scheduler fcfs --step-trace "$OUT/steps.jsonl" > "$OUT/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
python3 benches/scripts/structured_client.py "http://127.0.0.1:$port" "$ROUNDS" > "$OUT/run.json"
kill "$pid"; wait "$pid" 2>/dev/null || true
{
  echo "# Constrained decoding on the CPU: SmolLM2-135M-Instruct Q4_1, 2 threads"
  echo
  echo "- command: \`benches/scripts/structured-cpu.sh $ROUNDS\`"
  echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet -- . ":(exclude)$OUT" || echo -dirty)"
  echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
  echo "- client: \`benches/scripts/structured_client.py\` (raw results: \`run.json\`; server log: \`serve.log\`; step trace: \`steps.jsonl\`)"
  echo
  python3 benches/scripts/structured_client.py --report "$OUT"
} > "$OUT/report.md"
cat "$OUT/report.md"
