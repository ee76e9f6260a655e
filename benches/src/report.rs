//! One run's result: metrics from `pace_scheduler::slo`, the vLLM-style table, and the result
//! file.
//!
//! Every number comes from [`WindowStats`] over the run's *counted* requests and its
//! measurement window (client-side arrival and delivery times, metrics.md; the window and what
//! is counted: [`crate::load`]). The JSON uses the field names of `vllm bench serve`'s result
//! file where the concept is the same (`duration`, `completed`, `failed`, `request_throughput`,
//! `request_goodput`, `output_throughput`, `mean_ttft_ms`, `p99_tpot_ms`, ...), adds pace's
//! (`rejected`, `dropped`, `aborted`, `abandoned`, `token_goodput`, `smooth_goodput`,
//! `benefit_per_request`, `attainment`, `*_idle_ms`, the shares and the latencies over
//! everyone, named as `pace sim --json` names them) and per-request timelines. Differences from
//! vLLM: `duration` is the measurement window, and the counts are of counted requests; `failed`
//! counts HTTP and stream errors only; rejections (429/503), drops, aborts and clients who left
//! have their own counts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use pace_scheduler::slo::{Dist, Outcome, SloClass, SloParams, WindowStats};
use serde::{Deserialize, Serialize};

use crate::client::RequestResult;
use crate::load::LoadRun;

/// How a run was set up (recorded with its result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Name in reports (a target label).
    pub label: String,
    /// `openai` (completions) or `openai-chat`, as vLLM names its backends.
    pub backend: String,
    /// Base URL and endpoint.
    pub url: String,
    /// Model name sent.
    pub model_id: String,
    /// Tokenizer used to count prompt tokens.
    pub tokenizer_id: String,
    /// Requests in the workload.
    pub num_prompts: usize,
    /// Offered request rate (`inf`: all at once).
    pub request_rate: f64,
    /// Gamma shape of the arrival gaps.
    pub burstiness: f64,
    /// Concurrency cap, if any.
    pub max_concurrency: Option<usize>,
    /// Workload seed.
    pub seed: u64,
    /// Binary SLO and smooth-goodput parameters.
    pub params: SloParams,
    /// Whether a binary SLO was given (`--goodput`); without one goodput fields are null.
    pub has_slo: bool,
    /// `--priority-mix` (FRACTION:PRIORITY), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_mix: Option<String>,
}

/// The counted requests of one priority (reported when the run mixed several).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriorityRow {
    /// vLLM's `priority` (lower is served first).
    pub priority: i64,
    /// The weight of its benefit, `2^-priority`.
    pub weight: f64,
    /// Counted requests of this priority.
    pub counted: usize,
    /// Of them, refused at admission.
    pub rejected_frac: f64,
    /// Of them, whose client left.
    pub abandoned_frac: f64,
    /// Their weighted benefit per request (a refusal scores 0).
    pub benefit_per_request: f64,
    /// Output tokens per second they would receive if served to the end (unweighted).
    pub offered_output_tps: f64,
    /// TPOT p50 of the served ones, seconds.
    pub tpot_p50_served: f64,
}

