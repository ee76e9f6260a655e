#!/usr/bin/env bash
# Replicas behind a router, on paper. `pace sim` runs smooth and fcfs behind round-robin,
# least-queue, predicted-wait and least-tokens routing (routers that see the replicas exactly)
# at 4, 16 and 64 replicas of a preset (250 requests per replica and run, loads 1, 1.5 and 2x
# the fleet's saturation, seeds 1-3), one report per fleet size under OUT/PRESET-rN, and prints
# the table that docs/sim/fleet/README.md shows: benefit per request sent behind round-robin and
# each other router's paired difference from it. Then the shape of the real two-replica check
# (benches/scripts/fleet-routers-real.sh: AIPerf's ISL 256 / OSL 128, Poisson, no patience, two
# replicas, fcfs) with routers that see exactly and that poll every second, as SGLang's gateway
# did there (OUT/PRESET-r2-poll0, -poll1). Single-threaded; about 12 minutes on this machine.
#
# usage: benches/scripts/sim-fleet.sh   (PACE, PRESET, OUT, REPLICAS override the defaults)
set -euo pipefail
cd "$(dirname "$0")/../.."
PACE=${PACE:-target/release/pace}
PRESET=${PRESET:-cpu-smollm2}
OUT=${OUT:-docs/sim/fleet}
REPLICAS=${REPLICAS:-4 16 64}
for n in $REPLICAS; do
  "$PACE" sim --preset "$PRESET" --replicas "$n" --routers round-robin,least-queue,predicted-wait,least-tokens \
    --policies smooth,fcfs --num-requests $((250 * n)) --load-factors 1,1.5,2 --seeds 1,2,3 --out "$OUT/$PRESET-r$n" > /dev/null
  python3 benches/scripts/trim_plots.py "$OUT/$PRESET-r$n" 2>/dev/null || true
done
for poll in 0 1; do
  "$PACE" sim --preset "$PRESET" --replicas 2 --routers round-robin,least-queue,least-tokens --router-poll "$poll" --policies fcfs \
    --input-len 256 --output-len 128 --max-tokens-rule exact --patience none --reading-rates none --stop-fraction 0 \
    --retries none --arrivals poisson --load-factors 0.7,0.9 --num-requests 600 --seeds 1,2,3,4,5 \
    --out "$OUT/$PRESET-r2-poll$poll" > /dev/null
  python3 benches/scripts/trim_plots.py "$OUT/$PRESET-r2-poll$poll" 2>/dev/null || true
done
python3 - "$OUT" "$PRESET" $REPLICAS <<'PY'
# Per fleet size, policy and load: benefit per request sent behind round-robin (mean over the
# seeds), and each other router's difference from it on the same seeds (mean and 95% interval
# of the paired differences, Student's t).
import json, math, statistics, sys
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
out, preset, sizes = sys.argv[1], sys.argv[2], sys.argv[3:]
points = {n: json.load(open(f"{out}/{preset}-r{n}/sweep.json"))["points"] for n in sizes}
routers = list(dict.fromkeys(p["router"] for n in sizes for p in points[n]))
print("| replicas | policy | load | round-robin | " + " | ".join(f"{r} - round-robin" for r in routers[1:]) + " |")
print("|---|---|---|---|" + "---|" * (len(routers) - 1))
for n in sizes:
    pts = points[n]
    by = {(p["policy"], p["router"], round(p["load_factor"], 2)): {r["seed"]: r["eval"]["stats"]["benefit_per_request"] for r in p["runs"]} for p in pts}
    keys = sorted({(k[0], k[2]) for k in by}, key=lambda k: (k[1], k[0] != "smooth"))
    for policy, load in keys:
        base = by[(policy, "round-robin", load)]
        cells = [f"{statistics.mean(base.values()):.1f}"]
        for r in routers[1:]:
            other = by.get((policy, r, load))
            if other is None:
                cells.append("")
                continue
            d = [other[s] - base[s] for s in base if s in other]
            half = T95.get(len(d) - 1, 1.96) * statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
            cells.append(f"{statistics.mean(d):+.1f} ± {half:.1f}")
        print(f"| {n} | {policy} | {load}x | " + " | ".join(cells) + " |")
PY
