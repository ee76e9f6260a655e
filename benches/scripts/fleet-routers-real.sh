#!/usr/bin/env bash
# Two pace replicas behind SGLang's gateway (`smg`, pip package sglang-router), round_robin
# against power_of_two (which reads each replica's /get_load, polled every second here), driven
# by NVIDIA AIPerf (Poisson arrivals, ISL 256 / OSL 128, ignore_eos) and scored by
# `pace bench score`: the real-server check of the simulator's fleet report
# (docs/sim/fleet/README.md). Each run starts fresh replicas (1 kernel thread each, fcfs) and a
# fresh gateway; the two policies alternate their order from repeat to repeat, and every
# repeat has its own prompts (seed). Two replicas on two cores prove the routing, not speed.
#
#   benches/scripts/fleet-routers-real.sh OUT_DIR [RATE_REQ_S=1.0] [NUM=120] [REPEATS=2]
set -euo pipefail
out=${1:?OUT_DIR}
rate=${2:-1.0}
num=${3:-120}
repeats=${4:-2}
pace=${PACE:-target/release/pace}
venv=${VENV:-target/clients-venv}
smg=${SMG:-target/router-venv/bin/smg}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ok() { for _ in $(seq 1 240); do curl -sf "$1" >/dev/null && return 0; sleep 0.5; done; echo "no answer from $1" >&2; return 1; }
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop EXIT
mkdir -p "$out"
for r in $(seq 1 "$repeats"); do
  if (( r % 2 == 1 )); then order="round_robin power_of_two"; else order="power_of_two round_robin"; fi
  for policy in $order; do
    urls=()
    for k in 1 2; do
      p=$(free_port)
      "$pace" serve --port "$p" --threads 1 --scheduler fcfs > "$out/serve-$r-$policy-$k.log" 2>&1 &
      pids+=($!)
      urls+=("http://127.0.0.1:$p")
    done
    for u in "${urls[@]}"; do wait_ok "$u/health"; done
    gw=$(free_port)
    "$smg" launch --host 127.0.0.1 --port "$gw" --prometheus-port "$(free_port)" --worker-urls "${urls[@]}" \
      --policy "$policy" --worker-startup-check-interval 1 > "$out/smg-$r-$policy.log" 2>&1 &
    pids+=($!)
    wait_ok "http://127.0.0.1:$gw/v1/models"
    echo "== repeat $r, $policy: $rate req/s, $num requests, seed $((300 + r))"
    PATH="$PWD/$venv/bin:$PATH" "$pace" bench ab --client aiperf --client-bin "$venv/bin/aiperf" \
      --base-urls "http://127.0.0.1:$gw" --labels "$policy" --request-rates "$rate" --num-prompts "$num" \
      --random-input-len 256 --random-output-len 128 --seed "$((300 + r))" --repeats 1 --time-limit 900 \
      --result-dir "$out/repeat-$r/$policy"
    stop
  done
done
