//! `pace bench score`: smooth goodput, binary goodput and benefit per request sent from the
//! per-request exports of benchmark tools pace did not write (AIPerf, `vllm bench serve`,
//! GuideLLM, inference-perf) and of pace's own `bench serve`.
//!
//! Every per-request quantity is `pace_scheduler::slo`'s (docs/metrics.md): each request
//! becomes a [`RequestRecord`] (arrival = when the client sent it, one delivery time per
//! token) and is scored there, then only a fixed-size summary of it is kept, so memory grows
//! by a few dozen bytes a request however long the answers. A run's window is the tool's
//! own duration where the export records one (vLLM, GuideLLM), else from the first request
//! sent to the last one ended; every rate is over it.
//!
//! Scoring of what went wrong (the definitions, which pace's own client agrees with):
//! a refused request (HTTP 429 or 503 before any output) and a failed request without output
//! score 0; a request that failed or was cancelled after some output keeps its tokens and is
//! charged its stall until it ended, as pace scores a dropped stream.

pub mod formats;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use pace_scheduler::slo::{Dist, Outcome, RequestRecord, SloParams};
use serde::Serialize;

use crate::plots::{write_chart, Chart, Line};
use formats::{End, Format, Level, Req, RunMeta, Sink, Timing};

/// `pace bench score`.
#[derive(Debug, Clone, Args)]
pub struct ScoreArgs {
    /// Export files, or directories searched for them (recursively).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The exports' format; auto detects it from each file's content.
    #[arg(long, default_value = "auto", value_parser = formats::FORMAT_NAMES)]
    pub format: String,
    /// Binary SLO and smooth-goodput parameters (the same flags and units as pace serve, pace
    /// bench and pace sim).
    #[command(flatten)]
    pub slo: pace_scheduler::slo_args::SloArgs,
    /// Also give Etalon's fluidity-index (the share of tokens on time against a deadline chain
    /// that restarts after each miss): TTFT_MS,TBT_MS, e.g. 2000,100.
    #[arg(long, value_name = "TTFT_MS,TBT_MS")]
    pub fluidity: Option<String>,
    /// One JSON array, an object per run and load level, instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write benefit-per-request-sent.svg (and the smooth and binary goodput charts) into this
    /// directory: one line per series (the directory holding each run's level directories).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

/// Etalon's fluidity-index deadlines, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fluidity {
    /// First token due this long after the request was sent.
    pub ttft: f64,
    /// Each later token due this long after the previous deadline (or the previous token, after
    /// a miss).
    pub tbt: f64,
}

impl std::str::FromStr for Fluidity {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let (a, b) = s.split_once(',').context("--fluidity takes TTFT_MS,TBT_MS")?;
        let ms = |x: &str| -> Result<f64> {
            let v: f64 = x.trim().parse().with_context(|| format!("--fluidity: '{x}' is not a number of milliseconds"))?;
            if !(v.is_finite() && v > 0.0) {
                bail!("--fluidity: {v} must be positive");
            }
            Ok(v / 1e3)
        };
        Ok(Fluidity { ttft: ms(a)?, tbt: ms(b)? })
    }
}

impl Fluidity {
    /// (tokens on time, tokens) of one stream sent at `start`.
    pub fn of(&self, start: f64, token_times: &[f64]) -> (usize, usize) {
        let mut due = start + self.ttft;
        let mut met = 0;
        for &t in token_times {
            if t <= due {
                met += 1;
            } else {
                due = t; // a miss restarts the chain at the late token
            }
            due += self.tbt;
        }
        (met, token_times.len())
    }
}

/// What is kept of one request: fixed size, whatever its length.
#[derive(Debug, Clone, Copy)]
struct Summary {
    start: f64,
    end: f64,
    outcome: End,
    tokens: usize,
    ttft: Option<f64>,
    tpot: f64,
    idle: f64,
    benefit: f64,
    passes: bool,
    on_time: usize,
}

