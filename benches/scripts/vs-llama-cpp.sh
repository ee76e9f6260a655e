#!/usr/bin/env bash
# pace against llama.cpp on the same model and machine, side by side in one run (issue: engine
# benchmarks). Prints one Markdown table with the ratio pace / llama.cpp for:
#   prefill tok/s of a 512-token prompt      (llama-bench pp512   vs pace engine-bench)
#   decode tok/s of one stream, 128 tokens    (llama-bench tg128   vs pace engine-bench)
#   aggregate decode at N concurrent streams with 512-token contexts
#                                             (llama-server -np N  vs pace engine-bench)
#   peak RSS of each process.
# Each figure is the median of REPS runs. Needs llama.cpp built by tools/build-llama-cpp.sh (or
# tools/build-llama-cpp.sh) into LLAMA_DIR (default /tmp/llama-cpp), and a release
# build of pace (cargo build --release). The machine should be otherwise quiet: llama.cpp's
# thread pool busy-polls and collapses when another process shares the cores.
#
# usage: benches/scripts/vs-llama-cpp.sh [THREADS=2] [REPS=3]
# Writes report.md (provenance and the table) and every raw output into OUT (default
# docs/bench/vs-llama-cpp-cpu-smollm2, the committed report the README cites).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${1:-2}
REPS=${2:-3}
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama-cpp}
PACE=${PACE:-target/release/pace}
MODEL=${MODEL:-${PACE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pace}/SmolLM2-135M-Instruct.Q4_1.gguf}
CONC=${CONC:-4,16,64}
OUT=${OUT:-docs/bench/vs-llama-cpp-cpu-smollm2}
mkdir -p "$OUT"
[ -x "$LLAMA_DIR/bin/llama-bench" ] || { echo "build llama.cpp first (tools/build-llama-cpp.sh $LLAMA_DIR)" >&2; exit 1; }
[ -f "$MODEL" ] || "$PACE" generate --prompt hi --max-tokens 1 >/dev/null 2>&1 || true
median() { python3 -c 'import sys,statistics; v=[float(x) for x in sys.argv[1:]]; print(statistics.median(v))' "$@"; }

echo "== llama-bench (pp512, tg128) x $REPS" >&2
"$LLAMA_DIR/bin/llama-bench" -m "$MODEL" -p 512 -n 128 -t "$THREADS" -r "$REPS" -o json > "$OUT/llama-bench.json"
L_PP=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([r["avg_ts"] for r in d if r["n_prompt"]==512][0])' "$OUT/llama-bench.json")
L_TG=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([r["avg_ts"] for r in d if r["n_gen"]==128][0])' "$OUT/llama-bench.json")

declare -A L_AGG L_RSS
for n in ${CONC//,/ }; do
  echo "== llama-server -np $n" >&2
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$LLAMA_DIR/bin/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" -np "$n" -c $((n * (512 + (n * 4 > 64 ? n * 4 : 64) + 64))) -t "$THREADS" --no-webui \
    > "$OUT/llama-server-$n.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  vals=()
  for r in $(seq 1 "$REPS"); do
    gen=$(( n * 4 > 64 ? n * 4 : 64 ))  # as pace engine-bench: the first streams still decode when the last starts
    vals+=("$(python3 benches/scripts/llama_server_decode.py "http://127.0.0.1:$port" "$n" 512 "$gen" "$r$n" | python3 -c 'import json,sys; print(json.load(sys.stdin)["aggregate_decode_tok_s"])')")
  done
  L_AGG[$n]=$(median "${vals[@]}")
  L_RSS[$n]=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  kill "$pid"; wait "$pid" 2>/dev/null || true
done

echo "== pace engine-bench x $REPS" >&2
# pace's KV cache holds what llama-server's context holds at the largest -np (no preemption).
n_max=0; for n in ${CONC//,/ }; do [ "$n" -gt "$n_max" ] && n_max=$n; done
KV_BLOCKS=$(( (n_max * (512 + (n_max * 4 > 64 ? n_max * 4 : 64) + 64) + 15) / 16 + 1 ))
P_PP=(); P_TG=(); declare -A P_AGG_V; P_RSS=0
for r in $(seq 1 "$REPS"); do
  "$PACE" engine-bench --threads "$THREADS" --reps 3 --concurrency "$CONC" --kv-cache-blocks "$KV_BLOCKS" --json > "$OUT/pace-$r.json" 2>"$OUT/pace-$r.log"
  P_PP+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill_tok_s"])' "$OUT/pace-$r.json")")
  P_TG+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["decode_tok_s"])' "$OUT/pace-$r.json")")
  for n in ${CONC//,/ }; do
    P_AGG_V[$n]="${P_AGG_V[$n]:-} $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["aggregate_decode_tok_s"][sys.argv[2]])' "$OUT/pace-$r.json" "$n")"
  done
  rss=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"]//1024)' "$OUT/pace-$r.json")
  [ "$rss" -gt "$P_RSS" ] && P_RSS=$rss
done
pp=$(median "${P_PP[@]}"); tg=$(median "${P_TG[@]}")
ratio() { python3 -c 'import sys; print(f"{float(sys.argv[1])/float(sys.argv[2]):.2f}x")' "$1" "$2"; }
table() {
echo "| test ($THREADS threads, median of $REPS) | llama.cpp | pace | pace / llama.cpp |"
echo "|---|---|---|---|"
printf '| prefill tok/s, 512-token prompt | %.1f | %.1f | %s |\n' "$L_PP" "$pp" "$(ratio "$pp" "$L_PP")"
printf '| decode tok/s, one stream | %.1f | %.1f | %s |\n' "$L_TG" "$tg" "$(ratio "$tg" "$L_TG")"
for n in ${CONC//,/ }; do
  a=$(median ${P_AGG_V[$n]})
  printf '| aggregate decode tok/s, %s streams x 512 context (llama-server -np %s) | %.1f | %.1f | %s |\n' "$n" "$n" "${L_AGG[$n]}" "$a" "$(ratio "$a" "${L_AGG[$n]}")"
done
max_l=0; for n in ${CONC//,/ }; do [ "${L_RSS[$n]}" -gt "$max_l" ] && max_l=${L_RSS[$n]}; done
printf '| peak RSS (llama-server at the largest -np; pace engine-bench with a KV cache of the same tokens) | %d MiB | %d MiB | |\n' $((max_l / 1024)) $((P_RSS / 1024))
}
{
  echo "# pace against llama.cpp on the default model"
  echo
  echo "- Command: \`benches/scripts/vs-llama-cpp.sh $THREADS $REPS\`"
  echo "- Commit: \`$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo -dirty)\`"
  echo "- Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) logical cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "- llama.cpp: $("$LLAMA_DIR/bin/llama-bench" --version 2>&1 | head -1 || echo unknown)"
  echo "- Model: $(basename "$MODEL")"
  echo "- Date (UTC): $(date -u +%Y-%m-%dT%H:%M)"
  echo
  table
  echo
  echo "Raw outputs beside this file: llama-bench.json, llama-server-N.log, pace-R.json and pace-R.log."
} | tee "$OUT/report.md"
