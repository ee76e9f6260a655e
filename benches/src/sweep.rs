//! Offered-load sweeps of one or several targets, and their report directory.
//!
//! A sweep runs the same prompts (same seed) at each offered load: a list of request rates
//! (arrival gaps scale with the rate, the seed fixes their shape) or a list of concurrency caps.
//! Every target of an A/B run gets the identical workload. The report directory holds:
//! - `report.md`: workload, SLO, per-target capacity and peak smooth goodput, one table per load;
//! - `sweep.json`: every point's summary;
//! - `points/<target>-<load>.json`: each run's full result (vLLM field names, timelines);
//! - one SVG and one PNG per metric against offered load, and `overview.svg`/`.png`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use pace_scheduler::slo::{capacity, BinarySlo, SloParams};
use serde::{Deserialize, Serialize};

use crate::arrivals::ArrivalProcess;
use crate::client::Target;
use crate::load::{run_load, LoadOptions, Workload};
use crate::plots::{write_chart, write_grid, Chart, Line, Threshold};
use crate::report::{summarize, table, BenchResult, RunInfo};

/// What the sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// Offered request rate, requests per second.
    RequestRate,
    /// Concurrency cap (closed loop at the given request rate, default all at once).
    Concurrency,
}

impl Axis {
    /// X axis description with unit.
    pub fn describe(&self) -> &'static str {
        match self {
            Axis::RequestRate => "offered load (requests / s)",
            Axis::Concurrency => "max concurrency (requests in flight)",
        }
    }

    fn unit(&self) -> &'static str {
        match self {
            Axis::RequestRate => "req/s",
            Axis::Concurrency => "in flight",
        }
    }
}

/// One load of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Request rate (`inf`: all at once).
    pub rate: f64,
    /// Concurrency cap.
    pub max_concurrency: Option<usize>,
}

/// What stays fixed across the points of a sweep.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// Prompts, identical for every point and target.
    pub prompts: Vec<crate::dataset::Prompt>,
    /// Arrival seed.
    pub seed: u64,
    /// Gamma shape of arrival gaps.
    pub burstiness: f64,
    /// Run bounds and request options (the concurrency cap is set per point).
    pub options: LoadOptions,
    /// Recorded with each result.
    pub info: RunInfo,
    /// The varied quantity.
    pub axis: Axis,
    /// The loads, in order.
    pub loads: Vec<Load>,
    /// One line describing the workload, for the report.
    pub workload_desc: String,
}

impl SweepSpec {
    fn x(&self, load: &Load) -> f64 {
        match self.axis {
            Axis::RequestRate => load.rate,
            Axis::Concurrency => load.max_concurrency.unwrap_or(0) as f64,
        }
    }
}

/// A point's numbers for tables and plots (seconds for latencies).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointSummary {
    /// Target label.
    pub label: String,
    /// Offered load on the sweep's axis.
    pub load: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Delivered output tokens per second.
    pub output_throughput: f64,
    /// Passed requests per second.
    pub request_goodput: f64,
    /// Output tokens of passed requests per second.
    pub token_goodput: f64,
    /// Benefit per second.
    pub smooth_goodput: f64,
    /// Passed over completed.
    pub attainment: f64,
    /// Passed over sent.
    pub attainment_offered: f64,
    /// Seconds.
    pub ttft_p50: f64,
    /// Seconds.
    pub ttft_p99: f64,
    /// Seconds.
    pub tpot_p50: f64,
    /// Seconds.
    pub tpot_p99: f64,
    /// Seconds.
    pub idle_p50: f64,
    /// Seconds.
    pub idle_p99: f64,
    /// Seconds.
    pub e2e_p99: f64,
    /// Completed requests.
    pub completed: usize,
    /// HTTP/stream errors.
    pub failed: usize,
    /// 429/503 at admission.
    pub rejected: usize,
    /// Dropped by the server.
    pub dropped: usize,
    /// Aborted.
    pub aborted: usize,
    /// Never sent.
    pub not_sent: usize,
    /// File with the full result, relative to the report directory.
    pub result_file: String,
}

