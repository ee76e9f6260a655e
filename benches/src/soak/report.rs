//! Judging a soak and writing it up: the pass/fail checks over what the run recorded
//! ([`judge`]), `soak.json`'s [`SoakReport`], and report.md ([`markdown`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::*;
use crate::provenance::Provenance;

/// Least-squares slope of y over x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 3 {
        return None;
    }
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    Some(points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx)
}

/// One pass/fail check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short name.
    pub name: &'static str,
    /// `pass`, `FAIL` or `not judged`.
    pub verdict: &'static str,
    /// The numbers behind it.
    pub detail: String,
}

fn check(name: &'static str, ok: bool, detail: String) -> Check {
    Check { name, verdict: if ok { "pass" } else { "FAIL" }, detail }
}

/// Everything a soak measured (soak.json).
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// Command, commit, machine, date.
    pub provenance: Provenance,
    /// The target and its policy (when started here).
    pub target: String,
    /// Served model name.
    pub model: String,
    /// Seed of the mix, arrivals and departures.
    pub seed: u64,
    /// Measured saturation, requests per second (None when --request-rate was given).
    pub saturation_rps: Option<f64>,
    /// Offered requests per second.
    pub offered_rps: f64,
    /// Seconds of load.
    pub duration_s: f64,
    /// Requests sent.
    pub sent: usize,
    /// Requests by how they ended.
    pub by_kind: BTreeMap<String, usize>,
    /// Leaving clients by moment.
    pub left_by_moment: BTreeMap<String, usize>,
    /// Requests by client-observed status (`none`: no head read).
    pub by_status: BTreeMap<String, usize>,
    /// Server counters' growth over the load and drain.
    pub server_delta: Counters,
    /// Slow connections.
    pub slow: SlowStats,
    /// Slowest /health answer, seconds.
    pub health_max_s: f64,
    /// /health probes that did not answer 200.
    pub health_not_ok: usize,
    /// RSS slope over the judged window, MB per minute.
    pub rss_slope_mb_per_min: Option<f64>,
    /// RSS at the start and the end of the load, MB.
    pub rss_mb: (f64, f64),
    /// The server after the drain.
    pub idle_after: Sample,
    /// Seconds from the end of sending to idle.
    pub drain_s: f64,
    /// The checks.
    pub checks: Vec<Check>,
    /// Every check passed (or was not judged).
    pub passed: bool,
    /// /metrics samples every 5 s.
    pub samples: Vec<Sample>,
    /// /health probes.
    pub probes: Vec<Probe>,
    /// Every request.
    pub requests: Vec<Record>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn judge(
    a: &SoakArgs,
    provenance: Provenance,
    target: String,
    model: String,
    seed: u64,
    saturation_rps: Option<f64>,
    offered_rps: f64,
    sent: usize,
    requests: Vec<Record>,
    before: Counters,
    after: Counters,
    slow: &Mutex<SlowStats>,
    probes: &Mutex<Vec<Probe>>,
    samples: &Mutex<Vec<Sample>>,
    idle_after: Sample,
    drain_s: f64,
    load_end: f64,
) -> SoakReport {
    let (mut by_kind, mut left_by_moment, mut by_status) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for r in &requests {
        count(&mut by_kind, r.ended.kind.to_string());
        if r.ended.kind == "left" {
            count(&mut left_by_moment, r.ended.detail.clone().unwrap_or_default());
        }
        count(&mut by_status, r.ended.status.map_or("none".to_string(), |s| s.to_string()));
    }
    let kind = |k: &str| by_kind.get(k).copied().unwrap_or(0);
    let server_delta = Counters {
        http: delta(&after.http, &before.http),
        finished: delta(&after.finished, &before.finished),
        rejected: delta(&after.rejected, &before.rejected),
        prefix_cache: delta(&after.prefix_cache, &before.prefix_cache),
    };
    let mut checks = Vec::new();

    let deliberate = kind("shed") + kind("dropped");
    let shed_without_retry = requests.iter().filter(|r| matches!(r.ended.kind, "shed" | "rejected") && !r.ended.retry_after).count();
    // A client that left during admission may have seen a 503 head without its body: the
    // server's counters judge those (every 503 it sent is one drop-late drop).
    let client_5xx = requests.iter().filter(|r| r.ended.status.is_some_and(|s| s >= 500) && matches!(r.ended.kind, "http_error")).count();
    let server_other_5xx = server_delta.http.iter().filter(|(s, _)| s.starts_with('5') && s.as_str() != "503").map(|(_, v)| *v).fold(0.0, |x, y| x + y);
    let server_503 = server_delta.http.get("503").copied().unwrap_or(0.0);
    let server_deliberate = server_delta.finished.get("dropped").copied().unwrap_or(0.0);
    checks.push(check(
        "no 5xx",
        client_5xx == 0 && kind("stream_error") == 0 && server_other_5xx == 0.0 && server_503 <= server_deliberate && shed_without_retry == 0,
        format!(
            "{client_5xx} unexpected 5xx seen by clients, {} error events in streams, {server_other_5xx} 5xx other than 503 counted by the server, {server_503} 503s counted for {server_deliberate} drop-late drops; deliberate load shedding seen by clients: {deliberate} (429 predicted_late {}, drop-late {}); refusals without Retry-After {shed_without_retry}",
            kind("stream_error"),
            kind("shed"),
            kind("dropped")
        ),
    ));
    let unserved = kind("incomplete") + kind("transport_error") + kind("timeout") + kind("http_error");
    checks.push(check(
        "served",
        unserved == 0 && requests.len() == sent,
        format!(
            "of {sent} sent, {} ended: {} completed, {} left, {} refused (queue bounds {}, predicted late or dropped {}); {} incomplete, {} transport errors, {} timeouts, {} other HTTP errors",
            requests.len(),
            kind("completed"),
            kind("left"),
            kind("rejected") + deliberate,
            kind("rejected"),
            deliberate,
            kind("incomplete"),
            kind("transport_error"),
            kind("timeout"),
            kind("http_error")
        ),
    ));
    let http_total: f64 = server_delta.http.values().fold(0.0, |x, y| x + y);
    let finished_total: f64 = server_delta.finished.values().fold(0.0, |x, y| x + y);
    let choices_sent: usize = requests.iter().map(|r| r.plan.n).sum();
    let choices_200: usize = requests.iter().filter(|r| r.ended.status == Some(200)).map(|r| r.plan.n).sum();
    checks.push(check(
        "accounted",
        http_total == sent as f64 && finished_total >= choices_200 as f64 && finished_total <= choices_sent as f64,
        format!(
            "pace_http_requests_total (generation routes) grew by {http_total} for {sent} requests sent ({:?}); pace_requests_total grew by {finished_total}, within [{choices_200} choices answered 200, {choices_sent} choices sent] ({:?})",
            server_delta.http, server_delta.finished
        ),
    ));
    let idle = idle_after.running == 0.0 && idle_after.waiting == 0.0 && idle_after.kv_usage == 0.0 && idle_after.inflight_idle_s == 0.0;
    checks.push(check(
        "idle after",
        idle,
        format!(
            "{drain_s:.0} s after sending stopped: running {}, waiting {}, KV usage {}, in-flight idle gauge {} s",
            idle_after.running, idle_after.waiting, idle_after.kv_usage, idle_after.inflight_idle_s
        ),
    ));
    let samples = samples.lock().unwrap().clone();
    let load_samples: Vec<&Sample> = samples.iter().filter(|s| s.t <= load_end && s.rss_bytes > 0.0).collect();
    let rss_mb = (load_samples.first().map_or(0.0, |s| s.rss_bytes / 1e6), load_samples.last().map_or(0.0, |s| s.rss_bytes / 1e6));
    let window: Vec<(f64, f64)> = load_samples.iter().filter(|s| s.t >= load_end - a.rss_window).map(|s| (s.t / 60.0, s.rss_bytes / 1e6)).collect();
    let rss_slope = slope(&window);
    if load_end < a.rss_window + 60.0 || rss_slope.is_none() {
        checks.push(Check {
            name: "memory",
            verdict: "not judged",
            detail: format!("the load lasted {load_end:.0} s, under the {} s window plus a minute; RSS {:.1} -> {:.1} MB", a.rss_window, rss_mb.0, rss_mb.1),
        });
    } else {
        let s = rss_slope.unwrap_or(0.0);
        checks.push(check(
            "memory",
            s < a.rss_slope_limit,
            format!(
                "RSS grew {s:.3} MB/min over the last {} s of load ({} samples; limit {} MB/min); {:.1} MB at the start of the load, {:.1} MB at its end",
                a.rss_window,
                window.len(),
                a.rss_slope_limit,
                rss_mb.0,
                rss_mb.1
            ),
        ));
    }
    let probes = probes.lock().unwrap().clone();
    let health_max = probes.iter().map(|p| p.latency_s).fold(0.0, f64::max);
    let health_not_ok = probes.iter().filter(|p| p.status != Some(200)).count();
    checks.push(check(
        "health",
        health_not_ok == 0 && health_max <= a.health_limit && !probes.is_empty(),
        format!("{} probes, slowest {:.3} s (limit {} s), {health_not_ok} not 200", probes.len(), health_max, a.health_limit),
    ));
    let slow = slow.lock().unwrap().clone();
    if a.slow_connections > 0 && load_end > a.slow_cut_limit {
        let longest = slow.lifetimes_s.iter().copied().fold(0.0, f64::max);
        checks.push(check(
            "slow connections cut",
            slow.cut >= a.slow_connections && longest <= a.slow_cut_limit,
            format!("{} opened, {} cut, the longest lived {longest:.1} s (limit {} s)", slow.opened, slow.cut, a.slow_cut_limit),
        ));
    }
    let passed = checks.iter().all(|c| c.verdict != "FAIL");
    SoakReport {
        provenance,
        target,
        model,
        seed,
        saturation_rps,
        offered_rps,
        duration_s: a.duration,
        sent,
        by_kind,
        left_by_moment,
        by_status,
        server_delta,
        slow,
        health_max_s: health_max,
        health_not_ok,
        rss_slope_mb_per_min: rss_slope,
        rss_mb,
        idle_after,
        drain_s,
        checks,
        passed,
        samples,
        probes,
        requests,
    }
}

