#!/usr/bin/env bash
# Replicas behind a router, on paper: `pace sim` runs smooth and fcfs behind round-robin,
# least-queue, predicted-wait and headroom routing at 4, 16 and 64 replicas of a preset (250
# requests per replica and run, loads 1, 1.5 and 2x the fleet's saturation, seeds 1-3), one
# report per fleet size under OUT/PRESET-rN, then prints the table of benefit per request sent
# that docs/sim/fleet/README.md shows. Single-threaded; about 30 minutes for the three sizes on
# one core.
#
# usage: benches/scripts/sim-fleet.sh   (PACE, PRESET, OUT, REPLICAS override the defaults)
set -euo pipefail
cd "$(dirname "$0")/../.."
PACE=${PACE:-target/release/pace}
PRESET=${PRESET:-cpu-smollm2}
OUT=${OUT:-docs/sim/fleet}
REPLICAS=${REPLICAS:-4 16 64}
for n in $REPLICAS; do
  "$PACE" sim --preset "$PRESET" --replicas "$n" --routers round-robin,least-queue,predicted-wait,headroom \
    --policies smooth,fcfs --num-requests $((250 * n)) --load-factors 1,1.5,2 --seeds 1,2,3 --out "$OUT/$PRESET-r$n" > /dev/null
  python3 benches/scripts/trim_plots.py "$OUT/$PRESET-r$n" 2>/dev/null || true
done
python3 - "$OUT" "$PRESET" $REPLICAS <<'PY'
import json, sys
out, preset, sizes = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {}
for n in sizes:
    for line in open(f"{out}/{preset}-r{n}/summary.jsonl"):
        l = json.loads(line)
        rows.setdefault((l["policy"], round(l["load_factor"], 2)), {})[n] = (l["benefit_per_request"], l["benefit_per_request_ci95"], l["rejected_frac"])
print("| policy @ router | load | " + " | ".join(f"{n} replicas" for n in sizes) + " |")
print("|---|---|" + "---|" * len(sizes))
for (policy, load), by_n in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    cells = [f"{by_n[n][0]:.1f} ± {by_n[n][1]:.1f} ({100 * by_n[n][2]:.0f}% refused)" if n in by_n else "" for n in sizes]
    print(f"| {policy} | {load}x | " + " | ".join(cells) + " |")
PY
