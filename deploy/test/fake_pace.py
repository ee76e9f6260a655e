#!/usr/bin/env python3
"""A stand-in for `pace serve` that speaks only the metrics contract, for testing deploy/.

NOT the server, and no evidence about it: it exists so CI can run the whole monitoring path
(Prometheus scraping, recording and alert rules, every dashboard query, the panel renderer)
before `pace serve` lands, and keeps running it afterwards against a known, complete set of
series. The real server is tested by test_e2e.py::test_e2e_real_pace_serve.

It serves, on 127.0.0.1 only:
  GET  /health                  200 "ok"
  GET  /metrics                 every series of the contract (issue 4, item 5; docs/metrics.md),
                                labelled model_name and scheduler, in the text format that
                                metrics-exporter-prometheus writes (le="2", le="0.1", ...)
  GET  /v1/models               one model
  POST /v1/completions          sleeps through a simulated queue, prefill and decode (streaming
                                SSE or not), records every histogram, counter and gauge; answers
                                429 beyond --max-inflight (counted as a rejection)
Simulated latencies depend on --scheduler so an A/B renders as two different lines.
Standard library only.
"""

import argparse
import json
import math
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READING_RATE = 5.0  # q, tokens/s (docs/metrics.md default)
ALPHA = 2.5
SLO_TTFT = 2.0
SLO_TPOT = 0.1

