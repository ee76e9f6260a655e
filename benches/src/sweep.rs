//! Offered-load sweeps of one or several targets, and their report directory.
//!
//! A sweep runs the same prompts (same seed) at each offered load: a list of request rates
//! (arrival gaps scale with the rate, the seed fixes their shape) or a list of concurrency caps.
//! Every target of an A/B run gets the identical workload. The report directory holds:
//! - `report.md`: workload, SLO, per-target capacity and peak smooth goodput, one table per load;
//! - `sweep.json`: every point's summary;
//! - `points/<target>-<load>.json.gz`: each run's full result (vLLM field names, timelines),
//!   gzip-compressed (`zcat` reads it; about a third of the size);
//! - one SVG per metric against offered load, and `overview.svg`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use pace_scheduler::slo::{capacity, BinarySlo, SloParams};
use serde::{Deserialize, Serialize};

use crate::arrivals::ArrivalProcess;
use crate::client::Target;
use crate::load::{run_load, LoadOptions};
use crate::plots::{write_chart, write_grid, Chart, Line, Threshold};
use crate::provenance::Provenance;
use crate::report::{summarize, table, BenchResult, PriorityRow, RunInfo};

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

    /// Unit of a load on this axis.
    pub fn unit(&self) -> &'static str {
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
    /// What clients send as max_tokens.
    pub max_tokens_rule: pace_scheduler::slo::MaxTokensRule,
    /// Each request's patience, seconds.
    pub patience: Vec<f64>,
    /// Each request's priority (empty: none sent).
    pub priority: Vec<i64>,
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
    /// Reuse points already written (`--resume`).
    pub resume: bool,
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
    /// Counted benefit per second of the window.
    pub smooth_goodput: f64,
    /// Half-width of its 95% interval from the spread of the requests' benefits.
    pub smooth_goodput_ci95: f64,
    /// Counted benefit per counted request (closed loops: per request sent).
    pub benefit_per_request: f64,
    /// Measurement window, seconds.
    pub window_s: f64,
    /// Counted requests.
    pub counted: usize,
    /// Output tokens per second the counted requests would receive if served to the end.
    pub offered_output_tps: f64,
    /// Output tokens delivered to any request during the window, per second.
    pub delivered_tps: f64,
    /// The ceiling (open loop: `min(offered_output_tps, Theta)` tok/s; closed loop: best
    /// benefit per request, fluid model), set when the report is written.
    pub ceiling: f64,
    /// `smooth_goodput / ceiling` (closed loop: `benefit_per_request / ceiling`).
    pub ceiling_fraction: f64,
    /// rejected / counted.
    pub rejected_frac: f64,
    /// dropped / counted.
    pub dropped_frac: f64,
    /// abandoned / counted.
    pub abandoned_frac: f64,
    /// Work on clients who left, client view.
    pub wasted_tokens_frac: f64,
    /// Seconds, completed requests.
    pub tpot_p50_served: f64,
    /// Seconds, completed requests.
    pub ttft_p99_served: f64,
    /// Seconds, every counted request.
    pub ttft_p99_all: f64,
    /// Seconds, completed requests.
    pub idle_p99_served: f64,
    /// Seconds, every counted request.
    pub idle_p99_all: f64,
    /// Mean true output length of the counted requests, capped by their max_tokens.
    pub mean_served_len: f64,
    /// The run was a closed loop (a concurrency cap with everything scheduled at once).
    pub closed_loop: bool,
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
    /// Clients who left.
    pub abandoned: usize,
    /// Never sent.
    pub not_sent: usize,
    /// File with the full result, relative to the report directory.
    pub result_file: String,
    /// The counted requests by priority (`--priority-mix`); empty when every counted request
    /// weighs 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_priority: Vec<PriorityRow>,
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
            smooth_goodput_ci95: r.smooth_goodput_ci95,
            benefit_per_request: r.benefit_per_request,
            window_s: r.window_s,
            counted: r.counted,
            offered_output_tps: r.offered_output_tps,
            delivered_tps: r.delivered_tps,
            ceiling: 0.0,
            ceiling_fraction: 0.0,
            rejected_frac: r.rejected_frac,
            dropped_frac: r.dropped_frac,
            abandoned_frac: r.abandoned_frac,
            wasted_tokens_frac: r.wasted_tokens_frac,
            tpot_p50_served: r.tpot_p50_served,
            ttft_p99_served: r.ttft_p99_served,
            ttft_p99_all: r.ttft_p99_all,
            idle_p99_served: r.idle_p99_served,
            idle_p99_all: r.idle_p99_all,
            mean_served_len: r.offered_output_tps * r.window_s / r.counted.max(1) as f64,
            closed_loop: r.closed_loop,
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
            abandoned: s.abandoned,
            not_sent: r.not_sent,
            result_file,
            by_priority: r.by_priority.clone(),
        }
    }
}

