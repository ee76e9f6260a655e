#!/usr/bin/env python3
"""Aggregate decode throughput of an llama.cpp server with N concurrent streams.

N streaming /completion requests, each a prompt of CONTEXT random token ids (so no prompt cache
can help) and N_PREDICT tokens with ignore_eos. Throughput is measured over the window where
all N streams are decoding: from the last stream's first token to the first stream's last token
(the same window `pace engine-bench` uses), tokens delivered inside it / its length.

usage: llama_server_decode.py URL N CONTEXT N_PREDICT SEED
"""
import json
import random
import sys
import threading
import time
import urllib.request


def run(url, ids, n_predict, out, i):
    body = json.dumps({"prompt": ids, "n_predict": n_predict, "ignore_eos": True, "stream": True,
                       "cache_prompt": False, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            d = json.loads(line[6:])
            now = time.monotonic()
            # one token per streamed chunk (n_probs off); the final chunk has stop=true and no token
            if d.get("content") is not None and not d.get("stop"):
                times.append(now)
            elif d.get("tokens"):
                times.extend([now] * len(d["tokens"]))
    out[i] = times


def main():
    url, n, ctx, n_predict, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 49000) for _ in range(ctx)] for _ in range(n)]
    out = [None] * n
    threads = [threading.Thread(target=run, args=(url, prompts[i], n_predict, out, i)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = max(t[0] for t in out)
    end = min(t[-1] for t in out)
    inside = sum(1 for t in out for x in t if start < x <= end)
    print(json.dumps({"streams": n, "aggregate_decode_tok_s": inside / (end - start) if end > start else float("nan"),
                      "tokens": sum(len(t) for t in out)}))


if __name__ == "__main__":
    main()