pub(super) fn summary_table(r: &SoakReport) -> String {
    let mut s = String::from("| check | verdict | detail |\n|---|---|---|\n");
    for c in &r.checks {
        s.push_str(&format!("| {} | {} | {} |\n", c.name, c.verdict, c.detail));
    }
    s
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

pub(super) fn markdown(r: &SoakReport, a: &SoakArgs) -> String {
    let mut md = format!("# pace bench soak: {}\n\n{}", if r.passed { "passed" } else { "FAILED" }, r.provenance.markdown());
    md.push_str(&format!("- Target: `{}`, model `{}`\n- Seed: {}\n", r.target, r.model, r.seed));
    match r.saturation_rps {
        Some(s) => md.push_str(&format!(
            "- Saturation: {s:.3} req/s ({} clients in a closed loop for {} s); offered {:.3} req/s ({}x) for {} s\n",
            a.calibrate_concurrency, a.calibrate_s, r.offered_rps, a.overload, r.duration_s
        )),
        None => md.push_str(&format!("- Offered {:.3} req/s (given) for {} s\n", r.offered_rps, r.duration_s)),
    }
    md.push_str(&format!(
        "- Mix: both endpoints, stream and not, n = 1 and 2, max_tokens {}, temperature {}; {}% of clients leave; {} slow connections at one byte per {} s\n\n",
        a.max_tokens,
        a.temperature,
        a.disconnect_fraction * 100.0,
        a.slow_connections,
        a.slow_byte_interval
    ));
    md.push_str("## Checks\n\n");
    md.push_str(&summary_table(r));
    md.push_str("\n## Requests\n\n| how they ended | requests |\n|---|---|\n");
    for (k, v) in &r.by_kind {
        md.push_str(&format!("| {k} | {v} |\n"));
    }
    md.push_str("\n| where leaving clients left | requests |\n|---|---|\n");
    for (k, v) in &r.left_by_moment {
        md.push_str(&format!("| {k} | {v} |\n"));
    }
    md.push_str("\n| status seen by the client | requests |\n|---|---|\n");
    for (k, v) in &r.by_status {
        md.push_str(&format!("| {k} | {v} |\n"));
    }
    md.push_str("\n| server counter | growth |\n|---|---|\n");
    for (k, v) in &r.server_delta.http {
        md.push_str(&format!("| pace_http_requests_total{{status=\"{k}\"}} | {v} |\n"));
    }
    for (k, v) in &r.server_delta.finished {
        md.push_str(&format!("| pace_requests_total{{finished_reason=\"{k}\"}} | {v} |\n"));
    }
    for (k, v) in &r.server_delta.rejected {
        md.push_str(&format!("| pace_requests_rejected_total{{reason=\"{k}\"}} | {v} |\n"));
    }
    for (k, v) in &r.server_delta.prefix_cache {
        md.push_str(&format!("| pace_prefix_cache_{k}_total (prompt tokens) | {v} |\n"));
    }
    let mut life = r.slow.lifetimes_s.clone();
    md.push_str(&format!(
        "\n## Slow connections\n\n{} opened, {} cut by the server (lifetime median {:.1} s, max {:.1} s), {} could not connect. What the server wrote before cutting: {:?}\n",
        r.slow.opened,
        r.slow.cut,
        quantile(&mut life, 0.5),
        quantile(&mut life, 1.0),
        r.slow.connect_failures,
        r.slow.responses
    ));
    md.push_str("\n## Server over time (every 60 s)\n\n| t (s) | RSS (MB) | running | waiting | KV usage | in-flight idle (s) |\n|---|---|---|---|---|---|\n");
    let mut next = 0.0;
    for s in &r.samples {
        if s.t >= next {
            md.push_str(&format!("| {:.0} | {:.1} | {} | {} | {:.3} | {:.2} |\n", s.t, s.rss_bytes / 1e6, s.running, s.waiting, s.kv_usage, s.inflight_idle_s));
            next = s.t + 60.0 - 2.5;
        }
    }
    md.push_str("\nRaw data: `soak.json` (every request, probe and sample).\n");
    md
}
