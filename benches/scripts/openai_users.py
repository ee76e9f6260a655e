#!/usr/bin/env python3
"""Users of the official OpenAI Python client against an OpenAI-compatible server: each of
--users users asks --questions questions one after another (streaming completions, the client's
default retries: it honours Retry-After on 429 and 503), and every question is timed from the
user's call, retries included. Writes the timelines in `pace bench score`'s own format (one
record per question: arrival, token times, outcome), so the run is scored like any other.

usage: openai_users.py --base-url http://127.0.0.1:8000/v1 --out result.json
       [--users 16] [--questions 3] [--prompt-words 180] [--max-tokens 128] [--seed 1]
needs: pip install 'openai>=1.40' (measured with 3.63)
"""
import argparse
import asyncio
import json
import random
import time

import openai

WORDS = (
    "river mountain quiet history engine garden window letter science market winter planet music "
    "paper travel island forest signal theory bridge harbor lantern orbit meadow canyon ledger "
    "voyage crystal ember falcon glacier harvest ivory jungle kernel lagoon marble nectar oasis "
    "pepper quartz ribbon saddle timber umbra velvet willow yonder zephyr"
).split()


def prompt(rng, words):
    return "Write a short story using these words: " + " ".join(rng.choice(WORDS) for _ in range(words))


async def user(client, model, u, args, t0, out):
    rng = random.Random(args.seed * 100_003 + u)
    for q in range(args.questions):
        start = time.monotonic() - t0
        times, outcome = [], "completed"
        try:
            stream = await client.completions.create(
                model=model,
                prompt=prompt(rng, args.prompt_words),
                max_tokens=args.max_tokens,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                if chunk.choices:
                    times.append(time.monotonic() - t0)
        except openai.APIStatusError as e:
            outcome = "rejected" if e.status_code in (429, 503) and not times else "failed"
        except openai.APIError:
            outcome = "failed"
        end = time.monotonic() - t0
        out.append({"user": u, "question": q, "record": {
            "arrival": start, "token_times": times, "outcome": outcome, "end": end,
            "class": {"reading_rate": 5.0, "grace": 0.0, "weight": 1.0},
        }})


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=180)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    # The client's defaults: max_retries=2, Retry-After honoured; a timeout long enough for a
    # queued request.
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="none", timeout=600.0)
    model = (await client.models.list()).data[0].id
    out, t0 = [], time.monotonic()
    await asyncio.gather(*(user(client, model, u, args, t0, out) for u in range(args.users)))
    out.sort(key=lambda r: r["record"]["arrival"])
    with open(args.out, "w") as f:
        json.dump({"max_concurrency": args.users, "closed_loop": True, "client": f"openai {openai.__version__}", "timelines": out}, f)
    ends = {}
    for r in out:
        ends[r["record"]["outcome"]] = ends.get(r["record"]["outcome"], 0) + 1
    print(f"{args.out}: {len(out)} questions, {ends}")


if __name__ == "__main__":
    asyncio.run(main())