/// One run and load level, scored.
#[derive(Debug, Clone, Serialize)]
pub struct Score {
    /// The file, relative to the path given.
    pub source: String,
    /// Its format.
    pub format: Format,
    /// The benchmark inside the file (GuideLLM, inference-perf stages), else empty.
    pub run: String,
    /// The runs a chart draws as one line: the directory holding the run's directory.
    pub series: String,
    /// The load, when the export records it.
    pub level: Option<Level>,
    /// How the token times were obtained.
    pub timing: Timing,
    /// Requests sent.
    pub sent: usize,
    /// Complete answers.
    pub served: usize,
    /// Refused (429/503) before any output.
    pub refused: usize,
    /// Failed for any other reason.
    pub failed: usize,
    /// Cancelled by the client.
    pub cancelled: usize,
    /// The window, seconds.
    pub duration_s: f64,
    /// From the first request sent to the last, seconds: the offered load as it was sent (a
    /// tool that fired an open loop's requests at once shows here).
    pub sent_over_s: f64,
    /// Complete answers per second.
    pub request_throughput: f64,
    /// Delivered output tokens per second.
    pub output_throughput: f64,
    /// Requests per second that completed within every threshold of `--slo` (null without it).
    pub binary_goodput: Option<f64>,
    /// Passed over sent (null without `--slo`).
    pub attainment: Option<f64>,
    /// Sum of benefits per second.
    pub smooth_goodput: f64,
    /// Sum of benefits over requests sent.
    pub benefit_per_request_sent: f64,
    /// Half-width of its 95% interval, from the spread of the requests' benefits.
    pub benefit_per_request_sent_ci95: f64,
    /// Idle latency of complete answers, seconds.
    pub idle_served: Dist,
    /// Idle latency of every request sent; one without output counts its whole wait.
    pub idle_all: Dist,
    /// TTFT of complete answers, seconds.
    pub ttft_served: Dist,
    /// TPOT of complete answers with two tokens or more, seconds.
    pub tpot_served: Dist,
    /// Etalon's fluidity-index over every token delivered (with `--fluidity`).
    pub fluidity_index: Option<f64>,
}

/// Scores requests as they are read; one [`Score`] per run.
pub struct Scorer {
    params: SloParams,
    has_slo: bool,
    fluidity: Option<Fluidity>,
    source: String,
    format: Format,
    series: String,
    current: Option<(RunMeta, Vec<Summary>)>,
    /// Finished runs.
    pub scores: Vec<Score>,
}

impl Scorer {
    /// A scorer with these parameters; `has_slo` says whether `params.binary` was given.
    pub fn new(params: SloParams, has_slo: bool, fluidity: Option<Fluidity>) -> Self {
        Scorer { params, has_slo, fluidity, source: String::new(), format: Format::Pace, series: String::new(), current: None, scores: Vec::new() }
    }

    /// Scores one file.
    pub fn file(&mut self, path: &Path, format: Format, source: String, series: String) -> Result<()> {
        self.source = source;
        self.format = format;
        self.series = series;
        formats::read(path, format, self)?;
        self.flush();
        Ok(())
    }

    fn flush(&mut self) {
        if let Some((meta, items)) = self.current.take() {
            let s = self.aggregate(meta, &items);
            self.scores.push(s);
        }
    }

    fn summarize(&self, req: Req) -> Summary {
        let outcome = match req.outcome {
            End::Served => Outcome::Completed,
            End::Refused => Outcome::Rejected,
            End::Failed => Outcome::Failed,
            End::Cancelled => Outcome::Aborted,
        };
        let record = RequestRecord { arrival: req.start, token_times: req.token_times, outcome, end: req.end, class: self.params.default_class };
        let silent = record.token_times.is_empty() && outcome != Outcome::Completed;
        // Refused, or failed without a token: 0 (and its whole wait as its idle latency).
        let (idle, benefit) = if silent { ((req.end - req.start).max(0.0), 0.0) } else { (record.idle_latency(), record.benefit(&self.params)) };
        let on_time = self.fluidity.map_or(0, |f| f.of(req.start, &record.token_times).0);
        Summary {
            start: req.start,
            end: req.end.max(record.token_times.last().copied().unwrap_or(req.end)),
            outcome: req.outcome,
            tokens: record.num_tokens(),
            ttft: record.ttft(),
            tpot: record.tpot(),
            idle,
            benefit,
            passes: record.passes(&self.params.binary),
            on_time,
        }
    }

