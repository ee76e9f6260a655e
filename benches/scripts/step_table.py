#!/usr/bin/env python3
"""A replay table for the simulator (scheduler/src/sim/replay.rs) from `pace serve --step-trace`
files: every step's shape and measured time, binned as the simulator bins them (prefill tokens,
decode sequences, KV tokens: 0, then powers of two), at most PER_BIN steps per bin drawn with a
fixed seed, so the table stays small and a bin's spread is kept.

usage: step_table.py SOURCE_TEXT OUT.json TRACE.jsonl [TRACE.jsonl ...]   (standard library only)
"""
import gzip
import json
import random
import sys

PER_BIN = 48
BINS = (12, 11, 20)  # prefill, decode, kv: as replay.rs


def bin_of(x, bins):
    return 0 if x == 0 else min(x.bit_length(), bins - 1)


def main():
    source, out, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    by_bin = {}
    total = 0
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            for line in f:
                s = json.loads(line)
                p, d, kv, pairs, t = s["prefill_tokens"], s["decode_seqs"], s["kv_tokens"], s["attn_pairs"], s["measured"]
                if t <= 0 or p + d == 0:
                    continue
                total += 1
                key = (bin_of(p, BINS[0]), bin_of(d, BINS[1]), bin_of(kv, BINS[2]))
                by_bin.setdefault(key, []).append([p, d, kv, round(pairs), round(t, 6)])
    rng = random.Random(42)
    steps = []
    for key in sorted(by_bin):
        v = by_bin[key]
        steps.extend(v if len(v) <= PER_BIN else rng.sample(v, PER_BIN))
    with open(out, "w") as f:
        f.write('{"source":%s,"steps":[\n' % json.dumps(f"{source}; {len(steps)} of {total} steps, at most {PER_BIN} per bin of {len(by_bin)}"))
        f.write(",\n".join(json.dumps(s, separators=(",", ":")) for s in steps))
        f.write("\n]}\n")
    print(f"{out}: {len(steps)} of {total} steps in {len(by_bin)} bins")


if __name__ == "__main__":
    main()