impl PointSummary {
    fn of(r: &BenchResult, load: f64, result_file: String) -> Self {
        let s = &r.stats;
        Self {
            label: r.label.clone(),
            load,
            request_throughput: s.request_throughput,
            output_throughput: s.output_throughput,
            request_goodput: s.request_goodput,
            token_goodput: s.token_goodput,
            smooth_goodput: s.smooth_goodput,
            attainment: s.attainment,
            attainment_offered: s.attainment_offered,
            ttft_p50: s.ttft.p50,
            ttft_p99: s.ttft.p99,
            tpot_p50: s.tpot.p50,
            tpot_p99: s.tpot.p99,
            idle_p50: s.idle.p50,
            idle_p99: s.idle.p99,
            e2e_p99: s.e2e.p99,
            completed: s.completed,
            failed: s.failed,
            rejected: s.rejected,
            dropped: s.dropped,
            aborted: s.aborted,
            not_sent: r.not_sent,
            result_file,
        }
    }
}

fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

/// Runs every load of `spec` against `target`, writing each full result under `dir/points/`.
pub async fn run_series(client: &reqwest::Client, target: &Target, spec: &SweepSpec, dir: &Path) -> Result<Vec<PointSummary>> {
    let points_dir = dir.join("points");
    std::fs::create_dir_all(&points_dir).with_context(|| format!("creating {}", points_dir.display()))?;
    let mut out = Vec::new();
    for load in &spec.loads {
        let schedule = ArrivalProcess::new(load.rate, spec.burstiness)?.schedule(spec.prompts.len(), spec.seed);
        let workload = Workload { prompts: spec.prompts.clone(), schedule };
        let opts = LoadOptions { max_concurrency: load.max_concurrency, ..spec.options.clone() };
        let info = RunInfo {
            label: target.label.clone(),
            url: target.url(),
            model_id: target.model.clone(),
            request_rate: load.rate,
            max_concurrency: load.max_concurrency,
            ..spec.info.clone()
        };
        let x = spec.x(load);
        eprintln!("[{}] offered load {x} {} ...", target.label, spec.axis.unit());
        let run = run_load(client, target, &workload, &opts).await;
        let result = summarize(&run, &info);
        eprint!("{}", table(&result));
        let file = format!("points/{}-{}.json", slug(&target.label), slug(&format!("{x}")));
        std::fs::write(dir.join(&file), serde_json::to_string(&result)?).with_context(|| format!("writing {file}"))?;
        out.push(PointSummary::of(&result, x, file));
    }
    Ok(out)
}

/// Per-target headline numbers of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    /// Target label.
    pub label: String,
    /// Highest load with at least 90% of sent requests passing the binary SLO (DistServe).
    pub capacity_90: Option<f64>,
    /// Load at which smooth goodput peaked, and the peak.
    pub smooth_peak: Option<(f64, f64)>,
    /// Largest request goodput, req/s.
    pub max_request_goodput: f64,
    /// Largest token goodput, tok/s.
    pub max_token_goodput: f64,
}

/// Headline numbers of one target's points. Capacity uses attainment over requests sent, so a
/// server cannot raise it by rejecting requests.
pub fn headline(label: &str, points: &[PointSummary]) -> Headline {
    let att: Vec<(f64, f64)> = points.iter().map(|p| (p.load, p.attainment_offered)).collect();
    let smooth_peak = points.iter().max_by(|a, b| a.smooth_goodput.total_cmp(&b.smooth_goodput)).map(|p| (p.load, p.smooth_goodput));
    Headline {
        label: label.to_string(),
        capacity_90: capacity(&att, 0.9),
        smooth_peak,
        max_request_goodput: points.iter().map(|p| p.request_goodput).fold(0.0, f64::max),
        max_token_goodput: points.iter().map(|p| p.token_goodput).fold(0.0, f64::max),
    }
}

