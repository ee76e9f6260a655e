#!/usr/bin/env bash
# Prefix caching in the simulator, A/B: the same prefix-sharing workload (a shared system prompt,
# conversations whose every turn re-sends the history) under `pace sim` with caching on and off,
# at the same offered rates: half and all of the no-cache arm's saturation, all and 1.5x of the
# cached arm's. Same seeds in both arms, so each seed's two runs serve the same requests and
# the ratio of their smooth goodputs is paired. Writes OUT/cache-on, OUT/cache-off (pace sim's
# own reports) and OUT/report.md, OUT/ab.json (the paired ratios).
#
# usage: benches/scripts/prefix-cache-sim.sh [PRESET=cpu-smollm2] [NUM_REQUESTS=10000]
set -euo pipefail
cd "$(dirname "$0")/../.."
PRESET=${1:-cpu-smollm2}
NUM=${2:-10000}
PACE=${PACE:-target/release/pace}
OUT=${OUT:-docs/sim/$PRESET/prefix-cache}
SYSTEM=${SYSTEM:-1000}
TURNS=${TURNS:-10}
THINK=${THINK:-10}
SEEDS=${SEEDS:-1,2,3,4,5}
W=(--preset "$PRESET" --system-prompt "$SYSTEM" --turns "$TURNS" --think-time "$THINK")
sat() {
  "$PACE" sim "${W[@]}" --policies fcfs --load-factors 1 --seed "${SEEDS%%,*}" --num-requests 200 --json "$@" \
    | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["saturation_rate"])'
}
on=$(sat --enable-prefix-caching true)
off=$(sat --enable-prefix-caching false)
rates=$(python3 -c "print(','.join(f'{x:.4g}' for x in sorted({0.5*$off, $off, $on, 1.5*$on})))")
echo "saturation: caching on $on req/s, off $off req/s; rates $rates" >&2
mkdir -p "$OUT"
for arm in on off; do
  flag=true; [ "$arm" = off ] && flag=false
  "$PACE" sim "${W[@]}" --policies smooth,fcfs --rates "$rates" --seeds "$SEEDS" --num-requests "$NUM" \
    --enable-prefix-caching "$flag" --out "$OUT/cache-$arm" > "$OUT/cache-$arm.txt"
done
python3 benches/scripts/prefix_cache_sim.py "$OUT" \
  --command "benches/scripts/prefix-cache-sim.sh $PRESET $NUM (SYSTEM=$SYSTEM TURNS=$TURNS THINK=$THINK SEEDS=$SEEDS)" \
  --saturation "$on" "$off"
cat "$OUT/report.md"