/// `s` as a file name: ASCII letters, digits, `.` and `-`, anything else `_`
/// (`smooth:max_loss=0.05` -> `smooth_max_loss_0.05`).
pub fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

fn point_file(label: &str, x: f64) -> String {
    format!("points/{}-{}.json.gz", slug(label), slug(&format!("{x}")))
}

/// Writes one point's full result, gzip-compressed.
fn write_point(path: &Path, result: &BenchResult) -> Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default());
    serde_json::to_writer(&mut gz, result)?;
    gz.finish()?.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads one point's full result: `path` (gzip), or the uncompressed `.json` beside it that
/// sweeps before 2026-12 wrote.
pub fn read_point(path: &Path) -> Result<BenchResult> {
    use std::io::Read;
    let mut text = String::new();
    if path.exists() {
        flate2::read::GzDecoder::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?)
            .read_to_string(&mut text)
            .with_context(|| format!("reading {}", path.display()))?;
    } else {
        let plain = path.with_extension("");
        text = std::fs::read_to_string(&plain).with_context(|| format!("reading {}", plain.display()))?;
    }
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The point of `label` at `load` already in `dir`, when `spec.resume` is set and the file
/// exists. It must have been recorded for the same workload (prompt count, rate, cap, seed,
/// burstiness, SLO, API and tokenizer; the URL may differ): anything else is an error.
fn resumed_point(spec: &SweepSpec, dir: &Path, label: &str, load: &Load) -> Result<Option<PointSummary>> {
    let x = spec.x(load);
    let file = point_file(label, x);
    let path = dir.join(&file);
    if !spec.resume || !(path.exists() || path.with_extension("").exists()) {
        return Ok(None);
    }
    let r = read_point(&path)?;
    let want = RunInfo {
        label: label.to_string(),
        url: r.info.url.clone(),
        model_id: r.info.model_id.clone(),
        request_rate: load.rate,
        max_concurrency: load.max_concurrency,
        ..spec.info.clone()
    };
    if r.info != want {
        bail!("--resume: {} was recorded for another run ({:?}; this one is {:?}); move it away or drop --resume", path.display(), r.info, want);
    }
    Ok(Some(PointSummary::of(&r, x, file)))
}

