#!/usr/bin/env python3
"""Client side of benches/scripts/structured-cpu.sh: the cost of constrained decoding.

Each round runs two arms back to back against one pace server, with the same prompts, seeds
and output length:
  plain:       N concurrent chat requests, ignore_eos, max_tokens L (free text);
  constrained: the same requests under a JSON schema that cannot finish within L tokens (an
               array of at least 200 records), so every request also runs exactly L tokens and
               every one of them is masked.
Decode throughput = completion tokens / wall time of the arm. Mask work comes from /metrics
(pace_structured_output_masks_total, pace_structured_output_mask_microseconds_total).

Prints one JSON object. With --report DIR it reads DIR/run.json and prints Markdown.
Standard library only.
"""

import json
import statistics
import sys
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 100000},
                    "name": {"type": "string", "maxLength": 16},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                },
                "required": ["id", "name", "role", "tags"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["records"],
    "additionalProperties": False,
}


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1200) as r:
        return json.loads(r.read())


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def arm(base, n, length, constrained, round_):
    bodies = []
    for i in range(n):
        b = {
            "messages": [{"role": "user", "content": f"List the users of team {i} as JSON records with id, name, role and tags."}],
            "max_tokens": length,
            "temperature": 0.7,
            "seed": 1000 * round_ + i,
        }
        if constrained:
            b["response_format"] = {"type": "json_schema", "json_schema": {"name": "users", "schema": SCHEMA}}
        else:
            b["ignore_eos"] = True
        bodies.append(b)
    out = [None] * n
    m0 = (metric(base, "pace_structured_output_masks_total"), metric(base, "pace_structured_output_mask_microseconds_total"))

    def one(i):
        out[i] = post(base, "/v1/chat/completions", bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    m1 = (metric(base, "pace_structured_output_masks_total"), metric(base, "pace_structured_output_mask_microseconds_total"))
    tokens = sum(v["usage"]["completion_tokens"] for v in out)
    sample = out[0]["choices"][0]["message"]["content"][:160]
    return {
        "streams": n,
        "length": length,
        "constrained": constrained,
        "wall_s": wall,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "masks": m1[0] - m0[0],
        "mask_us": m1[1] - m0[1],
        "finish": sorted({v["choices"][0]["finish_reason"] for v in out}),
        "sample": sample,
    }


def run(base, rounds, configs):
    post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4})
    results = []
    for r in range(rounds):
        for n, length in configs:
            for constrained in (False, True):
                time.sleep(1.0)  # an idle gap: the step trace splits into arms at gaps
                res = arm(base, n, length, constrained, r)
                res["round"] = r
                results.append(res)
                print(f"round {r} streams {n} {'constrained' if constrained else 'plain'}: {res['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    return {"rounds": rounds, "configs": configs, "schema": SCHEMA, "results": results}


def report(d):
    data = json.load(open(f"{d}/run.json"))
    res = data["results"]
    print("| streams | tokens each | plain tok/s (median) | constrained tok/s (median) | constrained / plain, per round: median [min, max] | mask CPU per token (median of rounds) | masks per constrained token |")
    print("|---|---|---|---|---|---|---|")
    for n, length in data["configs"]:
        plain = [r for r in res if r["streams"] == n and r["length"] == length and not r["constrained"]]
        cons = [r for r in res if r["streams"] == n and r["length"] == length and r["constrained"]]
        ratios = [c["tokens_per_s"] / p["tokens_per_s"] for p, c in zip(plain, cons)]
        per_tok = [c["mask_us"] / c["masks"] for c in cons if c["masks"]]
        masks_per_tok = statistics.median(c["masks"] / c["completion_tokens"] for c in cons)
        print(
            f"| {n} | {length} | {statistics.median(p['tokens_per_s'] for p in plain):.1f} | {statistics.median(c['tokens_per_s'] for c in cons):.1f} "
            f"| {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] | {statistics.median(per_tok):.0f} µs | {masks_per_tok:.2f} |"
        )
    trace = f"{d}/steps.jsonl"
    try:
        steps = [json.loads(line) for line in open(trace)]
    except OSError:
        steps = []
    if steps:
        # Arms are separated by idle gaps of a second; the first block is the warm-up request.
        blocks, cur = [], [steps[0]]
        for a, b in zip(steps, steps[1:]):
            if b["t"] - a["t"] > 0.5:
                blocks.append(cur)
                cur = []
            cur.append(b)
        blocks.append(cur)
        # Leading blocks are the warm-up.
        blocks = blocks[max(0, len(blocks) - len(res)):]
        if len(blocks) == len(res):
            print()
            print("The step-cost model's error per arm (predicted / measured step time, every step of the arm; from `steps.jsonl`, `pace serve --step-trace`):")
            print()
            print("| streams | arm | steps | median | p05 | p95 |")
            print("|---|---|---|---|---|---|")
            for n, length in data["configs"]:
                for constrained in (False, True):
                    ratios = sorted(s["predicted"] / s["measured"] for r, b in zip(res, blocks) if r["streams"] == n and r["constrained"] == constrained for s in b if s["measured"] > 0)
                    q = lambda p: ratios[min(len(ratios) - 1, int(p * len(ratios)))]
                    print(f"| {n} | {'constrained' if constrained else 'plain'} | {len(ratios)} | {q(0.5):.3f} | {q(0.05):.3f} | {q(0.95):.3f} |")
        else:
            print(f"\n(step trace: {len(blocks)} blocks for {len(res)} arms; not split)")
    print()
    cons = [r for r in res if r["constrained"]]
    print(f"Finish reasons of the constrained requests: {sorted({f for r in cons for f in r['finish']})} (the schema cannot close within the length, so every one is masked at every token).")
    print()
    print("A constrained output (first 160 characters):")
    print()
    print("```")
    print(cons[-1]["sample"])
    print("```")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2])
    else:
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
        print(json.dumps(run(sys.argv[1], rounds, [[16, 256], [1, 512]]), indent=1))
