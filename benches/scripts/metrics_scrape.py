"""How long `GET /metrics` takes while a server runs many streams: the llm-d endpoint picker
scrapes every pod every 50 ms, so the scrape must stay cheap under load.

    python metrics_scrape.py BASE_URL [STREAMS] [SECONDS] [PERIOD_S]

Opens STREAMS (256) streaming completions that do not end on their own (ignore_eos, long
max_tokens), waits until the server reports them all running (`pace_num_requests_running`, or
vLLM's `vllm:num_requests_running`), then scrapes `/metrics` every PERIOD_S (0.05) for SECONDS
(30) over one kept-alive connection, as a scraper does, and prints the latency quantiles and the
body size as JSON. The streams run in a child process, so that reading them does not delay the
scraper's own event loop; they are cancelled at the end.
"""

import asyncio
import json
import multiprocessing
import statistics
import sys
import time

import httpx

base = sys.argv[1].rstrip("/")
streams = int(sys.argv[2]) if len(sys.argv) > 2 else 256
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
period = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05


async def stream(client, i, started):
    body = {"prompt": f"Stream {i}: tell a long story.", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    try:
        async with client.stream("POST", f"{base}/v1/completions", json=body, timeout=None) as r:
            async for _ in r.aiter_bytes():
                started.add(i)
    except (httpx.HTTPError, asyncio.CancelledError):
        pass


def running(text):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("pace_num_requests_running", "vllm:num_requests_running")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def quantile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def hold_streams():
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        started = set()
        await asyncio.gather(*(stream(client, i, started) for i in range(streams)))


def streams_process():
    asyncio.run(hold_streams())


def main():
    child = multiprocessing.Process(target=streams_process, daemon=True)
    child.start()
    try:
        print(json.dumps(scrape()))
    finally:
        child.terminate()
        child.join()


def scrape():
    with httpx.Client() as scraper:
        deadline = time.monotonic() + 600
        while True:
            n = running(scraper.get(f"{base}/metrics").text)
            if n >= streams:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {n} of {streams} streams running after 600 s")
            time.sleep(0.5)
        lat, sizes = [], []
        end = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = scraper.get(f"{base}/metrics")
            lat.append((time.perf_counter() - t0) * 1000)
            sizes.append(len(r.content))
            assert r.status_code == 200
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
        n_end = running(scraper.get(f"{base}/metrics").text)
    return {
        "streams": streams,
        "running_at_end": n_end,
        "scrapes": len(lat),
        "period_s": period,
        "ms_p50": round(statistics.median(lat), 2),
        "ms_p90": round(quantile(lat, 0.9), 2),
        "ms_p99": round(quantile(lat, 0.99), 2),
        "ms_max": round(max(lat), 2),
        "body_bytes": int(statistics.median(sizes)),
    }


if __name__ == "__main__":
    main()
