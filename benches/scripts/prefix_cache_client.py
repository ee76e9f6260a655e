#!/usr/bin/env python3
"""Client side of benches/scripts/prefix-cache-cpu.sh: two workloads against one pace server.

shared:     a system prompt of about 1,500 tokens followed by a short question, sent N times one
            after another (greedy, max_tokens 1, so the latency is the time to the first token);
multiturn:  a 10-turn chat replayed as a client sends it (the whole history each turn, greedy,
            32-token answers).

Prints one JSON object: per request the latency, prompt_tokens and usage's cached_tokens.
With --report DIR it instead reads DIR/{on,off}-*.json and prints the Markdown table.
Standard library only.
"""

import json
import statistics
import sys
import time
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        v = json.loads(r.read())
    return v, time.perf_counter() - t0


def system_prompt(base, target=1500):
    parts, i = [], 0
    while True:
        parts.append(f"Rule {i}: when asked about topic {i * 7 % 101}, answer in one sentence and name your source.")
        i += 1
        if i % 10 == 0:
            n = len(post(base, "/tokenize", {"prompt": " ".join(parts)})[0]["tokens"])
            if n >= target:
                return " ".join(parts), n


def run(base, n_shared=10):
    system, sys_tokens = system_prompt(base)
    shared = []
    for q in range(n_shared):
        prompt = f"{system}\nQuestion {q}: what is {q + 3} times {q + 7}, and why does it matter?\nAnswer:"
        v, dt = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        u = v["usage"]
        shared.append({"latency_s": dt, "prompt_tokens": u["prompt_tokens"], "cached_tokens": u["prompt_tokens_details"]["cached_tokens"]})
    messages = [{"role": "system", "content": "You are a patient tutor. Keep answers short."}]
    turns = []
    for t in range(10):
        messages.append({"role": "user", "content": f"Turn {t}: explain step {t + 1} of making bread, briefly."})
        v, dt = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 32, "temperature": 0})
        u = v["usage"]
        messages.append({"role": "assistant", "content": v["choices"][0]["message"]["content"]})
        turns.append({"latency_s": dt, "prompt_tokens": u["prompt_tokens"], "cached_tokens": u["prompt_tokens_details"]["cached_tokens"]})
    return {"system_prompt_tokens": sys_tokens, "shared": shared, "multiturn": turns}


def report(d):
    import glob
    runs = {m: [json.load(open(f)) for f in sorted(glob.glob(f"{d}/{m}-*.json"))] for m in ("on", "off")}
    def ttft(r):  # median latency of the second and later requests
        return statistics.median(x["latency_s"] for x in r["shared"][1:])
    def work(r):  # prompt tokens computed over the conversation
        return sum(x["prompt_tokens"] - x["cached_tokens"] for x in r["multiturn"])
    on_t, off_t = [ttft(r) for r in runs["on"]], [ttft(r) for r in runs["off"]]
    on_w, off_w = [work(r) for r in runs["on"]], [work(r) for r in runs["off"]]
    med = statistics.median
    r0 = runs["on"][0]
    lines = [
        "| measure | caching on | caching off | ratio |",
        "|---|---|---|---|",
        f"| shared prefix: TTFT p50 of requests 2-{len(r0['shared'])} (s), median of {len(on_t)} runs | {med(on_t):.3f} | {med(off_t):.3f} | {med(off_t) / med(on_t):.1f}x lower |",
        f"| shared prefix: first request TTFT (s) | {med(r['shared'][0]['latency_s'] for r in runs['on']):.3f} | {med(r['shared'][0]['latency_s'] for r in runs['off']):.3f} | |",
        f"| shared prefix: cached tokens of request 2 | {r0['shared'][1]['cached_tokens']} of {r0['shared'][1]['prompt_tokens']} | 0 | |",
        f"| 10-turn chat: prompt tokens computed (sum over turns) | {med(on_w):.0f} | {med(off_w):.0f} | {100 * (1 - med(on_w) / med(off_w)):.0f}% less |",
        f"| 10-turn chat: prompt tokens sent (sum over turns) | {sum(x['prompt_tokens'] for x in r0['multiturn'])} | | |",
    ]
    per_run = "runs (TTFT p50 on / off, s): " + ", ".join(f"{a:.3f} / {b:.3f}" for a, b in zip(on_t, off_t))
    return "\n".join(lines) + "\n\n" + per_run + "\n"


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        print(report(sys.argv[2]), end="")
    else:
        print(json.dumps(run(sys.argv[1].rstrip("/")), indent=1))