/// A run's result file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// UTC date and time of the run, `YYYYMMDD-HHMMSS`.
    pub date: String,
    /// See [`RunInfo::backend`].
    pub backend: String,
    /// See [`RunInfo::label`].
    pub label: String,
    /// See [`RunInfo::model_id`].
    pub model_id: String,
    /// See [`RunInfo::tokenizer_id`].
    pub tokenizer_id: String,
    /// See [`RunInfo::num_prompts`].
    pub num_prompts: usize,
    /// Offered rate, a number or `"inf"`.
    pub request_rate: serde_json::Value,
    /// See [`RunInfo::burstiness`].
    pub burstiness: f64,
    /// See [`RunInfo::max_concurrency`].
    pub max_concurrency: Option<usize>,
    /// Measurement window, seconds (see [`crate::load`]); every rate is over it.
    pub duration: f64,
    /// Same as `duration`, under `pace sim`'s name.
    pub window_s: f64,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
    /// Counted requests (sent in the window; closed loop: by place in the sequence).
    pub counted: usize,
    /// Counted requests that were never sent (the time limit or --duration came first).
    pub counted_not_sent: usize,
    /// The run was a closed loop (concurrency cap, everything scheduled at once).
    pub closed_loop: bool,
    /// Completed requests.
    pub completed: usize,
    /// HTTP or stream errors.
    pub failed: usize,
    /// Rejected at admission (HTTP 429/503).
    pub rejected: usize,
    /// Dropped by the server after admission.
    pub dropped: usize,
    /// Aborted (server `finish_reason: abort`, or cut by the time limit).
    pub aborted: usize,
    /// Clients whose patience ran out.
    pub abandoned: usize,
    /// Workload requests never sent.
    pub not_sent: usize,
    /// Prompt tokens of completed requests.
    pub total_input_tokens: usize,
    /// Output tokens delivered, all requests.
    pub total_output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Passed requests per second (null without `--goodput`).
    pub request_goodput: Option<f64>,
    /// Output tokens of passed requests per second (null without `--goodput`).
    pub token_goodput: Option<f64>,
    /// Counted benefit per second of the window.
    pub smooth_goodput: f64,
    /// Half-width of a 95% interval of `smooth_goodput` from the spread of the counted
    /// requests' benefits (`1.96 * sqrt(n) * sd / window`): sampling noise of one run.
    pub smooth_goodput_ci95: f64,
    /// Counted benefit per counted request (a refusal scores 0; closed loops: per request sent).
    pub benefit_per_request: f64,
    /// rejected / counted.
    pub rejected_frac: f64,
    /// dropped / counted.
    pub dropped_frac: f64,
    /// abandoned / counted.
    pub abandoned_frac: f64,
    /// Work on counted requests whose client left, over the work on all counted requests, as
    /// the client can see it: prompt plus delivered tokens of requests that got a token.
    pub wasted_tokens_frac: f64,
    /// Output tokens per second the counted requests would receive if served to the end:
    /// `min(true length, max_tokens)` summed over the window (the true length is the
    /// dataset's `output_len`).
    pub offered_output_tps: f64,
    /// Output tokens delivered to any request (counted or not) during the window, per second:
    /// what the server actually produced then (a sweep's Theta is the largest of these at its
    /// top load).
    pub delivered_tps: f64,
    /// The ceiling `min(offered_output_tps, Theta)`; null until a sweep knows `Theta`.
    pub ceiling: Option<f64>,
    /// `smooth_goodput / ceiling` (closed loops: `benefit_per_request / ceiling`).
    pub ceiling_fraction: Option<f64>,
    /// Seconds, completed requests.
    pub tpot_p50_served: f64,
    /// Seconds, completed requests.
    pub ttft_p99_served: f64,
    /// Seconds, every counted request (one without a token counts its whole wait).
    pub ttft_p99_all: f64,
    /// Seconds, completed requests.
    pub idle_p99_served: f64,
    /// Seconds, every counted request.
    pub idle_p99_all: f64,
    /// Passed over completed (null without `--goodput`).
    pub attainment: Option<f64>,
    /// Passed over every request sent (null without `--goodput`).
    pub attainment_offered: Option<f64>,
    /// Delivered output tokens per second.
    pub output_throughput: f64,
    /// (Prompt tokens of completed + delivered output tokens) per second.
    pub total_token_throughput: f64,
    /// `mean_`, `median_`, `p90_`, `p95_`, `p99_` and `max_` of `ttft`, `tpot`, `itl`, `e2el`
    /// and `idle`, in milliseconds.
    #[serde(flatten)]
    pub latency_ms: BTreeMap<String, f64>,
    /// Prompt tokens per request sent.
    pub input_lens: Vec<usize>,
    /// Output tokens per request sent.
    pub output_lens: Vec<usize>,
    /// TTFT per request sent, seconds (null without a token).
    pub ttfts: Vec<Option<f64>>,
    /// Inter-token gaps per request sent, seconds.
    pub itls: Vec<Vec<f64>>,
    /// Error per request sent (null when completed).
    pub errors: Vec<Option<String>>,
    /// The binary SLO, `--goodput` syntax.
    pub goodput_slo: String,
    /// Setup and SLO parameters.
    pub info: RunInfo,
    /// Every aggregate, seconds.
    pub stats: WindowStats,
    /// Every request sent: timestamps, outcome, status, usage.
    pub timelines: Vec<RequestResult>,
    /// The counted requests by priority, heaviest first (`--priority-mix`); empty when every
    /// counted request weighs 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_priority: Vec<PriorityRow>,
}

