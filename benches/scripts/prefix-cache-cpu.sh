#!/usr/bin/env bash
# Prefix caching on the default model, 2 CPU threads: pace serve with caching on and off, the
# same two workloads (benches/scripts/prefix_cache_client.py) against each, REPS times, each on
# a fresh server. Writes report.md (provenance and the table) and the raw JSON into OUT
# (default docs/bench/prefix-cache-cpu-smollm2). Needs a release build; the machine should
# be otherwise quiet.
#
# usage: benches/scripts/prefix-cache-cpu.sh [REPS=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-3}
PACE=${PACE:-target/release/pace}
OUT=${OUT:-docs/bench/prefix-cache-cpu-smollm2}
mkdir -p "$OUT"
rm -f "$OUT"/on-*.json "$OUT"/off-*.json
for r in $(seq 1 "$REPS"); do
  for mode in on off; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    flag=""; [ "$mode" = off ] && flag="--no-enable-prefix-caching"
    # fcfs: the scheduler's admission is not what this measures.
    "$PACE" serve --port "$port" --threads 2 --scheduler fcfs $flag > "$OUT/serve-$mode-$r.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
    echo "== run $r, caching $mode" >&2
    python3 benches/scripts/prefix_cache_client.py "http://127.0.0.1:$port" > "$OUT/$mode-$r.json"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
{
  echo "# Prefix caching on the CPU: SmolLM2-135M-Instruct Q4_1, 2 threads"
  echo
  echo "- command: \`benches/scripts/prefix-cache-cpu.sh $REPS\`"
  # Dirty means changes outside this report's own directory (which this run rewrites).
  echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet -- . ":(exclude)$OUT" || echo -dirty)"
  echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
  echo "- workloads: \`benches/scripts/prefix_cache_client.py\` (raw results: \`on-N.json\`, \`off-N.json\`; server logs beside them)"
  echo
  python3 benches/scripts/prefix_cache_client.py --report "$OUT"
} > "$OUT/report.md"
cat "$OUT/report.md"
