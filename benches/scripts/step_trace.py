#!/usr/bin/env python3
"""What a `pace serve --step-trace` file says about the step-cost model (scheduler/src/cost.rs).

Each line is one engine step: its shape (prefill tokens, decode sequences, KV tokens attended,
prefill attention pairs), `predicted` (what the scheduler planned with: the fitted model times
the machine's recent speed), `fitted` (the fitted model alone) and `measured` seconds. Printed:
predicted / measured for both; the best fixed model of the shape (least squares on relative
error, fitted on the first half of the steps and scored on the second), a floor for any model
that sees only the shape; the autocorrelation of the fitted model's log error (a drift in the
machine's speed, which no shape explains); what online speed corrections of the fitted model
(exponentially weighted means of several weights, medians of the last steps) reach on the same
steps; and the spread of decode-only steps of one shape.

usage: step_trace.py steps.jsonl   (needs numpy)
"""
import gzip
import json
import sys

import numpy as np


def summary(name, ratio):
    q = np.quantile(ratio, [0.05, 0.5, 0.95])
    within = np.mean((ratio > 0.9) & (ratio <= 1.1))
    print(f"{name}: {len(ratio)} steps, {100 * within:.1f}% within 10%, p05 {q[0]:.3f} p50 {q[1]:.3f} p95 {q[2]:.3f}")


def main():
    # Committed traces are gzip-compressed (steps.jsonl.gz); a fresh one is plain.
    opener = gzip.open if sys.argv[1].endswith(".gz") else open
    rows = [json.loads(line) for line in opener(sys.argv[1], "rt")]
    # The first steps run on the start-up profile alone; skip the first 5%.
    rows = rows[len(rows) // 20:]
    col = lambda k: np.array([r[k] for r in rows], float)
    P, D, K, A = col("prefill_tokens"), col("decode_seqs"), col("kv_tokens"), col("attn_pairs")
    pred, fitted, meas = col("predicted"), col("fitted"), col("measured")
    print("predicted / measured, over every step of the run:")
    summary("  planned with (fitted x recent speed)", pred / meas)
    summary("  fitted model alone", fitted / meas)
    X = np.c_[np.ones_like(P), P, D, K, A]
    half = len(rows) // 2
    w = 1 / meas
    c, *_ = np.linalg.lstsq(X[:half] * w[:half, None], np.ones(half), rcond=None)
    summary("  best fixed model of the shape (fit on the first half, scored on the second)", (X[half:] @ c) / meas[half:])
    e = np.log(meas / fitted)
    print(f"autocorrelation of ln(measured / fitted): lag 1 {np.corrcoef(e[:-1], e[1:])[0, 1]:.2f}, "
          f"lag 5 {np.corrcoef(e[:-5], e[5:])[0, 1]:.2f}, lag 50 {np.corrcoef(e[:-50], e[50:])[0, 1]:.2f}")
    # What any online speed correction of the fitted model could reach on these steps: the
    # planned prediction is fitted x exp(c), c learned from the earlier steps' log errors only.
    print("online speed corrections of the fitted model (from earlier steps only), predicted / measured:")
    for w_new in (0.1, 0.2, 0.3, 0.5, 0.7, 1.0):
        c, m = np.zeros_like(e), 0.0
        for i, x in enumerate(e):
            c[i] = m
            m = (1 - w_new) * m + w_new * x
        summary(f"  exponentially weighted mean, newest step weighs {w_new}", np.exp(c - e))
    for k in (3, 5, 9):
        c = np.array([np.median(e[max(0, i - k):i]) if i else 0.0 for i in range(len(e))])
        summary(f"  median of the last {k} steps", np.exp(c - e))
    print(f"  step-to-step noise: sd of ln(measured / fitted) {e.std():.3f}, of its step-to-step change / sqrt(2) {np.diff(e).std() / np.sqrt(2):.3f}")
    print("decode-only steps of one decode count (context varies a little), measured seconds:")
    for d in (1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 96, 128):
        m = (P == 0) & (D == d)
        if m.sum() >= 20:
            x = meas[m]
            print(f"  {d:3d} sequences: {m.sum():4d} steps, CV {x.std() / x.mean():.3f}, p05 {np.quantile(x, 0.05) * 1e3:.1f} ms, "
                  f"p50 {np.median(x) * 1e3:.1f} ms, p95 {np.quantile(x, 0.95) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