    fn aggregate(&self, meta: RunMeta, items: &[Summary]) -> Score {
        let sent = items.len();
        let count = |o: End| items.iter().filter(|s| s.outcome == o).count();
        let first = items.iter().map(|s| s.start).fold(f64::INFINITY, f64::min);
        let last = items.iter().map(|s| s.end).fold(f64::NEG_INFINITY, f64::max);
        let duration = meta.duration.filter(|d| *d > 0.0).unwrap_or(if last > first { last - first } else { 0.0 });
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let served: Vec<&Summary> = items.iter().filter(|s| s.outcome == End::Served).collect();
        let passed = items.iter().filter(|s| s.passes).count();
        let benefits: Vec<f64> = items.iter().map(|s| s.benefit).collect();
        let total: f64 = benefits.iter().sum();
        let mean = if sent > 0 { total / sent as f64 } else { 0.0 };
        let sd = if sent > 1 { (benefits.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / (sent - 1) as f64).sqrt() } else { 0.0 };
        let tokens: usize = items.iter().map(|s| s.tokens).sum();
        let dist = |v: Vec<f64>| {
            let mut v = v;
            Dist::of(&mut v)
        };
        Score {
            source: self.source.clone(),
            format: self.format,
            run: meta.name,
            series: self.series.clone(),
            level: meta.level,
            timing: meta.timing,
            sent,
            served: served.len(),
            refused: count(End::Refused),
            failed: count(End::Failed),
            cancelled: count(End::Cancelled),
            duration_s: duration,
            sent_over_s: {
                let last_sent = items.iter().map(|s| s.start).fold(f64::NEG_INFINITY, f64::max);
                if last_sent > first {
                    last_sent - first
                } else {
                    0.0
                }
            },
            request_throughput: per_s(served.len() as f64),
            output_throughput: per_s(tokens as f64),
            binary_goodput: self.has_slo.then(|| per_s(passed as f64)),
            attainment: self.has_slo.then(|| if sent > 0 { passed as f64 / sent as f64 } else { 0.0 }),
            smooth_goodput: per_s(total),
            benefit_per_request_sent: mean,
            benefit_per_request_sent_ci95: if sent > 1 { 1.96 * sd / (sent as f64).sqrt() } else { 0.0 },
            idle_served: dist(served.iter().map(|s| s.idle).collect()),
            idle_all: dist(items.iter().map(|s| s.idle).collect()),
            ttft_served: dist(served.iter().filter_map(|s| s.ttft).collect()),
            tpot_served: dist(served.iter().filter(|s| s.tokens >= 2).map(|s| s.tpot).collect()),
            fluidity_index: self.fluidity.map(|_| if tokens > 0 { items.iter().map(|s| s.on_time).sum::<usize>() as f64 / tokens as f64 } else { 0.0 }),
        }
    }
}

impl Sink for Scorer {
    fn run(&mut self, meta: RunMeta) {
        self.flush();
        self.current = Some((meta, Vec::new()));
    }

    fn request(&mut self, req: Req) {
        let s = self.summarize(req);
        if let Some((_, items)) = &mut self.current {
            items.push(s);
        }
    }

    fn timing(&mut self, timing: Timing) {
        if let Some((meta, _)) = &mut self.current {
            meta.timing = timing;
        }
    }
}

