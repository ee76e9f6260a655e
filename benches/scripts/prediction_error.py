#!/usr/bin/env python3
"""The scheduler's prediction quality from two scrapes of pace's /metrics.

usage: prediction_error.py BEFORE.prom AFTER.prom

Prints one JSON object: for `pace_step_time_prediction_error_ratio` (predicted over measured step
time), `pace_output_length_prediction_error_ratio` (expected over actual output length) and
`pace_queue_wait_prediction_error_ratio` (smooth's door: predicted over actual wait for a place,
present only where requests waited for one), the
observations between the scrapes, the share within 10% (ratio in [0.9, 1.1], both bucket bounds),
the 5th, 50th and 95th percentiles of the ratio (linear inside a bucket, as Prometheus'
histogram_quantile does), and the bucket counts themselves.
"""
import json
import re
import sys

METRICS = ["pace_step_time_prediction_error_ratio", "pace_output_length_prediction_error_ratio",
           "pace_queue_wait_prediction_error_ratio"]
LINE = re.compile(r'^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def parse(path):
    """{(metric, le or None for count/sum): value}"""
    out = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            name, labels, value = m["name"], m["labels"] or "", float(m["value"])
            for metric in METRICS:
                if name == metric + "_bucket":
                    le = re.search(r'le="([^"]+)"', labels).group(1)
                    out[(metric, float(le))] = value
                elif name == metric + "_count":
                    out[(metric, "count")] = value
    return out


def quantile(q, buckets, count):
    """histogram_quantile: linear interpolation inside the bucket that holds rank q * count."""
    if count <= 0:
        return None
    rank = q * count
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def summarise(before, after, metric):
    les = sorted(le for (m, le) in after if m == metric and le != "count")
    buckets = [(le, after[(metric, le)] - before.get((metric, le), 0.0)) for le in les]
    count = after.get((metric, "count"), 0.0) - before.get((metric, "count"), 0.0)
    cum = dict(buckets)
    # Share in [0.9, 1.1]: cumulative to 1.1 less cumulative below 0.9 (the bucket le=0.9
    # includes 0.9 itself, so this is (0.9, 1.1]; the difference is one float value).
    within = (cum.get(1.1, 0.0) - cum.get(0.9, 0.0)) / count if count > 0 else None
    return {
        "observations": count,
        "within_10pct": within,
        "p05": quantile(0.05, buckets, count),
        "p50": quantile(0.5, buckets, count),
        "p95": quantile(0.95, buckets, count),
        "buckets": [{"le": "+Inf" if le == float("inf") else le, "count": c} for le, c in buckets],
    }


def main():
    before, after = parse(sys.argv[1]), parse(sys.argv[2])
    print(json.dumps({m: summarise(before, after, m) for m in METRICS}, indent=1))


if __name__ == "__main__":
    main()