LAT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 5, 7.5, 10, 20, 40, 80]
TOKEN_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
RATIO_BUCKETS = [0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1, 1.05, 1.1, 1.25, 1.5, 2, 4]
HISTOGRAMS = {
    "pace_time_to_first_token_seconds": LAT_BUCKETS,
    "pace_inter_token_latency_seconds": LAT_BUCKETS,
    "pace_request_time_per_output_token_seconds": LAT_BUCKETS,
    "pace_e2e_request_latency_seconds": LAT_BUCKETS,
    "pace_user_idle_latency_seconds": [0, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80],
    "pace_request_queue_time_seconds": LAT_BUCKETS,
    "pace_request_prompt_tokens": TOKEN_BUCKETS,
    "pace_request_generation_tokens": TOKEN_BUCKETS,
    "pace_step_duration_seconds": [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
    "pace_iteration_tokens_total": TOKEN_BUCKETS,
    "pace_step_time_prediction_error_ratio": RATIO_BUCKETS,
    "pace_output_length_prediction_error_ratio": RATIO_BUCKETS,
    "pace_request_prefill_time_seconds": LAT_BUCKETS,
    "pace_request_decode_time_seconds": LAT_BUCKETS,
    "pace_request_inference_time_seconds": LAT_BUCKETS,
    "pace_token_lateness_seconds": [0, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80],
}
GAUGES = ["pace_goodput_requests_per_second", "pace_goodput_tokens_per_second", "pace_smooth_goodput_per_second",
          "pace_slo_attainment_ratio", "pace_inflight_max_idle_latency_seconds", "pace_num_requests_running",
          "pace_num_requests_waiting", "pace_kv_cache_usage_perc", "process_resident_memory_bytes"]
ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/health", "/metrics", "/version"]
FINISHED = ["stop", "length", "abort", "dropped", "rejected", "error"]
REJECTED = ["queue_full", "queue_tokens", "predicted_late", "too_long"]


def fmt(x):
    """Float text as Rust's Display writes it (metrics-exporter-prometheus): 2 -> "2", 0.1 -> "0.1"."""
    x = float(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


class Registry:
    def __init__(self, model, scheduler, window):
        self.lock = threading.Lock()
        self.labels = f'model_name="{model}",scheduler="{scheduler}"'
        # smooth's own series: its door's verdict on sustained overload, its starts on buffers.
        self.smooth = scheduler.startswith("smooth")
        self.window = window
        self.hist = {m: ([0] * len(b), 0.0, 0) for m, b in HISTOGRAMS.items()}
        # Every label value pre-registered at 0, which is what the real server should do too.
        self.counters = {f'pace_requests_total{{{self.labels},finished_reason="{r}"}}': 0 for r in FINISHED}
        self.counters.update({f'pace_requests_rejected_total{{{self.labels},reason="{r}"}}': 0 for r in REJECTED})
        self.counters.update({f'pace_request_success_total{{{self.labels},finished_reason="{r}"}}': 0 for r in ("stop", "length", "abort")})
        for c in ["pace_num_preemptions_total", "pace_prompt_tokens_total", "pace_generation_tokens_total",
                  "pace_http_connections_refused_total", "pace_prefix_cache_queries_total", "pace_prefix_cache_hits_total",
                  "pace_structured_output_masks_total", "pace_structured_output_mask_microseconds_total",
                  "pace_structured_output_errors_total"]:
            self.counters[f"{c}{{{self.labels}}}"] = 0
        if self.smooth:
            self.counters[f"pace_door_returns_total{{{self.labels}}}"] = 0
        self.finished = []  # (finish time, passed, tokens, benefit)
        self.inflight = {}  # id -> (arrival, tokens delivered, started)

    def observe(self, metric, value):
        with self.lock:
            counts, s, n = self.hist[metric]
            for i, b in enumerate(HISTOGRAMS[metric]):
                if value <= b:
                    counts[i] += 1
            self.hist[metric] = (counts, s + value, n + 1)

    def inc(self, name, extra="", by=1):
        key = f"{name}{{{self.labels}{',' + extra if extra else ''}}}"
        with self.lock:
            self.counters[key] = self.counters.get(key, 0) + by

    def render(self):
        now = time.time()
        with self.lock:
            self.finished = [f for f in self.finished if now - f[0] <= self.window]
            done = [f for f in self.finished if f[1] is not None]
            passed = [f for f in done if f[1]]
            waiting = sum(1 for v in self.inflight.values() if not v[2])
            running = len(self.inflight) - waiting
            idle_now = 0.0
            for a, n, _ in self.inflight.values():
                idle_now = max(idle_now, now - (a + (n + 1) / READING_RATE))
            gauges = {
                "pace_goodput_requests_per_second": len(passed) / self.window,
                "pace_goodput_tokens_per_second": sum(f[2] for f in passed) / self.window,
                "pace_smooth_goodput_per_second": sum(f[3] for f in self.finished) / self.window,
                "pace_slo_attainment_ratio": (len(passed) / len(done)) if done else 1.0,
                "pace_inflight_max_idle_latency_seconds": max(0.0, idle_now),
                "pace_num_requests_running": running,
                "pace_num_requests_waiting": waiting,
                "pace_kv_cache_usage_perc": min(1.0, 0.05 + 0.12 * running),
                "process_resident_memory_bytes": 180e6 + 1e6 * running,
            }
            lines = []
            for g in GAUGES:
                lines += [f"# TYPE {g} gauge", f"{g}{{{self.labels}}} {fmt(gauges[g])}"]
            if self.smooth:
                lines += ["# TYPE pace_sustained_overload gauge", f"pace_sustained_overload{{{self.labels}}} {int(waiting > 2)}"]
            lines += ["# TYPE pace_cache_config_info gauge",
                      f'pace_cache_config_info{{{self.labels},block_size="16",num_gpu_blocks="4096",cache_dtype="f16",'
                      f'enable_prefix_caching="True"}} 1']
            names = sorted({k.split("{")[0] for k in self.counters})
            for c in names:
                lines.append(f"# TYPE {c} counter")
                lines += [f"{k} {v}" for k, v in sorted(self.counters.items()) if k.split("{")[0] == c]
            for m, bounds in HISTOGRAMS.items():
                counts, s, n = self.hist[m]
                lines.append(f"# TYPE {m} histogram")
                for b, c in zip(bounds, counts):
                    lines.append(f'{m}_bucket{{{self.labels},le="{fmt(b)}"}} {c}')
                lines.append(f'{m}_bucket{{{self.labels},le="+Inf"}} {n}')
                lines.append(f"{m}_sum{{{self.labels}}} {fmt(s)}")
                lines.append(f"{m}_count{{{self.labels}}} {n}")
        return "\n".join(lines) + "\n"


class Sim:
    """Latency model: fcfs queues longer and stalls readers more than smooth under the same load."""

    def __init__(self, scheduler, reg, max_inflight, seed):
        self.s = scheduler
        self.reg = reg
        self.max_inflight = max_inflight
        self.rng = random.Random(seed)
        self.ids = 0

    def admit(self):
        with self.reg.lock:
            if len(self.reg.inflight) >= self.max_inflight:
                return None
            self.ids += 1
            self.reg.inflight[self.ids] = (time.time(), 0, False)
            return self.ids

    def params(self, load):
        if self.s == "fcfs":
            return 0.05 + 0.12 * load * self.rng.random(), 0.03 + 0.02 * load * self.rng.random()
        return 0.04 + 0.06 * load * self.rng.random(), 0.03 + 0.01 * load * self.rng.random()


def make_handler(args, reg, sim):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json", extra=()):
            data = body.encode() if isinstance(body, str) else body
            handler = self.path if self.path in ROUTES else "other"
            reg.inc("pace_http_requests_total", f'handler="{handler}",status="{code}"')
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, "ok", "text/plain")
            elif self.path == "/metrics":
                self._send(200, reg.render(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": args.model_name, "object": "model"}]}))
            else:
                self._send(404, json.dumps({"error": {"message": "not found", "type": "invalid_request_error"}}))

        def do_POST(self):
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, "{}")
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            prompt = body.get("prompt") or " ".join(m.get("content", "") for m in body.get("messages", []))
            n_prompt = max(1, len(str(prompt).split()))
            max_tokens = int(body.get("max_tokens") or 16)
            rid = sim.admit()
            if rid is None:
                reg.inc("pace_requests_rejected_total", 'reason="queue_full"')
                reg.inc("pace_requests_total", 'finished_reason="rejected"')
                reg.finished.append((time.time(), None, 0, 0.0))
                return self._send(429, json.dumps({"error": {"message": "queue full", "type": "rate_limit_error"}}),
                                  extra=[("Retry-After", "1")])
            arrival = reg.inflight[rid][0]
            load = len(reg.inflight)
            ttft_base, itl = sim.params(load)
            queue = ttft_base * 0.6
            time.sleep(queue)
            with reg.lock:
                reg.inflight[rid] = (arrival, 0, True)
            reg.observe("pace_request_queue_time_seconds", queue)
            scheduled = time.time()
            time.sleep(ttft_base * 0.4)
            if sim.rng.random() < (0.15 if sim.s == "fcfs" else 0.03):
                reg.inc("pace_num_preemptions_total")
            stream = bool(body.get("stream"))
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
            times = []
            for i in range(max_tokens):
                if i:
                    time.sleep(itl * (1.0 + 3.0 * (sim.rng.random() < 0.05)))
                t = time.time()
                # Per-token series at delivery, as the server observes them.
                if times:
                    reg.observe("pace_inter_token_latency_seconds", t - times[-1])
                else:
                    reg.observe("pace_time_to_first_token_seconds", t - arrival)
                reg.observe("pace_token_lateness_seconds", max(0.0, t - (arrival + (i + 1) / READING_RATE)))
                reg.inc("pace_generation_tokens_total")
                times.append(t)
                with reg.lock:
                    reg.inflight[rid] = (arrival, i + 1, True)
                if stream:
                    chunk = {"id": f"cmpl-{rid}", "object": "text_completion", "model": args.model_name,
                             "choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
            n = len(times)
            ttft = times[0] - arrival
            tpot = (times[-1] - times[0]) / (n - 1) if n > 1 else 0.0
            idle = max(0.0, max(t - (arrival + (i + 1) / READING_RATE) for i, t in enumerate(times)))
            reg.observe("pace_request_time_per_output_token_seconds", tpot)
            reg.observe("pace_request_prefill_time_seconds", times[0] - scheduled)
            reg.observe("pace_request_decode_time_seconds", times[-1] - times[0])
            reg.observe("pace_request_inference_time_seconds", times[-1] - scheduled)
            reg.observe("pace_e2e_request_latency_seconds", times[-1] - arrival)
            reg.observe("pace_user_idle_latency_seconds", idle)
            reg.observe("pace_request_prompt_tokens", n_prompt)
            reg.observe("pace_request_generation_tokens", n)
            # The fake's requests all end by length; score a made-up expectation as if stopped.
            reg.observe("pace_output_length_prediction_error_ratio", 0.6 + 0.8 * sim.rng.random())
            reg.inc("pace_prompt_tokens_total", by=n_prompt)
            if reg.smooth and sim.rng.random() < 0.1:
                reg.inc("pace_door_returns_total")
            reg.inc("pace_prefix_cache_queries_total", by=n_prompt)
            reg.inc("pace_prefix_cache_hits_total", by=int(n_prompt * (0.6 if sim.s == "smooth" else 0.5) * sim.rng.random()))
            # A fifth of the fake's outputs are constrained, about 45 us of mask CPU a token.
            if sim.rng.random() < 0.2:
                reg.inc("pace_structured_output_masks_total", by=n)
                reg.inc("pace_structured_output_mask_microseconds_total", by=int(n * (35 + 20 * sim.rng.random())))
            reg.inc("pace_requests_total", 'finished_reason="length"')
            reg.inc("pace_request_success_total", 'finished_reason="length"')
            passed = ttft <= SLO_TTFT and tpot <= SLO_TPOT
            with reg.lock:
                reg.inflight.pop(rid, None)
                reg.finished.append((time.time(), passed, n, n - ALPHA * idle))
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
            if stream:
                last = {"id": f"cmpl-{rid}", "object": "text_completion", "model": args.model_name,
                        "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
                self.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True
            else:
                self._send(200, json.dumps({"id": f"cmpl-{rid}", "object": "text_completion", "model": args.model_name,
                                            "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                                            "usage": usage}))

    return H


def engine_loop(reg, stop):
    """Engine steps while anything is in flight: step duration and batch tokens."""
    rng = random.Random(7)
    while not stop.is_set():
        with reg.lock:
            running = len(reg.inflight)
        if running:
            d = 0.004 + 0.003 * running * rng.random()
            reg.observe("pace_step_duration_seconds", d)
            reg.observe("pace_iteration_tokens_total", running + (rng.random() < 0.2) * 64)
            reg.observe("pace_step_time_prediction_error_ratio", rng.lognormvariate(0.0, 0.06))
            time.sleep(d)
        else:
            time.sleep(0.02)


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:  # `fake_pace.py serve ...` mimics `pace serve` (test_e2e's own self-test)
        argv = argv[1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1"])
    p.add_argument("--threads", type=int, default=1, help="ignored")
    p.add_argument("--scheduler", default="smooth")
    p.add_argument("--model-name", default="SmolLM2-135M-Instruct")
    p.add_argument("--metrics-window", type=float, default=60.0)
    p.add_argument("--max-inflight", type=int, default=6)
    args = p.parse_args(argv)
    reg = Registry(args.model_name, args.scheduler, args.metrics_window)
    sim = Sim(args.scheduler, reg, args.max_inflight, seed=sum(map(ord, args.scheduler)))
    stop = threading.Event()
    threading.Thread(target=engine_loop, args=(reg, stop), daemon=True).start()
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args, reg, sim))
    srv.daemon_threads = True
    # SIGTERM as pace handles it, simplified: stop serving, let requests in flight end, exit 0.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        deadline = time.time() + 30
        while reg.inflight and time.time() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
