"""End-to-end harness: a real Prometheus (deploy/prometheus config and rules, 1 s scrapes, a temp
data dir, 127.0.0.1 only) scraping pace instances under a short bounded load; then every PromQL
expression of the dashboard and of the rules is evaluated through Prometheus' HTTP API.

Used by test_e2e.py (the real `pace serve`, and the contract stand-in fake_pace.py) and by
render_panels.py. Every wait is bounded; every process started here is stopped by stop_all()
(and by the pytest fixtures' finalizers, and run.sh's trap as a last resort). Standard library
plus PyYAML."""

import atexit
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

import promql

PROCS = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cmd, log_path, env=None):
    """Starts cmd in its own process group, logged to log_path; its group id goes to
    $PACE_DEPLOY_PIDFILE so run.sh's trap can end it if this process dies first."""
    log = open(log_path, "wb")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    PROCS.append(p)
    if os.environ.get("PACE_DEPLOY_PIDFILE"):
        with open(os.environ["PACE_DEPLOY_PIDFILE"], "a") as f:
            f.write(f"{p.pid}\n")
    return p


def stop(p, grace=35.0):
    """SIGTERM (pace drains, then exits 0), SIGKILL after `grace` seconds. Returns the exit code."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    return p.returncode


def stop_all():
    while PROCS:
        stop(PROCS.pop(), grace=10.0)


atexit.register(stop_all)


def http(url, data=None, timeout=10.0, headers=None):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(what, fn, timeout, interval=0.5, proc=None, log=None):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = open(log, errors="replace").read()[-3000:] if log else ""
            raise RuntimeError(f"{what}: process exited with {proc.returncode} while waiting\n{tail}")
        try:
            if fn():
                return
        except Exception as e:  # noqa: BLE001 - keep polling until the deadline
            last = e
        time.sleep(interval)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f} s (last error: {last})")


# --------------------------------------------------------------------------- Prometheus

class Prometheus:
    def __init__(self, binary, targets, workdir, scrape_interval="1s"):
        """Starts Prometheus with deploy/prometheus/prometheus.yml and its rules, scraping
        `targets` (host:port) as job "pace" every scrape_interval, on a free 127.0.0.1 port."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfgdir = os.path.join(workdir, "prometheus")
        shutil.copytree(os.path.join(promql.DEPLOY, "prometheus"), cfgdir)
        with open(os.path.join(cfgdir, "prometheus.yml")) as f:
            cfg = yaml.safe_load(f)
        cfg["global"].update(scrape_interval=scrape_interval, evaluation_interval=scrape_interval,
                             scrape_timeout=scrape_interval)
        for job in cfg["scrape_configs"]:
            if job["job_name"] == "prometheus":
                job["static_configs"] = [{"targets": [f"127.0.0.1:{self.port}"]}]
        # Same file_sd mechanism as compose: replace the compose target list with ours.
        for f in os.listdir(os.path.join(cfgdir, "targets")):
            os.remove(os.path.join(cfgdir, "targets", f))
        with open(os.path.join(cfgdir, "targets", "e2e.yml"), "w") as f:
            yaml.safe_dump([{"targets": list(targets)}], f)
        with open(os.path.join(cfgdir, "prometheus.yml"), "w") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        self.log = os.path.join(workdir, "prometheus.log")
        self.proc = spawn([binary, f"--config.file={cfgdir}/prometheus.yml",
                           f"--storage.tsdb.path={workdir}/tsdb", f"--web.listen-address=127.0.0.1:{self.port}",
                           "--storage.tsdb.retention.time=1h", "--log.level=warn"], self.log)
        wait_until("prometheus ready", lambda: http(self.url + "/-/ready", timeout=2)[0] == 200, 60,
                   proc=self.proc, log=self.log)

    def api(self, path, **params):
        qs = urllib.parse.urlencode(params, doseq=True)
        if path in ("query", "query_range"):  # long expressions: form-encoded POST
            status, body = http(f"{self.url}/api/v1/{path}", data=qs.encode(), timeout=30,
                                headers={"Content-Type": "application/x-www-form-urlencoded"})
        else:
            status, body = http(f"{self.url}/api/v1/{path}" + (f"?{qs}" if qs else ""), timeout=30)
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise RuntimeError(f"{path} {params}: HTTP {status}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr, at=None):
        return self.api("query", query=expr, **({"time": f"{at:.3f}"} if at else {}))["result"]

    def query_range(self, expr, start, end, step):
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step}")["result"]

    def label_values(self, label, match=None):
        return self.api(f"label/{label}/values", **({"match[]": match} if match else {}))

    def targets_up(self):
        active = self.api("targets")["activeTargets"]
        return [t for t in active if t["labels"].get("job") == "pace" and t["health"] == "up"]

    def rule_health(self):
        bad = []
        for g in self.api("rules")["groups"]:
            for r in g["rules"]:
                if r.get("health") == "err":
                    bad.append(f"{r['name']}: {r.get('lastError')}")
        return bad