/// Every file under `path` (itself if a file), sorted, with the name it is reported by.
fn files(path: &Path) -> Result<Vec<(PathBuf, String)>> {
    if path.is_file() {
        return Ok(vec![(path.to_path_buf(), path.display().to_string())]);
    }
    if !path.is_dir() {
        bail!("{}: no such file or directory", path.display());
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if [".json", ".jsonl", ".yaml", ".yml", ".json.gz"].iter().any(|x| name.ends_with(x)) {
                    let rel = p.strip_prefix(path).unwrap_or(&p).display().to_string();
                    out.push((p, rel));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The series of a file named `rel`: the directory that holds its run directory
/// (`smooth/c8/profile_export.jsonl` is in series `smooth`), else the file's own directory.
fn series_of(rel: &str) -> String {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.len() {
        0 | 1 => String::new(),
        2 => parts[0].to_string(),
        n => parts[..n - 2].join("/"),
    }
}

/// Scores every export under `paths`.
pub fn score_paths(paths: &[PathBuf], format: Option<Format>, params: SloParams, has_slo: bool, fluidity: Option<Fluidity>) -> Result<Vec<Score>> {
    let mut scorer = Scorer::new(params, has_slo, fluidity);
    for path in paths {
        let explicit = path.is_file();
        let mut found = 0;
        for (file, rel) in files(path)? {
            let f = match format {
                Some(f) => Some(f),
                None => formats::detect(&file).with_context(|| format!("reading {}", file.display()))?,
            };
            match f {
                Some(f) => {
                    scorer.file(&file, f, rel.clone(), series_of(&rel))?;
                    found += 1;
                }
                // Tools write other files beside their exports (settings, summaries): skipped
                // in a directory, an error when named.
                None if explicit => bail!("{}: not a per-request export; expected {}", file.display(), formats::EXPECTED),
                None => {}
            }
        }
        if found == 0 {
            bail!("{}: no per-request export found; expected {}", path.display(), formats::EXPECTED);
        }
    }
    Ok(scorer.scores)
}

fn level_text(l: Option<Level>) -> String {
    match l {
        Some(Level::Concurrency(c)) => format!("{c} client{}", if c == 1.0 { "" } else { "s" }),
        Some(Level::Rate(r)) => format!("{r} req/s"),
        None => "-".into(),
    }
}

/// The scores as a Markdown table.
pub fn table(scores: &[Score], has_slo: bool) -> String {
    let mut out = String::from(
        "| source | run | load | timing | sent | sent over (s) | served | refused | failed | cancelled | binary goodput (req/s) | smooth goodput (/s) | benefit per request sent | idle p50 / p99, all (s) | TTFT p50 served (s) | fluidity |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in scores {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {:.2} | {:.1} ± {:.1} | {:.2} / {:.2} | {:.3} | {} |\n",
            s.source,
            if s.run.is_empty() { "-" } else { &s.run },
            level_text(s.level),
            serde_json::to_value(s.timing).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            s.sent,
            s.sent_over_s,
            s.served,
            s.refused,
            s.failed,
            s.cancelled,
            if has_slo { s.binary_goodput.map_or("-".into(), |g| format!("{g:.3}")) } else { "-".into() },
            s.smooth_goodput,
            s.benefit_per_request_sent,
            s.benefit_per_request_sent_ci95,
            s.idle_all.p50,
            s.idle_all.p99,
            s.ttft_served.p50,
            s.fluidity_index.map_or("-".into(), |f| format!("{f:.3}")),
        ));
    }
    out
}

/// Charts of benefit per request sent, smooth and binary goodput against load, one line per
/// series, where the runs record their load; returns the files written.
pub fn plot(dir: &Path, scores: &[Score], has_slo: bool) -> Result<Vec<PathBuf>> {
    let rates = scores.iter().all(|s| matches!(s.level, Some(Level::Rate(_))));
    let clients = scores.iter().all(|s| matches!(s.level, Some(Level::Concurrency(_))));
    if !(rates || clients) {
        bail!("--plot needs every run's load recorded, all request rates or all concurrencies");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let x_of = |s: &Score| match s.level {
        Some(Level::Rate(x)) | Some(Level::Concurrency(x)) => x,
        None => 0.0,
    };
    let mut series: Vec<&str> = scores.iter().map(|s| s.series.as_str()).collect();
    series.dedup();
    series.sort();
    series.dedup();
    let lines = |f: &dyn Fn(&Score) -> f64, with_err: bool| -> Vec<Line> {
        series
            .iter()
            .map(|name| {
                let mut pts: Vec<&Score> = scores.iter().filter(|s| s.series == *name).collect();
                pts.sort_by(|a, b| x_of(a).total_cmp(&x_of(b)));
                let mut l = Line::new(if name.is_empty() { "run" } else { name }, pts.iter().map(|s| (x_of(s), f(s))).collect());
                if with_err {
                    l.errors = pts.iter().map(|s| s.benefit_per_request_sent_ci95).collect();
                }
                l
            })
            .collect()
    };
    let x_desc = if rates { "offered load (requests/s)" } else { "concurrency (clients)" }.to_string();
    let mut charts = vec![
        Chart {
            name: "benefit-per-request-sent".into(),
            title: "Benefit per request sent (refused: 0)".into(),
            x_desc: x_desc.clone(),
            y_desc: "tokens - alpha f(idle), per request".into(),
            lines: lines(&|s| s.benefit_per_request_sent, true),
            threshold: None,
            ceiling: None,
        },
        Chart {
            name: "smooth-goodput".into(),
            title: "Smooth goodput".into(),
            x_desc: x_desc.clone(),
            y_desc: "benefit per second".into(),
            lines: lines(&|s| s.smooth_goodput, false),
            threshold: None,
            ceiling: None,
        },
    ];
    if has_slo {
        charts.push(Chart {
            name: "binary-goodput".into(),
            title: "Binary goodput".into(),
            x_desc,
            y_desc: "requests within the SLO per second".into(),
            lines: lines(&|s| s.binary_goodput.unwrap_or(0.0), false),
            threshold: None,
            ceiling: None,
        });
    }
    let mut written = Vec::new();
    for c in &charts {
        write_chart(dir, c)?;
        written.push(dir.join(format!("{}.svg", c.name)));
    }
    Ok(written)
}

/// Runs `pace bench score`.
pub fn run(a: &ScoreArgs) -> Result<()> {
    let binary = a.slo.binary()?;
    let params = a.slo.params(binary.unwrap_or_default());
    let fluidity = a.fluidity.as_deref().map(str::parse::<Fluidity>).transpose()?;
    let scores = score_paths(&a.paths, Format::from_name(&a.format), params, binary.is_some(), fluidity)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
    } else {
        println!(
            "Scored with reading rate {} tok/s, grace {} ms, alpha {}, penalty {}{}.\n",
            params.default_class.reading_rate,
            params.default_class.grace * 1e3,
            params.alpha,
            params.penalty,
            binary.map_or(", no binary SLO (--slo for binary goodput)".to_string(), |b| format!(", binary SLO {b}")),
        );
        print!("{}", table(&scores, binary.is_some()));
        if scores.iter().any(|s| s.timing != Timing::PerToken) {
            println!(
                "\nTiming: per-chunk = a time per streamed chunk, tokens spread over the chunks in order; estimated = first and \
                 last token times only, the tokens between at a uniform pace (idle latency is then a lower bound)."
            );
        }
    }
    if let Some(dir) = &a.plot {
        for f in plot(dir, &scores, binary.is_some())? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}
