#!/usr/bin/env python3
"""Idle-connection flood against any HTTP server, while a /health prober and one streaming
client run (issue 43's attack: 1,100 connections that send nothing, or only the HTTP/2 preface
and a SETTINGS frame, reopened as soon as the server closes them).

Prints one JSON object: how many probes answered within 1 s, their latency quantiles, whether
the stream ended properly and its longest gap between chunks, and how many flood connections
the server closed. Standard library only.

    python3 benches/scripts/conn_flood.py --port 8000 --connections 1100 --seconds 20
"""

import argparse
import asyncio
import json
import multiprocessing
import resource
import time

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # empty SETTINGS frame


async def hold(host, port, h2, stop, stats):
    """One flood connection, reopened whenever the server closes it, until `stop`."""
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection(host, port)
        except OSError:
            stats["open_failed"] += 1
            await asyncio.sleep(0.05)
            continue
        stats["opened"] += 1
        if h2:
            w.write(H2_PREFACE + H2_SETTINGS)
            await w.drain()
        while not stop.is_set():
            # Read (and drop) whatever the server sends; EOF or a reset means it closed us.
            try:
                data = await asyncio.wait_for(r.read(4096), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                stats["closed_by_server"] += 1
                break
        w.close()


def flood_process(host, port, n, n2, stop_flood, shared):
    async def run():
        stop = asyncio.Event()
        stats = {"opened": 0, "open_failed": 0, "closed_by_server": 0}
        tasks = [asyncio.create_task(hold(host, port, i < n2, stop, stats)) for i in range(n)]
        while not stop_flood.is_set():
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        shared.update(stats)

    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    asyncio.run(run())


async def probe(host, port, stop, out):
    """GET /health on a fresh connection every 100 ms; latency, or None past 1 s or on error."""
    while not stop.is_set():
        t0 = time.monotonic()
        ok = False
        try:

            async def once():
                r, w = await asyncio.open_connection(host, port)
                w.write(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                await w.drain()
                head = await r.readline()
                w.close()
                return head.startswith(b"HTTP/1.1 200")

            ok = await asyncio.wait_for(once(), timeout=1.0)
        except (asyncio.TimeoutError, OSError):
            ok = False
        out.append(time.monotonic() - t0 if ok else None)
        await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))


async def stream(host, port, max_tokens, out):
    """One streaming completion; its chunks' arrival times and whether it ended with [DONE]."""
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0})
    req = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()
    times, done, status = [], False, None
    t0 = time.monotonic()
    try:
        r, w = await asyncio.open_connection(host, port)
        w.write(req)
        await w.drain()
        status = (await r.readline()).decode(errors="replace").strip()
        while True:
            line = await asyncio.wait_for(r.readline(), timeout=60)
            if not line:
                break
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                times.append(time.monotonic() - t0)
        w.close()
    except (asyncio.TimeoutError, OSError) as e:
        status = f"{status} / {e!r}"
    gaps = [b - a for a, b in zip(times, times[1:])]
    out.update(status=status, chunks=len(times), done=done, max_gap_s=max(gaps) if gaps else None, seconds=times[-1] if times else None)


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else None


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--connections", type=int, default=1100)
    ap.add_argument("--http2-fraction", type=float, default=0.5, help="share of flood connections that send the HTTP/2 preface and SETTINGS")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=256, help="length of the streaming request")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    # The flood runs in its own process, so that its work does not delay the measurements'
    # event loop.
    n2 = int(a.connections * a.http2_fraction)
    stats = multiprocessing.Manager().dict()
    stop_flood = multiprocessing.Event()
    flooder = multiprocessing.Process(target=flood_process, args=(a.host, a.port, a.connections, n2, stop_flood, stats))
    flooder.start()
    await asyncio.sleep(1.0)  # the flood is up before the measurement starts
    stop = asyncio.Event()
    probes, s = [], {}
    prober = asyncio.create_task(probe(a.host, a.port, stop, probes))
    streamer = asyncio.create_task(stream(a.host, a.port, a.max_tokens, s))
    await asyncio.sleep(a.seconds)
    # The flood stays on until the stream ends (at most two more minutes).
    try:
        await asyncio.wait_for(asyncio.shield(streamer), timeout=120)
    except asyncio.TimeoutError:
        streamer.cancel()
        s.setdefault("status", "still streaming two minutes after the flood's time")
    stop.set()
    await prober
    stop_flood.set()
    flooder.join()
    answered = [p for p in probes if p is not None]
    print(
        json.dumps(
            {
                "flood": {"connections": a.connections, "http2": n2, **dict(stats)},
                "health": {
                    "probes": len(probes),
                    "within_1s": len(answered),
                    "share_within_1s": len(answered) / max(1, len(probes)),
                    "p50_s": quantile(answered, 0.5),
                    "p99_s": quantile(answered, 0.99),
                    "max_s": max(answered) if answered else None,
                },
                "stream": s,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