/// `YYYYMMDD-HHMMSS` (UTC) of a Unix time.
pub fn utc_stamp(unix_s: u64) -> String {
    let (days, rem) = (unix_s / 86_400, unix_s % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn now_stamp() -> String {
    utc_stamp(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// Aggregates a run's counted requests over its window.
pub fn summarize(run: &LoadRun, info: &RunInfo) -> BenchResult {
    let counted: Vec<&RequestResult> = run.counted_results().collect();
    let records: Vec<_> = counted.iter().map(|r| r.record.clone()).collect();
    let s = WindowStats::aggregate(&records, (run.window.1 - run.window.0).max(0.0), &info.params);
    // Rates over an empty window are 0 (as in `WindowStats`), not infinite.
    let window = if s.window_s > 0.0 { s.window_s } else { f64::INFINITY };
    let completed: Vec<&&RequestResult> = counted.iter().filter(|r| r.record.outcome == Outcome::Completed).collect();
    let total_input_tokens: usize = completed.iter().map(|r| r.prompt_len).sum();
    let mut latency_ms = BTreeMap::new();
    for (name, d) in [("ttft", &s.ttft), ("tpot", &s.tpot), ("itl", &s.itl), ("e2el", &s.e2e), ("idle", &s.idle)] {
        for (stat, v) in dist_fields(d) {
            latency_ms.insert(format!("{stat}_{name}_ms"), v * 1e3);
        }
    }
    let benefits: Vec<f64> = records.iter().map(|r| r.benefit(&info.params)).collect();
    let n = benefits.len() as f64;
    let sd = if benefits.len() > 1 {
        let mean = benefits.iter().sum::<f64>() / n;
        (benefits.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let work = |r: &RequestResult| if r.record.num_tokens() > 0 { r.prompt_len + r.record.num_tokens() } else { 0 };
    let work_all: usize = counted.iter().map(|r| work(r)).sum();
    let work_left: usize = counted.iter().filter(|r| r.record.outcome == Outcome::Abandoned).map(|r| work(r)).sum();
    let offered: usize = counted.iter().map(|r| r.true_len.min(r.max_tokens)).sum();
    let (lo, hi) = run.counted;
    let slo = |v: f64| info.has_slo.then_some(v);
    BenchResult {
        date: now_stamp(),
        backend: info.backend.clone(),
        label: info.label.clone(),
        model_id: info.model_id.clone(),
        tokenizer_id: info.tokenizer_id.clone(),
        num_prompts: info.num_prompts,
        request_rate: if info.request_rate.is_finite() { serde_json::json!(info.request_rate) } else { serde_json::json!("inf") },
        burstiness: info.burstiness,
        max_concurrency: info.max_concurrency,
        duration: s.window_s,
        window_s: s.window_s,
        wall_s: run.wall_s,
        counted: s.offered,
        counted_not_sent: (hi - lo) - counted.len(),
        closed_loop: run.closed_loop,
        completed: s.completed,
        failed: s.failed,
        rejected: s.rejected,
        dropped: s.dropped,
        aborted: s.aborted,
        abandoned: s.abandoned,
        not_sent: run.not_sent,
        total_input_tokens,
        total_output_tokens: s.output_tokens,
        request_throughput: s.request_throughput,
        request_goodput: slo(s.request_goodput),
        token_goodput: slo(s.token_goodput),
        smooth_goodput: s.smooth_goodput,
        smooth_goodput_ci95: 1.96 * n.sqrt() * sd / window,
        benefit_per_request: s.benefit_per_request,
        rejected_frac: s.rejected_frac,
        dropped_frac: s.dropped_frac,
        abandoned_frac: s.abandoned_frac,
        wasted_tokens_frac: if work_all > 0 { work_left as f64 / work_all as f64 } else { 0.0 },
        offered_output_tps: offered as f64 / window,
        delivered_tps: pace_scheduler::slo::delivered_rate(&run.results.iter().map(|r| r.record.clone()).collect::<Vec<_>>(), run.window.0, run.window.1),
        ceiling: None,
        ceiling_fraction: None,
        tpot_p50_served: s.tpot_served.p50,
        ttft_p99_served: s.ttft_served.p99,
        ttft_p99_all: s.ttft_all.p99,
        idle_p99_served: s.idle_served.p99,
        idle_p99_all: s.idle_all.p99,
        attainment: slo(s.attainment),
        attainment_offered: slo(s.attainment_offered),
        output_throughput: s.output_throughput,
        total_token_throughput: (total_input_tokens + s.output_tokens) as f64 / window,
        latency_ms,
        input_lens: run.results.iter().map(|r| r.prompt_len).collect(),
        output_lens: run.results.iter().map(|r| r.record.num_tokens()).collect(),
        ttfts: run.results.iter().map(|r| r.record.ttft()).collect(),
        itls: run.results.iter().map(|r| r.record.itls().collect()).collect(),
        errors: run.results.iter().map(|r| r.error.clone()).collect(),
        goodput_slo: info.params.binary.to_string(),
        info: info.clone(),
        stats: s,
        timelines: run.results.clone(),
        by_priority: by_priority(&counted, window, &info.params),
    }
}

/// The counted requests grouped by their class weight (one group per priority), heaviest
/// first; empty when every request weighs 1.
fn by_priority(counted: &[&RequestResult], window: f64, params: &SloParams) -> Vec<PriorityRow> {
    if counted.iter().all(|r| r.record.class.weight == 1.0) {
        return Vec::new();
    }
    let mut groups: BTreeMap<i64, Vec<&RequestResult>> = BTreeMap::new();
    for r in counted {
        let priority = -(r.record.class.weight.log2().round() as i64);
        groups.entry(priority).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(priority, rs)| {
            let n = rs.len() as f64;
            let count = |o: Outcome| rs.iter().filter(|r| r.record.outcome == o).count() as f64 / n;
            let mut tpot: Vec<f64> =
                rs.iter().filter(|r| r.record.outcome == Outcome::Completed && r.record.token_times.len() > 1).map(|r| r.record.tpot()).collect();
            tpot.sort_by(f64::total_cmp);
            PriorityRow {
                priority,
                weight: SloClass::priority_weight(priority),
                counted: rs.len(),
                rejected_frac: count(Outcome::Rejected),
                abandoned_frac: count(Outcome::Abandoned),
                benefit_per_request: rs.iter().map(|r| r.record.benefit(params)).sum::<f64>() / n,
                offered_output_tps: rs.iter().map(|r| r.true_len.min(r.max_tokens)).sum::<usize>() as f64 / window,
                tpot_p50_served: if tpot.is_empty() { 0.0 } else { pace_scheduler::slo::percentile_sorted(&tpot, 50.0) },
            }
        })
        .collect()
}

fn dist_fields(d: &Dist) -> [(&'static str, f64); 6] {
    [("mean", d.mean), ("median", d.p50), ("p90", d.p90), ("p95", d.p95), ("p99", d.p99), ("max", d.max)]
}

/// The result as a table in the layout of `vllm bench serve`, plus pace's rows.
pub fn table(r: &BenchResult) -> String {
    let mut out = String::new();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<44} {v:<10}");
    };
    let head = |t: &str, fill: char| {
        let t = format!(" {t} ");
        let left = 50usize.saturating_sub(t.chars().count()) / 2;
        let right = 50usize.saturating_sub(t.chars().count() + left);
        format!("{}{t}{}", fill.to_string().repeat(left), fill.to_string().repeat(right))
    };
    let p = &r.info.params;
    row(&head("Serving Benchmark Result", '='), String::new());
    row("Target:", format!("{} ({})", r.label, r.info.url));
    row("Successful requests:", r.completed.to_string());
    row("Failed requests (HTTP/stream errors):", r.failed.to_string());
    row("Rejected requests (429/503):", r.rejected.to_string());
    row("Dropped requests (by the server):", r.dropped.to_string());
    row("Aborted requests:", r.aborted.to_string());
    row("Clients who left (patience):", r.abandoned.to_string());
    if r.not_sent > 0 {
        row("Not sent (duration/time limit):", r.not_sent.to_string());
    }
    if let Some(c) = r.max_concurrency {
        row("Maximum request concurrency:", c.to_string());
    }
    if r.info.request_rate.is_finite() {
        row("Request rate configured (RPS):", format!("{:.2}", r.info.request_rate));
    }
    row("Counted requests:", format!("{} of {} sent", r.counted, r.timelines.len()));
    row("Measurement window (s):", format!("{:.2}", r.duration));
    row("Benchmark duration (s):", format!("{:.2}", r.wall_s));
    row("Total input tokens:", r.total_input_tokens.to_string());
    row("Total generated tokens:", r.total_output_tokens.to_string());
    row("Request throughput (req/s):", format!("{:.2}", r.request_throughput));
    if let (Some(rg), Some(tg), Some(att), Some(atto)) = (r.request_goodput, r.token_goodput, r.attainment, r.attainment_offered) {
        row(&format!("Request goodput (req/s) [{}]:", r.goodput_slo), format!("{rg:.2}"));
        row("Token goodput (tok/s):", format!("{tg:.2}"));
        row("SLO attainment (of completed):", format!("{:.1}%", att * 100.0));
        row("SLO attainment (of sent):", format!("{:.1}%", atto * 100.0));
    }
    row("Output token throughput (tok/s):", format!("{:.2}", r.output_throughput));
    row("Total Token throughput (tok/s):", format!("{:.2}", r.total_token_throughput));
    row(
        &format!("Smooth goodput (/s) [q={} g={}ms a={} f={}]:", p.default_class.reading_rate, p.default_class.grace * 1e3, p.alpha, p.penalty),
        format!("{:.2} ± {:.2}", r.smooth_goodput, r.smooth_goodput_ci95),
    );
    row("Benefit per counted request:", format!("{:.2}", r.benefit_per_request));
    if let (Some(c), Some(f)) = (r.ceiling, r.ceiling_fraction) {
        row("Ceiling (tok/s) and fraction reached:", format!("{c:.2} ({:.1}%)", f * 100.0));
    }
    row(
        "Rejected / dropped / left (share of counted):",
        format!("{:.1}% / {:.1}% / {:.1}%", r.rejected_frac * 100.0, r.dropped_frac * 100.0, r.abandoned_frac * 100.0),
    );
    row("Work on clients who left (client view):", format!("{:.1}%", r.wasted_tokens_frac * 100.0));
    for (key, name, title) in [
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2el", "E2EL", "End-to-end Latency"),
        ("idle", "Idle", "User Idle Latency"),
    ] {
        row(&head(title, '-'), String::new());
        for (stat, label) in [("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")] {
            let v = r.latency_ms.get(&format!("{stat}_{key}_ms")).copied().unwrap_or(0.0);
            row(&format!("{label} {name} (ms):"), format!("{v:.2}"));
        }
    }
    row(&"=".repeat(50), String::new());
    out.lines().map(str::trim_end).collect::<Vec<_>>().join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000");
        assert_eq!(utc_stamp(1_767_225_599), "20251231-235959");
    }
}