/// Every point of `label` from `dir` when `--resume` is set and all of them are there; `None`
/// when any has to run.
pub fn resumed_series(spec: &SweepSpec, dir: &Path, label: &str) -> Result<Option<Vec<PointSummary>>> {
    let mut out = Vec::new();
    for load in &spec.loads {
        match resumed_point(spec, dir, label, load)? {
            Some(p) => out.push(p),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Runs every load of `spec` against `target`, writing each full result under `dir/points/`
/// (with `spec.resume`, a point already there is read back instead).
pub async fn run_series(client: &reqwest::Client, target: &Target, spec: &SweepSpec, dir: &Path) -> Result<Vec<PointSummary>> {
    let points_dir = dir.join("points");
    std::fs::create_dir_all(&points_dir).with_context(|| format!("creating {}", points_dir.display()))?;
    let mut out = Vec::new();
    for load in &spec.loads {
        let x = spec.x(load);
        if let Some(p) = resumed_point(spec, dir, &target.label, load)? {
            eprintln!("[{}] offered load {x} {}: reused {}", target.label, spec.axis.unit(), p.result_file);
            out.push(p);
            continue;
        }
        let schedule = ArrivalProcess::new(load.rate, spec.burstiness)?.schedule(spec.prompts.len(), spec.seed);
        let workload = crate::load::workload_for(target, &spec.prompts, schedule, spec.max_tokens_rule, &spec.patience, &spec.priority);
        let opts = LoadOptions { max_concurrency: load.max_concurrency, ..spec.options.clone() };
        let info = RunInfo {
            label: target.label.clone(),
            url: target.url(),
            model_id: target.model.clone(),
            request_rate: load.rate,
            max_concurrency: load.max_concurrency,
            ..spec.info.clone()
        };
        eprintln!("[{}] offered load {x} {} ...", target.label, spec.axis.unit());
        let run = run_load(client, target, &workload, &opts).await;
        let result = summarize(&run, &info);
        eprint!("{}", table(&result));
        let file = point_file(&target.label, x);
        write_point(&dir.join(&file), &result)?;
        out.push(PointSummary::of(&result, x, file));
    }
    Ok(out)
}

/// Per-target headline numbers of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    /// Target label.
    pub label: String,
    /// Highest load with at least 90% of counted requests passing the binary SLO (DistServe).
    pub capacity_90: Option<f64>,
    /// Load at which smooth goodput peaked, and the peak.
    pub smooth_peak: Option<(f64, f64)>,
    /// Lowest fraction of the ceiling over the loads, and the load.
    pub worst_ceiling_fraction: Option<(f64, f64)>,
    /// Largest request goodput, req/s.
    pub max_request_goodput: f64,
    /// Largest token goodput, tok/s.
    pub max_token_goodput: f64,
}

/// Headline numbers of one target's points. Capacity uses attainment over counted requests, so
/// a server cannot raise it by rejecting requests.
pub fn headline(label: &str, points: &[PointSummary]) -> Headline {
    let att: Vec<(f64, f64)> = points.iter().map(|p| (p.load, p.attainment_offered)).collect();
    let smooth_peak = points.iter().max_by(|a, b| a.smooth_goodput.total_cmp(&b.smooth_goodput)).map(|p| (p.load, p.smooth_goodput));
    let worst = points.iter().min_by(|a, b| a.ceiling_fraction.total_cmp(&b.ceiling_fraction)).map(|p| (p.load, p.ceiling_fraction));
    Headline {
        label: label.to_string(),
        capacity_90: capacity(&att, 0.9),
        smooth_peak,
        worst_ceiling_fraction: worst,
        max_request_goodput: points.iter().map(|p| p.request_goodput).fold(0.0, f64::max),
        max_token_goodput: points.iter().map(|p| p.token_goodput).fold(0.0, f64::max),
    }
}

/// The ceiling's `Theta` of a sweep (evaluation.md, point 7): the largest output throughput any
/// target reached at any point, measured as the tokens it delivered during the window (counted
/// tokens over the window would credit a server with tokens it delivered after the window,
/// without bound when clients never leave). Not only the highest load's: under deep overload
/// clients who leave waste prefill, and a server can deliver less at 2x than at 1.5x. And never
/// below a smooth goodput some target reached (which a single run's counted tokens can put a
/// few percent above what it delivered in the window): a target did it, so the best any
/// scheduler could do is at least that; a ceiling below a measured goodput is no ceiling.
/// (With a priority mix smooth goodput is weighted, so its unweighted value, rebuilt from the
/// priorities' rows, stands in.)
pub fn theta(series: &[(String, Vec<PointSummary>)]) -> f64 {
    series.iter().flat_map(|(_, p)| p.iter()).map(|p| p.delivered_tps.max(unweighted_goodput(p))).fold(0.0, f64::max)
}

/// A point's smooth goodput with every request weighing 1.
fn unweighted_goodput(p: &PointSummary) -> f64 {
    if p.by_priority.is_empty() || p.window_s <= 0.0 {
        return p.smooth_goodput;
    }
    p.by_priority.iter().map(|r| r.benefit_per_request / r.weight * r.counted as f64).sum::<f64>() / p.window_s
}

/// Sets every point's ceiling and fraction of it, from `theta`: per request for a closed loop
/// (a concurrency cap with everything scheduled at once), per second otherwise.
pub fn set_ceilings(series: &mut [(String, Vec<PointSummary>)], theta: f64, params: &SloParams) {
    for p in series.iter_mut().flat_map(|(_, p)| p.iter_mut()) {
        (p.ceiling, p.ceiling_fraction) = if p.closed_loop {
            let c = pace_scheduler::sim::closed_loop_ceiling(p.load as usize, p.mean_served_len, theta, params);
            (c, pace_scheduler::slo::ceiling_fraction(p.benefit_per_request, c))
        } else if !p.by_priority.is_empty() {
            // The weighted ceiling: the engine's Theta tokens per second go to the heaviest
            // offered first.
            let offered: Vec<(f64, f64)> = p.by_priority.iter().map(|r| (r.weight, r.offered_output_tps)).collect();
            let c = pace_scheduler::slo::weighted_ceiling(&offered, theta);
            (c, pace_scheduler::slo::ceiling_fraction(p.smooth_goodput, c))
        } else {
            let c = pace_scheduler::slo::ceiling(p.offered_output_tps, theta);
            (c, pace_scheduler::slo::ceiling_fraction(p.smooth_goodput, c))
        };
    }
}

type Metric = (&'static str, &'static str, &'static str, fn(&PointSummary) -> f64, Option<fn(&PointSummary) -> f64>);

/// Plotted metrics: file stem, title, unit, value (already in the unit), 95% half-width.
const METRICS: [Metric; 20] = [
    ("smooth_goodput", "Smooth goodput (counted benefit / window)", "benefit / s", |p| p.smooth_goodput, Some(|p| p.smooth_goodput_ci95)),
    ("ceiling_fraction", "Smooth goodput / ceiling", "fraction of the ceiling", |p| p.ceiling_fraction, None),
    ("benefit_per_request", "Benefit per counted request", "benefit / request", |p| p.benefit_per_request, None),
    ("output_throughput", "Output token throughput (counted)", "tokens / s", |p| p.output_throughput, None),
    ("request_throughput", "Request throughput (counted)", "requests / s", |p| p.request_throughput, None),
    ("request_goodput", "Request goodput (binary SLO)", "requests / s", |p| p.request_goodput, None),
    ("token_goodput", "Token goodput (binary SLO)", "tokens / s", |p| p.token_goodput, None),
    ("attainment", "SLO attainment (of counted requests)", "fraction of requests", |p| p.attainment_offered, None),
    ("ttft_p50", "TTFT p50", "seconds", |p| p.ttft_p50, None),
    ("ttft_p99", "TTFT p99 of served requests", "seconds", |p| p.ttft_p99_served, None),
    ("ttft_p99_all", "TTFT p99 over every counted request", "seconds", |p| p.ttft_p99_all, None),
    ("tpot_p50", "TPOT p50 of served requests", "milliseconds", |p| p.tpot_p50_served * 1e3, None),
    ("tpot_p99", "TPOT p99", "milliseconds", |p| p.tpot_p99 * 1e3, None),
    ("idle_p50", "User idle latency p50", "seconds", |p| p.idle_p50, None),
    ("idle_p99", "User idle latency p99 of served requests", "seconds", |p| p.idle_p99_served, None),
    ("idle_p99_all", "User idle latency p99 over every counted request", "seconds", |p| p.idle_p99_all, None),
    ("rejected", "Rejected at admission (429/503)", "share of counted", |p| p.rejected_frac, None),
    ("abandoned", "Clients who left (patience)", "share of counted", |p| p.abandoned_frac, None),
    ("wasted", "Work on clients who left (client view)", "share of work", |p| p.wasted_tokens_frac, None),
    ("failed_dropped", "Failed + dropped + aborted", "requests", |p| (p.failed + p.dropped + p.aborted) as f64, None),
];

fn threshold(name: &str, slo: &BinarySlo) -> Option<Threshold> {
    match name {
        "ttft_p50" | "ttft_p99" | "ttft_p99_all" => slo.ttft.map(|v| Threshold { value: v, label: format!("SLO: TTFT {} ms", v * 1e3) }),
        "tpot_p50" | "tpot_p99" => slo.tpot.map(|v| Threshold { value: v * 1e3, label: format!("SLO: TPOT {} ms", v * 1e3) }),
        "attainment" => Some(Threshold { value: 0.9, label: "90% (capacity)".into() }),
        _ => None,
    }
}

/// Builds the charts of a sweep (ceilings already set).
pub fn charts(series: &[(String, Vec<PointSummary>)], axis: Axis, params: &SloParams, has_slo: bool) -> Vec<Chart> {
    let ceiling_line = |name: &str| -> Option<Line> {
        let (_, pts) = series.first()?;
        let closed = pts.iter().any(|p| p.closed_loop);
        match (name, closed) {
            ("smooth_goodput", false) => Some(Line::new(
                if pts.iter().any(|p| !p.by_priority.is_empty()) { "ceiling: weighted (heaviest first)" } else { "ceiling: min(offered tok/s, Theta)" },
                pts.iter().map(|p| (p.load, p.ceiling)).collect(),
            )),
            ("benefit_per_request", true) => Some(Line::new("ceiling (fluid model)", pts.iter().map(|p| (p.load, p.ceiling)).collect())),
            ("ceiling_fraction", _) => Some(Line::new("ceiling", pts.iter().map(|p| (p.load, 1.0)).collect())),
            _ => None,
        }
    };
    METRICS
        .iter()
        .filter(|m| has_slo || !matches!(m.0, "request_goodput" | "token_goodput" | "attainment"))
        .map(|(name, title, unit, value, ci)| Chart {
            name: name.to_string(),
            title: title.to_string(),
            x_desc: axis.describe().to_string(),
            y_desc: unit.to_string(),
            lines: series
                .iter()
                .map(|(label, pts)| Line {
                    label: label.clone(),
                    points: pts.iter().map(|p| (p.load, value(p))).collect(),
                    errors: ci.map_or(vec![], |f| pts.iter().map(f).collect()),
                })
                .collect(),
            threshold: if has_slo { threshold(name, &params.binary) } else { None },
            ceiling: ceiling_line(name),
        })
        .collect()
}

/// Writes `report.md`, `sweep.json` and the plots for `series` into `dir`; sets every point's
/// ceiling first. `prov` heads the report.
pub fn write_report(dir: &Path, title: &str, spec: &SweepSpec, series: &mut [(String, Vec<PointSummary>)], prov: &Provenance) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let params = &spec.info.params;
    let has_slo = spec.info.has_slo;
    let theta = theta(series);
    set_ceilings(series, theta, params);
    let heads: Vec<Headline> = series.iter().map(|(l, p)| headline(l, p)).collect();
    let json = serde_json::json!({
        "title": title,
        "provenance": prov,
        "axis": spec.axis,
        "workload": spec.workload_desc,
        "seed": spec.seed,
        "params": params,
        "has_slo": has_slo,
        "theta": theta,
        "headlines": heads,
        "series": series.iter().map(|(l, p)| serde_json::json!({"label": l, "points": p})).collect::<Vec<_>>(),
    });
    std::fs::write(dir.join("sweep.json"), serde_json::to_string_pretty(&json)?)?;
    let charts = charts(series, spec.axis, params, has_slo);
    for c in &charts {
        write_chart(dir, c)?;
    }
    let overview: Vec<&Chart> =
        ["smooth_goodput", "ceiling_fraction", "benefit_per_request", "output_throughput", "tpot_p50", "idle_p99_all", "rejected", "abandoned", "ttft_p99_all"]
            .iter()
            .filter_map(|n| charts.iter().find(|c| c.name == *n))
            .collect();
    write_grid(dir, "overview", &overview, 3)?;
    std::fs::write(dir.join("report.md"), markdown(title, spec, series, &heads, &charts, theta, prov))?;
    Ok(())
}

/// The report line naming smooth goodput's parameters.
pub fn smooth_goodput_line(p: &SloParams) -> String {
    format!(
        "- Smooth goodput: reading rate q = {} tok/s, first-token grace g = {} ms, alpha = {}, penalty f = {}",
        p.default_class.reading_rate,
        p.default_class.grace * 1e3,
        p.alpha,
        p.penalty
    )
}

fn fmt_load(v: Option<f64>, unit: &str) -> String {
    v.map_or("none reached".to_string(), |v| format!("{v} {unit}"))
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn markdown(
    title: &str,
    spec: &SweepSpec,
    series: &[(String, Vec<PointSummary>)],
    heads: &[Headline],
    charts: &[Chart],
    theta: f64,
    prov: &Provenance,
) -> String {
    let p = &spec.info.params;
    let unit = spec.axis.unit();
    let mut md = format!("# {title}\n\n{}", prov.markdown());
    let _ = writeln!(md, "- Workload: {}", spec.workload_desc);
    let loads: Vec<String> = spec.loads.iter().map(|l| format!("{}", spec.x(l))).collect();
    let _ = writeln!(
        md,
        "- Offered loads ({}): {} {unit}; the same seeded prompts, arrivals and clients at every load and for every target",
        spec.axis.describe(),
        loads.join(", ")
    );
    let _ = writeln!(
        md,
        "- Binary SLO (`--goodput`): {}",
        if spec.info.has_slo { format!("`{}`", p.binary) } else { "none given: every completed request passes".into() }
    );
    let _ = writeln!(md, "{}", smooth_goodput_line(p));
    let _ = writeln!(
        md,
        "- Measured as `../shared/docs/evaluation.md` asks: only requests scheduled inside the measurement window are counted \
         (closed loops: a share of the sequence), every rate is over the window, the same for every target, and the run lasts \
         until every counted request has ended. Timestamps are the client's: a request arrives when it is sent, a token when \
         its SSE frame is read."
    );
    let _ = match spec.axis {
        Axis::RequestRate => writeln!(
            md,
            "- Ceiling: `min(offered output tok/s, Theta)` with Theta = {theta:.1} tok/s, the largest output throughput any \
             target delivered during the window at any load, or the largest smooth goodput if that is higher. `±` is a 95% interval from the spread of one run's \
             per-request benefits.{}",
            if spec.priority.iter().any(|&p| p != 0) {
                " With a priority mix every request's benefit weighs `2^-priority` and the ceiling is the weighted one: Theta's tokens \
                 go to the heaviest offered first (`pace_scheduler::slo::weighted_ceiling`); Theta compares delivered rates with the \
                 unweighted smooth goodput."
            } else {
                ""
            }
        ),
        Axis::Concurrency => writeln!(
            md,
            "- Concurrency caps: with everything scheduled at once each cap is a closed loop, every target gets the same \
             requests, and benefit per request sent scores a refusal as 0; its ceiling is the best benefit per request of a \
             fluid model (`pace_scheduler::sim::closed_loop_ceiling`) with Theta = {theta:.1} tok/s, the largest output rate \
             any point delivered during its window. With a finite --request-rate the caps are open loops with the \
             per-second ceiling."
        ),
    };
    let _ = writeln!(
        md,
        "- Capacity is DistServe's: the highest offered load at which at least 90% of the counted requests pass the SLO \
         (rejected, dropped, abandoned and failed requests count as missing it); the sweep's spacing is its resolution.\n"
    );
    md.push_str("## Headline\n\n| target | capacity at 90% attainment | peak smooth goodput (/s) | at load | lowest fraction of the ceiling | at load | max request goodput (req/s) |\n|---|---|---|---|---|---|---|\n");
    for h in heads {
        let (at, peak) = h.smooth_peak.map_or(("-".into(), "-".into()), |(l, v)| (format!("{l} {unit}"), format!("{v:.1}")));
        let (wat, worst) = h.worst_ceiling_fraction.map_or(("-".into(), "-".into()), |(l, v)| (format!("{l} {unit}"), pct(v)));
        let _ = writeln!(
            md,
            "| {} | {} | {peak} | {at} | {worst} | {wat} | {:.2} |",
            h.label,
            if spec.info.has_slo { fmt_load(h.capacity_90, unit) } else { "n/a (no SLO)".into() },
            h.max_request_goodput,
        );
    }
    md.push_str("\n![overview](overview.svg)\n\n## Per load\n");
    let head = [
        "target",
        "smooth goodput",
        "of ceiling",
        "benefit/req",
        "rejected",
        "dropped",
        "left",
        "wasted work",
        "out tok/s",
        "goodput req/s",
        "attain",
        "TTFT p50",
        "TTFT p99 served / all",
        "TPOT p50 served",
        "TPOT p99",
        "idle p99 served / all",
        "counted",
        "completed",
        "failed",
    ];
    let mut loads: Vec<f64> = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.load)).collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup();
    for load in loads {
        let first = series.iter().flat_map(|(_, p)| p.iter()).find(|x| x.load == load);
        let extra = first.map_or(String::new(), |x| {
            if x.closed_loop {
                format!(": ceiling {:.1} per request", x.ceiling)
            } else if !x.by_priority.is_empty() {
                format!(": weighted ceiling {:.1} benefit/s, window {:.0} s", x.ceiling, x.window_s)
            } else {
                format!(": ceiling {:.1} tok/s, window {:.0} s", x.ceiling, x.window_s)
            }
        });
        let _ = writeln!(md, "\n### {load} {unit}{extra}\n\n| {} |\n|{}", head.join(" | "), "---|".repeat(head.len()));
        for (label, pts) in series {
            for x in pts.iter().filter(|x| x.load == load) {
                let _ = writeln!(
                    md,
                    "| [{label}]({}) | {:.1} ± {:.1} | {} | {:.1} | {} | {} | {} | {} | {:.1} | {:.2} | {} | {:.2} s | {:.2} s / {:.2} s | {:.0} ms | {:.0} ms | {:.2} s / {:.2} s | {} | {} | {} |",
                    x.result_file,
                    x.smooth_goodput,
                    x.smooth_goodput_ci95,
                    pct(x.ceiling_fraction),
                    x.benefit_per_request,
                    pct(x.rejected_frac),
                    pct(x.dropped_frac),
                    pct(x.abandoned_frac),
                    pct(x.wasted_tokens_frac),
                    x.output_throughput,
                    x.request_goodput,
                    pct(x.attainment_offered),
                    x.ttft_p50,
                    x.ttft_p99_served,
                    x.ttft_p99_all,
                    x.tpot_p50_served * 1e3,
                    x.tpot_p99 * 1e3,
                    x.idle_p99_served,
                    x.idle_p99_all,
                    x.counted,
                    x.completed,
                    x.failed
                );
            }
        }
    }
    let mut weighted: Vec<&PointSummary> = series.iter().flat_map(|(_, p)| p.iter()).filter(|p| !p.by_priority.is_empty()).collect();
    weighted.sort_by(|a, b| a.load.total_cmp(&b.load));
    if !weighted.is_empty() {
        md.push_str(
            "\n## By priority\n\nThe counted requests of each priority (vLLM's `priority`, lower first; benefit weighted by `2^-priority`).\n\n\
             | load | target | priority (weight) | counted | rejected | left | weighted benefit/req | TPOT p50 served |\n|---|---|---|---|---|---|---|---|\n",
        );
        for x in weighted {
            for r in &x.by_priority {
                let _ = writeln!(
                    md,
                    "| {} {unit} | {} | {} ({}) | {} | {} | {} | {:.1} | {:.0} ms |",
                    x.load,
                    x.label,
                    r.priority,
                    r.weight,
                    r.counted,
                    pct(r.rejected_frac),
                    pct(r.abandoned_frac),
                    r.benefit_per_request,
                    r.tpot_p50_served * 1e3
                );
            }
        }
    }
    md.push_str("\n## Plots\n\n");
    for c in charts {
        let _ = writeln!(md, "- {}: [SVG]({n}.svg)", c.title, n = c.name);
    }
    md.push_str("\nFull results with per-request timelines: `points/*.json.gz` (gzip; vLLM result-file field names); every point's summary: `sweep.json`.\n");
    md
}
