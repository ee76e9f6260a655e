#!/usr/bin/env python3
"""Writes deploy/grafana/pace.json, pace's Grafana dashboard, from the panel list below.

Edit this file, not the JSON, then run `python3 deploy/grafana/build_dashboard.py`; CI fails when
pace.json differs from what this script writes (deploy/test/test_static.py).

Every query filters on the dashboard's variables through SEL; the user-experience and engine
panels read the per-instance histogram rates recorded by deploy/prometheus/rules/recording.yml
(instance:<histogram>_bucket:rate1m and friends), so they need those rules loaded.
Only the standard library is used.
"""

import json
import os
import sys

SEL = 'model_name=~"$model", scheduler=~"$scheduler", instance=~"$instance"'
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"

# Metric names of the server's contract (issue 4, docs/metrics.md); test_static.py checks that
# every one of them appears in the dashboard.
LATENCY = [
    ("pace_time_to_first_token_seconds", "Time to first token (TTFT)", "Arrival to first token delivered."),
    ("pace_inter_token_latency_seconds", "Inter-token latency (ITL)", "Every gap between two delivered tokens of a stream."),
    ("pace_request_time_per_output_token_seconds", "Time per output token (TPOT)", "(last token - first token) / (tokens - 1), per request."),
    ("pace_e2e_request_latency_seconds", "End-to-end latency (E2E)", "Arrival to the last token of the response."),
    ("pace_user_idle_latency_seconds", "User idle latency", "max(0, max_i(t_i - d_i)) with d_i = a + g + i/q: how long a reader "
     "consuming q tokens/s sat with nothing left to read (docs/metrics.md)."),
    ("pace_request_queue_time_seconds", "Queue time", "Arrival to the first scheduled step of the request."),
    ("pace_request_prefill_time_seconds", "Prefill time", "First scheduled step to the first token delivered, per request "
     "(queue time + prefill time = TTFT)."),
    ("pace_request_decode_time_seconds", "Decode time", "First token delivered to the last, per request."),
    ("pace_request_inference_time_seconds", "Inference time", "First scheduled step to the last token delivered, per request "
     "(prefill + decode)."),
]


class Builder:
    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.y = 0

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        self.panels.append({"type": "row", "id": self._id(), "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def place(self, panels, h):
        """Places panels side by side on one line of the 24-column grid (width from each panel)."""
        x = 0
        for p in panels:
            p["gridPos"] = {"h": h, "w": p.pop("_w"), "x": x, "y": self.y}
            x += p["gridPos"]["w"]
            assert x <= 24, p["title"]
            self.panels.append(p)
        self.y += h

    def _targets(self, targets, fmt="time_series"):
        out = []
        for i, (expr, legend) in enumerate(targets):
            t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i),
                 "range": True, "instant": False, "editorMode": "code"}
            if fmt != "time_series":
                t["format"] = fmt
            out.append(t)
        return out

    def ts(self, title, desc, targets, unit, w=12, minv=None, maxv=None, stack=False, thresholds=None):
        defaults = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                                            "spanNulls": False,
                                            "stacking": {"mode": "normal" if stack else "none", "group": "A"}}}
        if minv is not None:
            defaults["min"] = minv
        if maxv is not None:
            defaults["max"] = maxv
        if thresholds:
            defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
            defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
        return {"type": "timeseries", "id": self._id(), "title": title, "description": desc, "datasource": DS,
                "targets": self._targets(targets), "_w": w,
                "fieldConfig": {"defaults": defaults, "overrides": []},
                "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
                            "tooltip": {"mode": "multi", "sort": "desc"}}}

    def stat(self, title, desc, targets, unit, w=6, steps=None, decimals=None):
        defaults = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps or [{"color": "green", "value": None}]}}
        if decimals is not None:
            defaults["decimals"] = decimals
        return {"type": "stat", "id": self._id(), "title": title, "description": desc, "datasource": DS,
                "targets": self._targets(targets), "_w": w,
                "fieldConfig": {"defaults": defaults, "overrides": []},
                "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                            "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                            "orientation": "auto", "justifyMode": "auto"}}

    def heatmap(self, title, desc, expr, unit, w=12):
        return {"type": "heatmap", "id": self._id(), "title": title, "description": desc, "datasource": DS,
                "targets": self._targets([(expr, "{{le}}")], fmt="heatmap"), "_w": w,
                "repeat": "scheduler", "repeatDirection": "h", "maxPerRow": 2,
                "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
                "options": {"calculate": False, "cellGap": 1, "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5,
                                                                        "fill": "dark-orange", "steps": 64, "reverse": False},
                            "yAxis": {"axisPlacement": "left", "unit": unit},
                            "rowsFrame": {"layout": "auto"}, "legend": {"show": True},
                            "tooltip": {"mode": "single", "yHistogram": True}, "filterValues": {"le": 1e-9}}}


