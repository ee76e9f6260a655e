#!/usr/bin/env python3
"""The table of an open-loop A/B made by ab-aiperf-open.sh: per load and policy, what
`pace bench score --json` says, smooth over fcfs, and each policy's benefit per request sent as a fraction
of the ceiling min(offered output tok/s, Theta) per request sent, Theta the most output tok/s any run delivered
at the two highest loads (the saturated engine, as evaluation.md measures it on a real server).

usage: open_loop_table.py PACE_BINARY RUN_DIR OUTPUT_LEN
"""
import glob
import json
import os
import subprocess
import sys


def main():
    pace, root, osl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rows = []
    for d in sorted(glob.glob(os.path.join(root, "repeat-*", "load-*x"))):
        repeat = d.split(os.sep)[-2]
        factor = float(d.split(os.sep)[-1][len("load-"):-1])
        found = []
        for policy in ("fcfs", "smooth"):
            out = subprocess.run([pace, "bench", "score", "--json", os.path.join(d, policy)], capture_output=True, text=True)
            if out.returncode == 0:
                found.append((repeat, factor, policy, json.loads(out.stdout)[0]))
        if len(found) == 2:  # a load still running has one policy or none
            rows.extend(found)
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    top = sorted({f for _, f, _, _ in rows})[-2:]
    theta = max(s["output_throughput"] for _, f, _, s in rows if f in top)
    print(f"Theta (most output tok/s delivered at {top[0]}x-{top[-1]}x): {theta:.1f} tok/s\n")
    print("| repeat | load | rate (req/s) | policy | sent | served | refused | benefit per request sent | smooth goodput (/s) | of ceiling | output tok/s | idle p50 / p99 (s) | smooth / fcfs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    by = {(r, f, p): s for r, f, p, s in rows}
    for r, f, p, s in rows:
        rate = s["level"]["value"]
        # The ceiling per request sent: each answer whole and on time while the engine keeps up
        # (offered <= Theta), a Theta / offered share of that past it.
        ceiling = osl * min(1.0, theta / (rate * osl))
        ratio = ""
        if p == "smooth":
            b = by[(r, f, "fcfs")]["benefit_per_request_sent"]
            ratio = f"{s['benefit_per_request_sent'] / b:.2f}x" if b > 0 else ("ahead (fcfs <= 0)" if s["benefit_per_request_sent"] > b else "behind")
        print(
            f"| {r} | {f:g}x | {rate:g} | {p} | {s['sent']} | {s['served']} | {s['refused']} | "
            f"{s['benefit_per_request_sent']:.1f} ± {s['benefit_per_request_sent_ci95']:.1f} | {s['smooth_goodput']:.1f} | "
            f"{100 * s['benefit_per_request_sent'] / ceiling:.1f}% | {s['output_throughput']:.1f} | "
            f"{s['idle_all']['p50']:.2f} / {s['idle_all']['p99']:.2f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