type Metric = (&'static str, &'static str, &'static str, fn(&PointSummary) -> f64);

/// Plotted metrics: file stem, title, unit, value (already in the unit).
const METRICS: [Metric; 14] = [
    ("output_throughput", "Output token throughput", "tokens / s", |p| p.output_throughput),
    ("request_throughput", "Request throughput", "requests / s", |p| p.request_throughput),
    ("request_goodput", "Request goodput (binary SLO)", "requests / s", |p| p.request_goodput),
    ("token_goodput", "Token goodput (binary SLO)", "tokens / s", |p| p.token_goodput),
    ("smooth_goodput", "Smooth goodput", "benefit / s", |p| p.smooth_goodput),
    ("attainment", "SLO attainment (of requests sent)", "fraction of requests", |p| p.attainment_offered),
    ("ttft_p50", "TTFT p50", "seconds", |p| p.ttft_p50),
    ("ttft_p99", "TTFT p99", "seconds", |p| p.ttft_p99),
    ("tpot_p50", "TPOT p50", "milliseconds", |p| p.tpot_p50 * 1e3),
    ("tpot_p99", "TPOT p99", "milliseconds", |p| p.tpot_p99 * 1e3),
    ("idle_p50", "User idle latency p50", "seconds", |p| p.idle_p50),
    ("idle_p99", "User idle latency p99", "seconds", |p| p.idle_p99),
    ("rejected", "Rejected at admission (429/503)", "requests", |p| p.rejected as f64),
    ("failed_dropped", "Failed + dropped + aborted", "requests", |p| (p.failed + p.dropped + p.aborted) as f64),
];

fn threshold(name: &str, slo: &BinarySlo) -> Option<Threshold> {
    match name {
        "ttft_p50" | "ttft_p99" => slo.ttft.map(|v| Threshold { value: v, label: format!("SLO: TTFT {} ms", v * 1e3) }),
        "tpot_p50" | "tpot_p99" => slo.tpot.map(|v| Threshold { value: v * 1e3, label: format!("SLO: TPOT {} ms", v * 1e3) }),
        "attainment" => Some(Threshold { value: 0.9, label: "90% (capacity)".into() }),
        _ => None,
    }
}

/// Builds the charts of a sweep.
pub fn charts(series: &[(String, Vec<PointSummary>)], axis: Axis, params: &SloParams, has_slo: bool) -> Vec<Chart> {
    METRICS
        .iter()
        .filter(|m| has_slo || !matches!(m.0, "request_goodput" | "token_goodput" | "attainment"))
        .map(|(name, title, unit, value)| Chart {
            name: name.to_string(),
            title: title.to_string(),
            x_desc: axis.describe().to_string(),
            y_desc: unit.to_string(),
            lines: series
                .iter()
                .map(|(label, pts)| Line::new(label.clone(), pts.iter().map(|p| (p.load, value(p))).collect()))
                .collect(),
            threshold: if has_slo { threshold(name, &params.binary) } else { None },
            ceiling: None,
        })
        .collect()
}

/// Writes `report.md`, `sweep.json` and the plots for `series` into `dir`.
pub fn write_report(dir: &Path, title: &str, spec: &SweepSpec, series: &[(String, Vec<PointSummary>)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let params = &spec.info.params;
    let has_slo = spec.info.has_slo;
    let heads: Vec<Headline> = series.iter().map(|(l, p)| headline(l, p)).collect();
    let json = serde_json::json!({
        "title": title,
        "axis": spec.axis,
        "workload": spec.workload_desc,
        "seed": spec.seed,
        "params": params,
        "has_slo": has_slo,
        "headlines": heads,
        "series": series.iter().map(|(l, p)| serde_json::json!({"label": l, "points": p})).collect::<Vec<_>>(),
    });
    std::fs::write(dir.join("sweep.json"), serde_json::to_string_pretty(&json)?)?;
    let charts = charts(series, spec.axis, params, has_slo);
    for c in &charts {
        write_chart(dir, c)?;
    }
    let overview: Vec<&Chart> = ["smooth_goodput", "token_goodput", "request_goodput", "attainment", "output_throughput", "ttft_p99", "tpot_p99", "idle_p99", "rejected"]
        .iter()
        .filter_map(|n| charts.iter().find(|c| c.name == *n))
        .collect();
    write_grid(dir, "overview", &overview, 3)?;
    std::fs::write(dir.join("report.md"), markdown(title, spec, series, &heads, &charts))?;
    Ok(())
}

fn fmt_load(v: Option<f64>, unit: &str) -> String {
    v.map_or("none reached".to_string(), |v| format!("{v} {unit}"))
}

fn markdown(title: &str, spec: &SweepSpec, series: &[(String, Vec<PointSummary>)], heads: &[Headline], charts: &[Chart]) -> String {
    let p = &spec.info.params;
    let unit = spec.axis.unit();
    let mut md = format!("# {title}\n\n");
    let _ = writeln!(md, "- Workload: {}", spec.workload_desc);
    let loads: Vec<String> = spec.loads.iter().map(|l| format!("{}", spec.x(l))).collect();
    let _ = writeln!(
        md,
        "- Offered loads ({}): {} {unit}; the same seeded prompts at every load and for every target",
        spec.axis.describe(),
        loads.join(", ")
    );
    let _ = writeln!(
        md,
        "- Binary SLO (`--goodput`): {}",
        if spec.info.has_slo { format!("`{}`", p.binary) } else { "none given: every completed request passes".into() }
    );
    let _ = writeln!(
        md,
        "- Smooth goodput: reading rate q = {} tok/s, first-token grace g = {} ms, alpha = {}, penalty f = {}",
        p.default_class.reading_rate,
        p.default_class.grace * 1e3,
        p.alpha,
        p.penalty
    );
    let _ = writeln!(md, "- Timestamps are the client's: a request arrives when it is sent, a token when its SSE frame is read.");
    let _ = writeln!(
        md,
        "- Capacity is DistServe's: the highest offered load at which at least 90% of the requests sent pass the SLO \
         (rejected, dropped and failed requests count as missing it); the sweep's spacing is its resolution.\n"
    );
    md.push_str("## Headline\n\n| target | capacity at 90% attainment | peak smooth goodput (/s) | at load | max request goodput (req/s) | max token goodput (tok/s) |\n|---|---|---|---|---|---|\n");
    for h in heads {
        let (at, peak) = h.smooth_peak.map_or(("-".into(), "-".into()), |(l, v)| (format!("{l} {unit}"), format!("{v:.1}")));
        let _ = writeln!(
            md,
            "| {} | {} | {peak} | {at} | {:.2} | {:.1} |",
            h.label,
            if spec.info.has_slo { fmt_load(h.capacity_90, unit) } else { "n/a (no SLO)".into() },
            h.max_request_goodput,
            h.max_token_goodput
        );
    }
    md.push_str("\n![overview](overview.png)\n\n## Per load\n");
    let head = [
        "target", "req/s", "out tok/s", "goodput req/s", "goodput tok/s", "smooth goodput", "attain (sent)", "TTFT p50", "TTFT p99",
        "TPOT p50", "TPOT p99", "idle p50", "idle p99", "completed", "failed", "rejected", "dropped", "aborted",
    ];
    let mut loads: Vec<f64> = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.load)).collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup();
    for load in loads {
        let _ = writeln!(md, "\n### {load} {unit}\n\n| {} |\n|{}", head.join(" | "), "---|".repeat(head.len()));
        for (label, pts) in series {
            for x in pts.iter().filter(|x| x.load == load) {
                let _ = writeln!(
                    md,
                    "| [{label}]({}) | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1}% | {:.3} s | {:.3} s | {:.1} ms | {:.1} ms | {:.2} s | {:.2} s | {} | {} | {} | {} | {} |",
                    x.result_file,
                    x.request_throughput,
                    x.output_throughput,
                    x.request_goodput,
                    x.token_goodput,
                    x.smooth_goodput,
                    x.attainment_offered * 100.0,
                    x.ttft_p50,
                    x.ttft_p99,
                    x.tpot_p50 * 1e3,
                    x.tpot_p99 * 1e3,
                    x.idle_p50,
                    x.idle_p99,
                    x.completed,
                    x.failed,
                    x.rejected,
                    x.dropped,
                    x.aborted
                );
            }
        }
    }
    md.push_str("\n## Plots\n\n");
    for c in charts {
        let _ = writeln!(md, "- {}: [SVG]({n}.svg), [PNG]({n}.png)", c.title, n = c.name);
    }
    md.push_str("\nFull results with per-request timelines: `points/*.json` (vLLM result-file field names).\n");
    md
}
