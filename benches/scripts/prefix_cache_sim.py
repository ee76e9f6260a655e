#!/usr/bin/env python3
"""The report of benches/scripts/prefix-cache-sim.sh: pace sim's cache-on and cache-off sweeps,
paired by seed (the same requests), as ratios of smooth goodput with a 95% interval."""
import argparse
import json
import math
import statistics
from pathlib import Path

# Student's t, two-sided 95%, by degrees of freedom (slo.rs uses the same table).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def mean_ci(xs):
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))


def runs(sweep, policy):
    """{rate: {seed: eval}} of one policy."""
    out = {}
    for p in sweep["points"]:
        if p["policy"] == policy:
            out[round(p["rate"], 6)] = {r["seed"]: r for r in p["runs"]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--command", required=True)
    ap.add_argument("--saturation", nargs=2, type=float, metavar=("ON", "OFF"), required=True)
    a = ap.parse_args()
    on = json.loads((a.out / "cache-on" / "sweep.json").read_text())
    off = json.loads((a.out / "cache-off" / "sweep.json").read_text())
    prov = on["provenance"]
    sat_on, sat_off = a.saturation
    rows, data = [], []
    for policy in ("smooth", "fcfs"):
        r_on, r_off = runs(on, policy), runs(off, policy)
        for rate in sorted(r_on):
            seeds = sorted(set(r_on[rate]) & set(r_off.get(rate, {})))
            g_on = [r_on[rate][s]["eval"]["stats"]["smooth_goodput"] for s in seeds]
            g_off = [r_off[rate][s]["eval"]["stats"]["smooth_goodput"] for s in seeds]
            ratios = [x / y if y > 0 else float("inf") for x, y in zip(g_on, g_off)]
            hit = statistics.fmean(r_on[rate][s]["eval"]["prefix_cache_hit_frac"] for s in seeds)
            prompt = statistics.fmean(r_on[rate][s]["eval"]["mean_prompt_len"] for s in seeds)
            cf_on = mean_ci([r_on[rate][s]["ceiling_fraction"] for s in seeds])
            cf_off = mean_ci([r_off[rate][s]["ceiling_fraction"] for s in seeds])
            finite = [x for x in ratios if math.isfinite(x)]
            ratio = mean_ci(finite) if len(finite) == len(ratios) else (float("inf"), float("nan"))
            d = {
                "policy": policy, "rate": rate, "load_on": rate / sat_on, "load_off": rate / sat_off, "seeds": seeds,
                "smooth_goodput_on": mean_ci(g_on), "smooth_goodput_off": mean_ci(g_off),
                "ceiling_fraction_on": cf_on, "ceiling_fraction_off": cf_off,
                "ratio_per_seed": ratios, "ratio": ratio, "prefix_cache_hit_frac": hit, "mean_prompt_len": prompt,
            }
            data.append(d)
            rows.append(
                f"| {policy} | {rate:.3g} | {rate / sat_off:.2f}x / {rate / sat_on:.2f}x | {prompt:.0f} | {100 * hit:.1f}% "
                f"| {d['smooth_goodput_off'][0]:.1f} ± {d['smooth_goodput_off'][1]:.1f} ({100 * cf_off[0]:.0f}%) "
                f"| {d['smooth_goodput_on'][0]:.1f} ± {d['smooth_goodput_on'][1]:.1f} ({100 * cf_on[0]:.0f}%) "
                + (f"| **{ratio[0]:.2f}x** ± {ratio[1]:.2f} |" if math.isfinite(ratio[0]) else "| (off: no positive goodput) |")
            )
    (a.out / "ab.json").write_text(json.dumps({"command": a.command, "provenance": prov, "saturation": {"on": sat_on, "off": sat_off}, "points": data}, indent=1))
    cfg = on["config"]
    preset = json.loads((a.out / "cache-on" / "summary.jsonl").read_text().splitlines()[0])["preset"]
    md = [
        f"# Prefix caching in the simulator: {preset}",
        "",
        f"- command: `{a.command}`",
        f"- commit: {prov.get('commit')}; machine: {prov.get('machine')}; {prov.get('date')}",
        f"- {cfg['num_kv_blocks']} KV blocks of {cfg['block_size']} tokens, {cfg['max_batch_tokens']} tokens and {cfg['max_num_seqs']} sequences a step",
        f"- the two arms' own reports: [caching on](cache-on/report.md), [caching off](cache-off/report.md); paired ratios: `ab.json`",
        "",
        "The workload: every prompt starts with the same system prompt; requests are turns of conversations, each turn "
        "re-sending the system prompt, the earlier questions and answers (as served) and a new question of the preset's "
        "prompt length (`scheduler/src/sim/workload.rs`, `Sharing`). Both arms serve the same requests (same seeds); the "
        "only difference is the scheduler's `enable_prefix_caching`. The step cost model charges only the tokens fed, so a "
        "cached prefix costs nothing to prefill but its keys are still attended.",
        "",
        f"Saturation (fcfs, estimated per arm): **{sat_off:.3g} req/s without caching, {sat_on:.3g} req/s with it** "
        f"({sat_on / sat_off:.2f}x the capacity).",
        "",
        "| policy | offered req/s | load (of no-cache / cached saturation) | mean prompt | prompt tokens cached | smooth goodput, caching off (of ceiling) | caching on (of ceiling) | on / off, paired by seed |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Smooth goodput in output tokens per second of the window, mean over seeds ± the 95% half-width; the ratio is the "
        "mean of the per-seed ratios with its 95% half-width. A negative smooth goodput means the late tokens' penalties "
        "outweighed the on-time tokens (docs/metrics.md); a ratio to it means nothing, so none is given.",
        "",
    ]
    (a.out / "report.md").write_text("\n".join(md))


if __name__ == "__main__":
    main()
