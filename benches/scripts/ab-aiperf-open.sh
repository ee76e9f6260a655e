#!/usr/bin/env bash
# Open-loop A/B of fcfs and smooth driven by NVIDIA AIPerf (Poisson arrivals), each load its
# own invocation: a fresh server per policy and load, its own prompts (seed), and its own
# request count so that every load sends for about DURATION seconds.
#
#   [POLICIES=A,B] benches/scripts/ab-aiperf-open.sh OUT_DIR [CAPACITY_REQ_S] [DURATION_S] [FACTORS] [REPEAT]
#
# CAPACITY_REQ_S is the server's saturated request rate on this request shape (ISL 256 / OSL
# 128, ignore_eos); FACTORS the loads as multiples of it. POLICIES names the two policies
# (default fcfs,smooth; an ablation names e.g. smooth,smooth:door=0); their order alternates
# from load to load (and from repeat to repeat). Servers write their step traces to
# OUT_DIR/steps.jsonl (the simulator's replayed step times are fitted from such traces).
set -euo pipefail
out=${1:?OUT_DIR}
cap=${2:-1.37}
dur=${3:-300}
factors=${4:-0.5 1 1.5 2}
repeat=${5:-1}
pace=${PACE:-target/release/pace}
venv=${VENV:-target/clients-venv}
policies=${POLICIES:-fcfs,smooth}
a=${policies%%,*}
b=${policies#*,}
mkdir -p "$out"
i=0
for f in $factors; do
  rate=$(python3 -c "print(round($f * $cap, 3))")
  n=$(python3 -c "import math; print(math.ceil($f * $cap * $dur))")
  if (( (i + repeat) % 2 == 0 )); then order=$a,$b; else order=$b,$a; fi
  seed=$((100 * repeat + i))
  echo "== load ${f}x: $rate req/s, $n requests, seed $seed, order $order"
  PATH="$PWD/$venv/bin:$PATH" "$pace" bench ab --client aiperf --client-bin "$venv/bin/aiperf" \
    --scheduler "$order" --request-rates "$rate" --num-prompts "$n" \
    --random-input-len 256 --random-output-len 128 --seed "$seed" --repeats 1 \
    --time-limit 1800 "--serve-arg=--step-trace=$out/steps.jsonl" \
    --result-dir "$out/repeat-$repeat/load-${f}x"
  i=$((i + 1))
done
