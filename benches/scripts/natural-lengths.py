#!/usr/bin/env python3
"""Fills in `output_len` of a prompts JSONL with the length of the answer a server actually
gives: each prompt goes to /v1/chat/completions with temperature 0, max_tokens CAP (default
1024) and the sampling fields of EXTRA (a JSON object, default {"frequency_penalty": 0.5}: the
benchmark's own request options), and the usage's completion_tokens is recorded. pace's greedy
outputs do not depend on the batch (its kernels are batch-invariant), so the lengths are the
same under any load and policy: they are the workload's true lengths for
`--max-tokens-rule exact|scale:K` and for the ceiling. It also records the prompt's tokens as the
server counts them (`prompt_tokens`, chat template included), which the simulator's cpu-smollm2
preset draws its lengths from.

usage: benches/scripts/natural-lengths.py BASE_URL IN.jsonl OUT.jsonl [CAP] [CONCURRENCY] [EXTRA]
Prints the length distribution at the end.
"""
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def ask(base, prompt, cap, extra):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": cap, "temperature": 0}
    body.update(extra)
    body = json.dumps(body).encode()
    req = urllib.request.Request(base.rstrip("/") + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        v = json.load(r)
    return v["usage"]["completion_tokens"], v["choices"][0]["finish_reason"], v["usage"]["prompt_tokens"]


def main():
    base, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
    cap = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
    conc = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {"frequency_penalty": 0.5}
    rows = [json.loads(l) for l in open(src) if l.strip()]
    with ThreadPoolExecutor(conc) as pool:
        answers = list(pool.map(lambda r: ask(base, r["prompt"], cap, extra), rows))
    with open(dst, "w") as f:
        for r, (n, reason, p) in zip(rows, answers):
            f.write(json.dumps({"prompt": r["prompt"], "output_len": n, "finish_reason": reason, "prompt_tokens": p}) + "\n")
    lens = sorted(n for n, _, _ in answers)
    q = lambda p: lens[min(len(lens) - 1, int(p * (len(lens) - 1) + 0.5))]
    capped = sum(1 for _, reason, _ in answers if reason == "length")
    prompts = [p for _, _, p in answers]
    print(f"prompt tokens as the server counts them (chat template included): mean {sum(prompts) / len(prompts):.1f}, "
          f"min {min(prompts)}, max {max(prompts)}")
    print(f"{len(lens)} prompts: mean {sum(lens) / len(lens):.1f}, p10 {q(0.1)}, p50 {q(0.5)}, p90 {q(0.9)}, "
          f"p99 {q(0.99)}, max {lens[-1]}; {capped} reached the cap of {cap}")


if __name__ == "__main__":
    main()