# --------------------------------------------------------------------------- pace instances

class Instance:
    def __init__(self, name, cmd, port, log, env=None):
        self.name, self.port, self.log = name, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc = spawn(cmd, log, env=env)

    def wait_healthy(self, timeout):
        wait_until(f"{self.name} /health", lambda: http(self.url + "/health", timeout=2)[0] == 200, timeout,
                   proc=self.proc, log=self.log)

    def model_id(self):
        status, body = http(self.url + "/v1/models")
        if status == 200:
            data = json.loads(body).get("data") or []
            if data:
                return data[0]["id"]
        return None


PROMPTS = [
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue, for a child who asks a lot of questions.",
    "List three prime numbers.",
    "Summarise the plot of a detective story in which the butler did not do it, in one paragraph, "
    "keeping the suspense until the last line and naming every suspect once.",
    "Translate 'good morning' into Spanish.",
]


def one_request(inst, model, max_tokens, stream, timeout, rng, constrained=False):
    body = {"prompt": rng.choice(PROMPTS), "max_tokens": max_tokens, "temperature": 0.7, "stream": stream}
    if constrained:
        # A structured output, so the grammar-mask series have data too.
        body["structured_outputs"] = {"regex": "[a-z ,.]{1,200}"}
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(inst.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            frames = 0
            if stream:
                for line in r:
                    if line.startswith(b"data: "):
                        frames += 1
                        if line.strip() == b"data: [DONE]":
                            break
            else:
                r.read()
            return r.status, time.time() - t0, frames
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, time.time() - t0, 0
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        return f"{type(e).__name__}: {e}", time.time() - t0, 0


def run_load(instances, requests_per_instance, concurrency, max_tokens, timeout, deadline_s, seed=1):
    """Bounded load: `requests_per_instance` requests to each instance, at most `concurrency` in
    flight per instance, alternating streaming and non-streaming, every fifth constrained by a
    regex; stops sending at deadline_s.
    Returns {instance name: [status, ...]}."""
    results = {i.name: [] for i in instances}
    stop_at = time.time() + deadline_s
    lock = threading.Lock()

    def worker(inst, model, todo, rng):
        while time.time() < stop_at:
            with lock:
                if not todo:
                    return
                k = todo.pop()
            status, _, _ = one_request(inst, model, max_tokens, stream=(k % 4 != 3), timeout=timeout, rng=rng, constrained=(k % 5 == 4))
            with lock:
                results[inst.name].append(status)
            if status in (429, 503):  # admission said no: back off as Retry-After asks (bounded)
                time.sleep(0.5 + rng.random() * 0.5)

    threads = []
    for n, inst in enumerate(instances):
        model = inst.model_id()
        todo = list(range(requests_per_instance))
        for w in range(concurrency):
            t = threading.Thread(target=worker, args=(inst, model, todo, random.Random(seed * 1000 + n * 10 + w)),
                                 daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join(max(0.0, stop_at - time.time()) + timeout + 5)
    return results


# --------------------------------------------------------------------------- checks

def scrape_contract(inst, strict):
    """Reads an instance's /metrics: every contract metric present, every pace_ series labelled
    model_name and scheduler, and the default SLO thresholds (2 s, 0.1 s) are bucket boundaries.
    Returns (errors, warnings)."""
    status, body = http(inst.url + "/metrics", timeout=10)
    if status != 200:
        return [f"{inst.name}: /metrics answered {status}"], []
    text = body.decode("utf-8", "replace")
    series = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    names = {ln.split("{")[0].split(" ")[0] for ln in series}
    errors, warnings = [], []
    for m in sorted(promql.CONTRACT):
        if m not in names:
            base = next((c for c in promql.EVENT_COUNTERS if m == c), None) or (m if m in promql.EVENT_SERIES else None)
            msg = f"{inst.name}: /metrics has no {m}"
            if base and not strict:
                warnings.append(msg + " (an event counter the load may not have caused; register it at 0 at start-up)")
            else:
                errors.append(msg)
    if any('scheduler="smooth"' in ln for ln in series if ln.startswith("pace_")):
        errors += [f"{inst.name}: smooth's /metrics has no {m}" for m in sorted(promql.SMOOTH_SERIES) if m not in names]
    for ln in series:
        if ln.startswith("pace_") and not ("model_name=" in ln and "scheduler=" in ln):
            errors.append(f"{inst.name}: series without model_name/scheduler: {ln[:120]}")
            break
    for metric, want in (("pace_time_to_first_token_seconds", ("2", "2.0")), ("pace_request_time_per_output_token_seconds", ("0.1",))):
        les = {ln.split('le="')[1].split('"')[0] for ln in series if ln.startswith(metric + "_bucket") and 'le="' in ln}
        if les and not les & set(want):
            errors.append(f"{inst.name}: {metric} has no bucket le={want[0]} (the default SLO threshold); has {sorted(les)}")
    return errors, warnings


def has_data(result):
    """(non-empty, has a finite value) of a query result (vector, matrix or scalar)."""
    if not result:
        return False, False
    finite = False
    for s in result if isinstance(result, list) else [result]:
        vals = [s["value"]] if "value" in s else s.get("values", [])
        finite |= any(math.isfinite(float(v[1])) for v in vals)
    return True, finite


def variable_values(prom, dash):
    """Resolves the dashboard's query variables in order, as Grafana does on load (All selected),
    and returns ({var: value for substitution}, {var: [values]}, errors)."""
    values = {"__rate_interval": "1m", "__range": "10m", "__interval": "5s"}
    found, errors = {}, []
    for v in dash["templating"]["list"]:
        if v["type"] == "datasource":
            continue
        if v["type"] in ("textbox", "constant", "custom"):
            values[v["name"]] = v["current"]["value"] if isinstance(v["current"]["value"], str) else v["query"]
            continue
        selector, label = promql.variable_query(v)
        selector = promql.substitute(selector, values) if selector else None
        try:
            vals = prom.label_values(label, match=selector)
        except Exception as e:  # noqa: BLE001
            errors.append(f"variable ${v['name']}: {e}")
            vals = []
        if not vals:
            errors.append(f"variable ${v['name']} resolves to nothing (label_values({selector}, {label}))")
        found[v["name"]] = vals
        # The model is pinned to the first value (exercising the escaped single-value path); the
        # others stay at All (allValue ".*"), Grafana's default.
        if v["name"] == "model" and vals:
            values[v["name"]] = promql.regex_escape(vals[0])
        else:
            values[v["name"]] = v.get("allValue") or ".*"
    return values, found, errors


def evaluate_all(prom, at, strict=True):
    """Evaluates every dashboard query, every variable query, every recording rule and every
    alert's condition operands at time `at`. Returns (report lines, errors, warnings)."""
    dash = promql.load_dashboard()
    report, errors, warnings = [], [], []
    values, found, verr = variable_values(prom, dash)
    errors += verr
    report.append(f"variables: { {k: v for k, v in found.items()} }")
    for title, ref, expr in promql.dashboard_queries(dash, values, repeat_values=found):
        try:
            res = prom.query(expr, at=at)
        except Exception as e:  # noqa: BLE001
            errors.append(f"dashboard '{title}' {ref}: query failed: {e}")
            continue
        nonempty, finite = has_data(res)
        line = f"dashboard '{title}' {ref}: {len(res)} series"
        event_only = promql.metric_names(expr) and promql.metric_names(expr) <= promql.EVENT_SERIES
        if not nonempty and not strict and event_only:
            warnings.append(line + " - no data (only events this load may not cause)")
        elif not nonempty:
            errors.append(line + f" - NO DATA\n    {expr}")
        elif not finite:
            errors.append(line + f" - only NaN/Inf values\n    {expr}")
        report.append(line)
    for fname in ("recording.yml", "alerts.yml"):
        with open(os.path.join(promql.RULES_DIR, fname)) as f:
            groups = yaml.safe_load(f)["groups"]
        for g in groups:
            for r in g["rules"]:
                if "record" in r:
                    res = prom.query(r["record"], at=at)
                    line = f"recording {r['record']}: {len(res)} series"
                    if not res and not strict and r["record"] in promql.EVENT_SERIES:
                        warnings.append(line + " - no data (an event this load may not cause)")
                    else:
                        (report if res else errors).append(line if res else line + " - NO DATA")
                    continue
                name = r["alert"]
                try:
                    prom.query(r["expr"], at=at)  # the whole condition evaluates (e.g. no many-to-many match)
                except Exception as e:  # noqa: BLE001
                    errors.append(f"alert {name}: condition fails to evaluate: {e}")
                    continue
                for operand in promql.condition_operands(r["expr"]):
                    res = prom.query(operand, at=at)
                    line = f"alert {name} operand `{' '.join(operand.split())}`: {len(res)} series"
                    if res:
                        report.append(line)
                    elif not strict and promql.metric_names(operand) & (set(promql.EVENT_COUNTERS) | {
                            "model_scheduler:pace_requests_rejected:rate5m"}):
                        warnings.append(line + " - no data (event counter never incremented by this load)")
                    else:
                        errors.append(line + " - NO DATA")
    bad_rules = prom.rule_health()
    errors += [f"rule evaluation error: {b}" for b in bad_rules]
    return report, errors, warnings


def write_report(path, report, errors, warnings):
    with open(path, "w") as f:
        f.write("\n".join(report) + "\n\nERRORS\n" + "\n".join(errors or ["none"]) + "\n\nWARNINGS\n"
                + "\n".join(warnings or ["none"]) + "\n")


def prometheus_binary():
    for env, name in (("PROMETHEUS", "prometheus"),):
        if os.environ.get(env):
            return os.environ[env]
        found = shutil.which(name)
        if found:
            return found
    return None


def tmpdir(prefix):
    return tempfile.mkdtemp(prefix=prefix)


if __name__ == "__main__":
    sys.exit("import this module; run deploy/test/run.sh")
