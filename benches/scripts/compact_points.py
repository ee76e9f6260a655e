#!/usr/bin/env python3
"""Shrinks a report's points to what its numbers rest on, so long runs fit the repository.

`pace bench` writes every request it sent into `points/*.json.gz`, with vLLM's per-request arrays
(`itls`, `ttfts`, `input_lens`, `output_lens`, `errors`) beside per-request timelines that hold
the same times. A run that keeps arrivals on until its last counted answer ends sends two to
three times more requests than it counts. This keeps every summary field and the timelines of
the *counted* requests only, with times rounded to 0.1 ms, and drops the five arrays (each is a
function of the timelines). Every number in the report but Theta (the tokens delivered to any
request inside the window: `delivered_tps`, kept) can be recomputed from what is left.

The counted requests are a contiguous run of indices (those scheduled inside the window). The
file does not name it, so it is found as a block of `counted` requests whose outcomes and output
tokens match the summary's counts (`completed`, `rejected`, `dropped`, `aborted`, `abandoned`,
`failed`, `total_output_tokens`). Every target of one load (`TARGET-LOAD.json.gz`) counts the same requests, so where
the counts allow several blocks (a run of refusals at the edge), the block the other targets pin
down is taken, else the one starting nearest the window start given in seconds; no match, or
targets of one load that disagree, is an error and the files are left alone. The result is written as
`NAME.counted.json.gz` beside the original, which is removed.

usage: compact_points.py WINDOW_START_S POINTS_DIR...
"""
import gzip
import json
import os
import sys

DROP = ("itls", "ttfts", "input_lens", "output_lens", "errors")
OUTCOMES = {"Completed": "completed", "Rejected": "rejected", "Dropped": "dropped", "Aborted": "aborted", "Abandoned": "abandoned", "Failed": "failed"}


def outcome_key(o):
    name = o if isinstance(o, str) else next(iter(o))
    return OUTCOMES.get(name, name.lower())


def matches(block, d):
    counts = {k: 0 for k in OUTCOMES.values()}
    tokens = 0
    for t in block:
        counts[outcome_key(t["record"]["outcome"])] += 1
        tokens += len(t["record"]["token_times"])
    return tokens == d["total_output_tokens"] and all(counts[k] == d[k] for k in OUTCOMES.values())


def rounded(t):
    r = t["record"]
    r["token_times"] = [round(x, 4) for x in r["token_times"]]
    for k in ("arrival", "end"):
        if isinstance(r.get(k), float):
            r[k] = round(r[k], 4)
    t["scheduled"] = round(t["scheduled"], 4)
    return t


def candidates(path):
    d = json.load(gzip.open(path, "rt"))
    tl = sorted(d["timelines"], key=lambda t: t["index"])
    n = d["counted"] - d.get("counted_not_sent", 0)
    found = [i for i in range(len(tl) - n + 1) if tl[i + n - 1]["index"] - tl[i]["index"] == n - 1 and matches(tl[i:i + n], d)]
    if not found:
        raise SystemExit(f"{path}: no block of {n} requests matches the summary; left alone")
    return d, tl, n, found


def compact(path, window_start, first_index=None):
    d, tl, n, found = candidates(path)
    # Every target of one report counts the same requests (the same seeded schedule): where the
    # counts allow several blocks, the one the other targets' files pin down; else the block
    # that starts nearest the window.
    pinned = [i for i in found if tl[i]["index"] == first_index]
    lo = pinned[0] if pinned else min(found, key=lambda i: abs(tl[i]["scheduled"] - window_start))
    for k in DROP:
        d.pop(k, None)
    d["timelines"] = [rounded(t) for t in tl[lo:lo + n]]
    d["compacted"] = (f"benches/scripts/compact_points.py: the {n} counted requests' timelines (indices {tl[lo]['index']}.."
                      f"{tl[lo + n - 1]['index']}) of the {len(tl)} sent, times rounded to 0.1 ms; {', '.join(DROP)} dropped")
    out = path[: -len(".json.gz")] + ".counted.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(d, f, separators=(",", ":"))
    os.remove(path)
    print(f"{path}: {os.path.getsize(out) / 1e3:.0f} kB, requests {tl[lo]['index']}..{tl[lo + n - 1]['index']} ({len(found)} matching blocks)")


def main():
    window_start = float(sys.argv[1])
    for directory in sys.argv[2:]:
        paths = [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n.endswith(".json.gz") and not n.endswith(".counted.json.gz")]
        # Points are TARGET-LOAD.json.gz; the targets of one load share its schedule, each load
        # has its own (its counted block starts elsewhere).
        loads = {}
        for p in paths:
            loads.setdefault(os.path.basename(p)[: -len(".json.gz")].rsplit("-", 1)[-1], []).append(p)
        for load, group in sorted(loads.items()):
            firsts = set()
            for p in group:
                _, tl, _, found = candidates(p)
                if len(found) == 1:
                    firsts.add(tl[found[0]]["index"])
            if len(firsts) > 1:
                raise SystemExit(f"{directory}: at load {load} the targets' counted requests start at different indices {sorted(firsts)}; left alone")
            for p in group:
                compact(p, window_start, next(iter(firsts), None))


if __name__ == "__main__":
    main()