def quantiles(metric, by="scheduler", qs=(0.5, 0.9, 0.99)):
    rec = f"instance:{metric}_bucket:rate1m"
    ts = [(f"histogram_quantile({q}, sum by ({by}, le) ({rec}{{{SEL}}}))", f"{{{{{by}}}}} p{int(q * 100)}") for q in qs]
    ts.append((f"sum by ({by}) (instance:{metric}_sum:rate1m{{{SEL}}}) / sum by ({by}) (instance:{metric}_count:rate1m{{{SEL}}})",
               f"{{{{{by}}}}} mean"))
    return ts


def zero_fallback(expr, by):
    """`expr or on(by) 0 * (requests rate)`: a line at 0 instead of "No data" while an event (a
    rejection, a drop, a preemption) has not happened yet and its counter does not exist."""
    return f"{expr} or on ({by}) (0 * sum by ({by}) (rate(pace_requests_total{{{SEL}}}[{RI}])))"


def build():
    b = Builder()

    # ---------------------------------------------------------------- goodput
    b.row("Goodput (per scheduler: an A/B pair shares each panel)")
    b.place([
        b.ts("Smooth goodput by scheduler",
             "Sum over requests finished in the window of n - alpha*f(idle latency), per second "
             "(docs/metrics.md). Higher is better; below 0 users wait more than they read.",
             [(f"sum by (scheduler) (pace_smooth_goodput_per_second{{{SEL}}})", "{{scheduler}}")], "short"),
        b.ts("SLO attainment by scheduler (server window, configured --slo)",
             "Share of finished requests that met every threshold of the configured binary SLO, over the "
             "server's --metrics-window; mean over the selected instances. Dashed line: 90% target.",
             [(f"avg by (scheduler) (pace_slo_attainment_ratio{{{SEL}}})", "{{scheduler}}")], "percentunit",
             minv=0, maxv=1, thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 0.9}]),
    ], 8)
    b.place([
        b.ts("Request goodput vs request throughput by scheduler",
             "Goodput: requests that met the SLO per second (server window). Throughput: requests completed "
             "(stop or length) per second.",
             [(f"sum by (scheduler) (pace_goodput_requests_per_second{{{SEL}}})", "{{scheduler}} goodput"),
              (f'sum by (scheduler) (rate(pace_requests_total{{{SEL}, finished_reason=~"stop|length"}}[{RI}]))',
               "{{scheduler}} throughput")], "reqps"),
        b.ts("Token goodput vs token throughput by scheduler",
             "Goodput: output tokens of requests that met the SLO per second (server window). Throughput: "
             "all output tokens generated per second.",
             [(f"sum by (scheduler) (pace_goodput_tokens_per_second{{{SEL}}})", "{{scheduler}} goodput"),
              (f"sum by (scheduler) (rate(pace_generation_tokens_total{{{SEL}}}[{RI}]))", "{{scheduler}} throughput")],
             "short"),
    ], 8)

    b.place([
        b.ts("TTFT and TPOT attainment over time by scheduler (5 m, all instances)",
             "Share of requests under each threshold of pace's default SLO (TTFT 2 s, TPOT 100 ms), from the "
             "SLO bucket over 5 minutes, per scheduler across all instances (recorded: "
             "model_scheduler:*_slo_attainment:ratio_rate5m; edit the rules if you change --slo).",
             [('model_scheduler:pace_time_to_first_token_slo_attainment:ratio_rate5m{model_name=~"$model", scheduler=~"$scheduler"}',
               "{{scheduler}} TTFT"),
              ('model_scheduler:pace_time_per_output_token_slo_attainment:ratio_rate5m{model_name=~"$model", scheduler=~"$scheduler"}',
               "{{scheduler}} TPOT")], "percentunit", w=24, minv=0, maxv=1,
             thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 0.9}]),
    ], 7)

    # ---------------------------------------------------------------- user experience
    b.row("User experience")
    tiles = [
        b.stat("TTFT attainment over the range (TTFT <= $ttft_slo s)",
               "Share of requests in the dashboard's time range whose TTFT fell in the SLO bucket: "
               "bucket{le=TTFT SLO} / count. The variable ttft_slo must equal a bucket boundary (the server "
               "makes its configured --slo thresholds boundaries).",
               [(f'sum by (scheduler) (increase(pace_time_to_first_token_seconds_bucket{{{SEL}, le=~"${{ttft_slo}}([.]0+)?"}}[$__range])) '
                 f"/ sum by (scheduler) (increase(pace_time_to_first_token_seconds_count{{{SEL}}}[$__range]))", "{{scheduler}}")],
               "percentunit", decimals=1,
               steps=[{"color": "red", "value": None}, {"color": "orange", "value": 0.8}, {"color": "green", "value": 0.9}]),
        b.stat("TPOT attainment over the range (TPOT <= $tpot_slo s)",
               "Share of requests in the dashboard's time range whose TPOT fell in the SLO bucket: "
               "bucket{le=TPOT SLO} / count.",
               [(f'sum by (scheduler) (increase(pace_request_time_per_output_token_seconds_bucket{{{SEL}, le=~"${{tpot_slo}}([.]0+)?"}}[$__range])) '
                 f"/ sum by (scheduler) (increase(pace_request_time_per_output_token_seconds_count{{{SEL}}}[$__range]))", "{{scheduler}}")],
               "percentunit", decimals=1,
               steps=[{"color": "red", "value": None}, {"color": "orange", "value": 0.8}, {"color": "green", "value": 0.9}]),
        b.stat("Mean user idle latency over the range",
               "Mean idle latency of the requests finished in the dashboard's time range: how long, on average, "
               "a reader sat with nothing to read (0 is perfect).",
               [(f"sum by (scheduler) (increase(pace_user_idle_latency_seconds_sum{{{SEL}}}[$__range])) "
                 f"/ sum by (scheduler) (increase(pace_user_idle_latency_seconds_count{{{SEL}}}[$__range]))", "{{scheduler}}")],
               "s", decimals=2,
               steps=[{"color": "green", "value": None}, {"color": "orange", "value": 0.5}, {"color": "red", "value": 2}]),
        b.stat("Worst idle latency of a stream in flight (now)",
               "Largest idle latency among requests still streaming: a stall shows here before the requests end.",
               [(f"max by (scheduler) (pace_inflight_max_idle_latency_seconds{{{SEL}}})", "{{scheduler}}")], "s",
               steps=[{"color": "green", "value": None}, {"color": "orange", "value": 2}, {"color": "red", "value": 10}]),
    ]
    b.place(tiles, 5)
    panels = []
    for metric, title, desc in LATENCY:
        targets = quantiles(metric)
        if metric == "pace_time_to_first_token_seconds":
            targets.append(("vector($ttft_slo)", "SLO"))
        if metric == "pace_request_time_per_output_token_seconds":
            targets.append(("vector($tpot_slo)", "SLO"))
        panels.append(b.ts(f"{title}: p50 / p90 / p99 / mean by scheduler",
                           desc + " Quantiles from histogram buckets over 1 m (recorded rates).", targets, "s", minv=0))
    for i in range(0, len(panels), 2):
        b.place(panels[i:i + 2], 8)
    b.place([
        b.ts("Worst in-flight idle latency by instance",
             "Largest idle latency among requests still streaming on each instance (early warning of a stall; "
             "alert PaceStreamStalled at 10 s).",
             [(f"max by (instance, scheduler) (pace_inflight_max_idle_latency_seconds{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "s", w=24, minv=0),
    ], 7)
    b.place([
        b.heatmap("TTFT distribution ($scheduler)", "Requests per second in each TTFT bucket (recorded 1 m rates).",
                  f'sum by (le) (instance:pace_time_to_first_token_seconds_bucket:rate1m{{{SEL}}})', "s"),
    ], 8)
    b.place([
        b.heatmap("User idle latency distribution ($scheduler)",
                  "Requests per second in each idle-latency bucket (recorded 1 m rates).",
                  f'sum by (le) (instance:pace_user_idle_latency_seconds_bucket:rate1m{{{SEL}}})', "s"),
    ], 8)
    b.place([
        b.heatmap("Inter-token latency distribution ($scheduler)",
                  "Token gaps per second in each ITL bucket (recorded 1 m rates), observed as each token is delivered: "
                  "a stall appears when the stalled token arrives, not when its request ends.",
                  f'sum by (le) (instance:pace_inter_token_latency_seconds_bucket:rate1m{{{SEL}}})', "s"),
        b.heatmap("Token lateness distribution ($scheduler)",
                  "Delivered tokens per second in each lateness bucket: how late each token came against its reader's "
                  "deadline (0: on time), observed at delivery. A request's idle latency is its largest token lateness.",
                  f'sum by (le) (instance:pace_token_lateness_seconds_bucket:rate1m{{{SEL}}})', "s"),
    ], 8)

    # ---------------------------------------------------------------- load
    b.row("Load")
    b.place([
        b.ts("Running requests by instance", "Requests holding KV blocks and scheduled each step.",
             [(f"sum by (instance, scheduler) (pace_num_requests_running{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "short", w=8, minv=0),
        b.ts("Waiting requests by instance", "Requests admitted but not started (or preempted). The HPA scales on "
             "the average of this over pods (deploy/k8s/hpa.yaml).",
             [(f"sum by (instance, scheduler) (pace_num_requests_waiting{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "short", w=8, minv=0),
        b.ts("KV cache usage by instance", "Share of KV-cache blocks in use (alert PaceKVCacheSaturated above 95%).",
             [(f"max by (instance, scheduler) (pace_kv_cache_usage_perc{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "percentunit", w=8, minv=0, maxv=1,
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 0.95}]),
    ], 8)
    b.place([
        b.ts("Rejections by reason",
             "Requests turned away at the door per second (429/503 with Retry-After): queue_full, queue_tokens, "
             "predicted_late (smooth's benefit test), too_long, ... A flat 0 means none yet.",
             [(zero_fallback(f"sum by (scheduler, reason) (rate(pace_requests_rejected_total{{{SEL}}}[{RI}]))", "scheduler"),
               "{{scheduler}} {{reason}}")], "reqps", w=8, minv=0),
        b.ts("Finished requests by reason",
             "Requests finished per second by finished_reason: stop, length, abort (client went away), dropped "
             "(drop-late), rejected, error.",
             [(f"sum by (scheduler, finished_reason) (rate(pace_requests_total{{{SEL}}}[{RI}]))",
               "{{scheduler}} {{finished_reason}}")], "reqps", w=8, minv=0, stack=True),
        b.ts("Drops and preemptions",
             "Dropped: started requests given up by drop-late once certainly late. Preemptions: running requests "
             "evicted from the KV cache (recomputed later). A flat 0 means none yet.",
             [(zero_fallback(f'sum by (scheduler) (rate(pace_requests_total{{{SEL}, finished_reason="dropped"}}[{RI}]))', "scheduler"),
               "{{scheduler}} dropped/s"),
              (zero_fallback(f"sum by (scheduler) (rate(pace_num_preemptions_total{{{SEL}}}[{RI}]))", "scheduler"),
               "{{scheduler}} preemptions/s")], "short", w=8, minv=0),
    ], 8)
    b.place([
        b.ts("smooth: sustained overload by instance",
             "1 while smooth's door finds, over its window (a minute), more new requests arriving than completing: "
             "it then refuses (503 predicted_late) requests that would wait behind others for more than a small "
             "share of their value. 0 through bursts and closed loops. Only smooth has this series.",
             [(f"max by (instance, scheduler) (pace_sustained_overload{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "short", minv=0, maxv=1),
        b.ts("smooth: arrivals answering an end",
             "Requests per second that arrived within moments of another's end (finished, left or refused): "
             "closed-loop clients, which smooth's door does not count as new demand (docs/scheduler.md). "
             "Only smooth has this series.",
             [(f"sum by (scheduler) (rate(pace_door_returns_total{{{SEL}}}[{RI}]))", "{{scheduler}}")],
             "reqps", minv=0),
    ], 8)
    b.place([
        b.ts("Request throughput by scheduler",
             "Finished requests per second, every reason (the offered load as the server sees it), and completed ones.",
             [(f"sum by (scheduler) (rate(pace_requests_total{{{SEL}}}[{RI}]))", "{{scheduler}} all"),
              (f'sum by (scheduler) (rate(pace_requests_total{{{SEL}, finished_reason=~"stop|length"}}[{RI}]))',
               "{{scheduler}} completed"),
              (f"sum by (scheduler) (rate(pace_request_success_total{{{SEL}}}[{RI}]))",
               "{{scheduler}} success (vLLM's meaning: stop, length, abort)")], "reqps", minv=0),
        b.ts("Token throughput by scheduler", "Prompt tokens processed and output tokens generated per second.",
             [(f"sum by (scheduler) (rate(pace_prompt_tokens_total{{{SEL}}}[{RI}]))", "{{scheduler}} prompt"),
              (f"sum by (scheduler) (rate(pace_generation_tokens_total{{{SEL}}}[{RI}]))", "{{scheduler}} generation")],
             "short", minv=0),
    ], 8)
    b.place([
        b.ts("HTTP responses by status",
             "Generation requests answered per second by HTTP status: 200, 4xx refusals (429: a full queue), 503 "
             "(smooth's predicted_late, drop-late's drops, draining), 499 (the client left before the response "
             "head). Any 500 is a bug worth a look.",
             [(f'sum by (scheduler, status) (rate(pace_http_requests_total{{{SEL}, handler=~"/v1/(chat/)?completions"}}[{RI}]))',
               "{{scheduler}} {{status}}")], "reqps", w=8, minv=0, stack=True),
        b.ts("Connections refused",
             "Connections closed at accept because --max-connections were open (default 1,024). A flat 0 means "
             "none.",
             [(f"sum by (instance) (rate(pace_http_connections_refused_total{{{SEL}}}[{RI}]))", "{{instance}}")],
             "short", w=8, minv=0),
        b.ts("Resident memory by instance",
             "process_resident_memory_bytes: weights, KV cache and the rest. Flat under steady load; a slope that "
             "never levels off is a leak (docs/reliability-soak.md measures it).",
             [(f"max by (instance, scheduler) (process_resident_memory_bytes{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "bytes", w=8, minv=0),
    ], 8)
    b.place([
        b.ts("Prompt tokens per request: p50 / p90 / p99 / mean", "Prompt length of finished requests.",
             quantiles("pace_request_prompt_tokens"), "short", minv=0),
        b.ts("Generated tokens per request: p50 / p90 / p99 / mean", "Output length of finished requests.",
             quantiles("pace_request_generation_tokens"), "short", minv=0),
    ], 8)

    # ---------------------------------------------------------------- engine
    b.row("Engine")
    b.place([
        b.ts("Step duration by instance: p50 / p90 / p99 / mean",
             "Wall time of one engine step (schedule, forward over the ragged batch, update).",
             quantiles("pace_step_duration_seconds", by="instance"), "s", minv=0),
        b.ts("Tokens per step by instance: p50 / p90 / p99 / mean",
             "Tokens in one step's batch (prefill chunks plus decodes).",
             quantiles("pace_iteration_tokens_total", by="instance"), "short", minv=0),
    ], 8)
    b.place([
        b.ts("Steps per second by instance", "Engine steps per second; near zero with requests running means a stuck engine.",
             [(f"sum by (instance, scheduler) (instance:pace_step_duration_seconds_count:rate1m{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "short", minv=0),
        b.ts("Engine busy fraction by instance", "Seconds spent in steps per second of wall time (1 = always stepping).",
             [(f"sum by (instance, scheduler) (instance:pace_step_duration_seconds_sum:rate1m{{{SEL}}})", "{{instance}} {{scheduler}}")],
             "percentunit", minv=0),
    ], 8)
    b.place([
        b.ts("Prefix cache hit rate by instance",
             "Share of admitted prompt tokens whose KV came from the prefix cache (reused, not computed): "
             "rate(pace_prefix_cache_hits_total) / rate(pace_prefix_cache_queries_total). Chat traffic that "
             "re-sends its system prompt and history hits; random prompts do not.",
             [(f"sum by (instance, scheduler) (rate(pace_prefix_cache_hits_total{{{SEL}}}[{RI}])) "
               f"/ sum by (instance, scheduler) (rate(pace_prefix_cache_queries_total{{{SEL}}}[{RI}]))",
               "{{instance}} {{scheduler}}")], "percentunit", w=24, minv=0, maxv=1),
    ], 8)
    b.place([
        b.ts("Structured outputs: mask CPU per constrained token",
             "CPU time of one token mask (llguidance) for requests with a JSON schema, regex, choice, grammar or forced "
             "tool call: rate(pace_structured_output_mask_microseconds_total) / rate(pace_structured_output_masks_total). "
             "Masks run on the engine thread while the forward pass runs; tens of microseconds is normal, milliseconds "
             "mean hard grammars (docs/bench/structured-cpu-smollm2).",
             [(f"sum by (instance, scheduler) (rate(pace_structured_output_mask_microseconds_total{{{SEL}}}[{RI}])) "
               f"/ (sum by (instance, scheduler) (rate(pace_structured_output_masks_total{{{SEL}}}[{RI}])) > 0)",
               "{{instance}} {{scheduler}}")], "µs", minv=0),
        b.ts("Structured outputs: masks and grammar errors per second",
             "Constrained tokens per second, and grammars that stopped on an error (a per-mask limit exceeded: the "
             "output ended with EOS). Errors should stay at zero; a rise means clients send grammars too hard to follow.",
             [(f"sum by (instance) (rate(pace_structured_output_masks_total{{{SEL}}}[{RI}]))", "{{instance}} masks/s"),
              (f"sum by (instance) (rate(pace_structured_output_errors_total{{{SEL}}}[{RI}]))", "{{instance}} errors/s")],
             "short", minv=0),
    ], 8)
    b.place([
        b.stat("KV cache configuration by instance",
               "pace_cache_config_info (vLLM's cache_config_info): tokens per block, blocks in the pool, the cache's "
               "element type and whether prefix caching is on, as labels.",
               [(f"max by (instance, block_size, num_gpu_blocks, cache_dtype, enable_prefix_caching) (pace_cache_config_info{{{SEL}}})",
                 "{{instance}}: {{num_gpu_blocks}} blocks x {{block_size}} tokens, {{cache_dtype}}, prefix caching {{enable_prefix_caching}}")],
               "none", w=24),
    ], 4)
    # The scheduler's own predictions: smooth plans steps and admits by them.
    within = lambda m: (f'(sum by (scheduler) (instance:{m}_bucket:rate1m{{{SEL}, le=~"1[.]10*"}}) '
                        f'- sum by (scheduler) (instance:{m}_bucket:rate1m{{{SEL}, le=~"0[.]90*"}})) '
                        f"/ sum by (scheduler) (instance:{m}_count:rate1m{{{SEL}}})")
    band = lambda m: [(f"histogram_quantile({q}, sum by (scheduler, le) (instance:{m}_bucket:rate1m{{{SEL}}}))",
                       f"{{{{scheduler}}}} p{round(q * 100):02d}") for q in (0.05, 0.5, 0.95)]
    b.place([
        b.ts("Step-time prediction: predicted / measured, p05 / p50 / p95",
             "The cost model's predicted step time over the measured one (1 is exact; above 1 it expected "
             "slower steps). The smooth scheduler sizes chunks, the feed limit and the door's waits by it. "
             "Buckets 0.9 and 1.1 bound the 10% band.", band("pace_step_time_prediction_error_ratio"), "short",
             w=8, minv=0),
        b.ts("Steps predicted within 10%",
             "Share of steps whose predicted time was within 10% of the measured one (ratio in (0.9, 1.1]). "
             "Target: 95% at steady load.", [(within("pace_step_time_prediction_error_ratio"), "{{scheduler}}")],
             "percentunit", w=8, minv=0, maxv=1,
             thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 0.95}]),
        b.ts("Output-length prediction: expected / actual, p05 / p50 / p95",
             "The learned length model's expected output over the actual one, for requests that stopped by "
             "themselves (a request cut by max_tokens, a client or a drop is censored, not scored). Wide "
             "by nature: it is one distribution's mean against each request's draw.",
             band("pace_output_length_prediction_error_ratio"), "short", w=8, minv=0),
    ], 8)

    def query_var(name, label, query, multi=True):
        return {"name": name, "label": label, "type": "query", "datasource": DS, "query": query, "definition": query,
                "refresh": 2, "sort": 1, "multi": multi, "includeAll": True, "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "regex": "", "hide": 0}

    def textbox(name, label, value, desc):
        return {"name": name, "label": label, "type": "textbox", "query": value, "description": desc, "hide": 0,
                "current": {"selected": False, "text": value, "value": value}, "options": [{"selected": True, "text": value, "value": value}]}

    templating = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "hide": 0,
         "current": {"selected": False, "text": "Prometheus", "value": "pace-prometheus"}, "options": [], "regex": "",
         "refresh": 1, "includeAll": False, "multi": False},
        query_var("model", "Model", "label_values(pace_num_requests_running, model_name)"),
        query_var("scheduler", "Scheduler", 'label_values(pace_num_requests_running{model_name=~"$model"}, scheduler)'),
        query_var("instance", "Instance",
                  'label_values(pace_num_requests_running{model_name=~"$model", scheduler=~"$scheduler"}, instance)'),
        textbox("ttft_slo", "TTFT SLO (s)", "2", "TTFT threshold in seconds; must be a bucket boundary (the server's --slo ttft)."),
        textbox("tpot_slo", "TPOT SLO (s)", "0.1", "TPOT threshold in seconds; must be a bucket boundary (the server's --slo tpot)."),
    ]
    return {
        "uid": "pace",
        "title": "pace: goodput and user experience",
        "description": "pace LLM inference server: smooth and binary goodput, user-experienced latency, load and engine, "
                       "per scheduler for A/B tests. Built by deploy/grafana/build_dashboard.py.",
        "tags": ["pace", "llm", "inference"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                                  "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                                  "type": "dashboard"}]},
        "templating": {"list": templating},
        "panels": b.panels,
    }


def render():
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pace.json")
    text = render()
    if "--check" in sys.argv:
        with open(out, encoding="utf-8") as f:
            sys.exit(0 if f.read() == text else "pace.json is stale: run python3 deploy/grafana/build_dashboard.py")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {out}")
