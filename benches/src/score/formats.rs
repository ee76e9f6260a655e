//! The per-request exports `pace bench score` reads, each turned into [`Req`]s: when the
//! request was sent, how it ended, and when each of its output tokens arrived.
//!
//! Token times: AIPerf, `vllm bench serve` and inference-perf record a time per streamed chunk
//! (inference-perf also one per token); a chunk may carry several tokens, and the usage count
//! says how many came in all. Then tokens are spread over the chunks in order, as evenly as
//! whole tokens allow, the last token on the last chunk ([`spread`]): exact when every chunk
//! holds one token, as pace and vLLM stream. GuideLLM keeps only the first and last token
//! times and the number of chunks: the tokens between are placed at a uniform pace
//! ([`Timing::Estimated`]). pace's own results keep every token's time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

/// How a request ended, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A complete answer.
    Served,
    /// Turned away before any output: HTTP 429 or 503 (the server's admission said no).
    Refused,
    /// Any other error (another status, a broken connection, a timeout).
    Failed,
    /// The client cancelled it on purpose (AIPerf's `--request-cancellation-rate`).
    Cancelled,
}

/// One request of an export, in seconds of the export's own clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Req {
    /// When the client sent it.
    pub start: f64,
    /// When it ended (last byte, error or cancellation).
    pub end: f64,
    /// How it ended.
    pub outcome: End,
    /// When each output token arrived, non-decreasing.
    pub token_times: Vec<f64>,
}

/// How the token times of a run were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Timing {
    /// A time for every token (pace, inference-perf), or one token per chunk.
    PerToken,
    /// A time per chunk and a token count: tokens spread over the chunks.
    PerChunk,
    /// First and last token times only: the tokens between at a uniform pace.
    Estimated,
}

/// The load a run was driven at, when the export says.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Level {
    /// Closed loop: this many clients (concurrency).
    Concurrency(f64),
    /// Open loop: this many requests per second.
    Rate(f64),
}

/// The formats, as `--format` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// NVIDIA AIPerf's `profile_export.jsonl`.
    Aiperf,
    /// `vllm bench serve --save-result --save-detailed` JSON.
    Vllm,
    /// GuideLLM's benchmarks report, JSON or YAML.
    Guidellm,
    /// inference-perf's `per_request_lifecycle_metrics.json`.
    InferencePerf,
    /// `pace bench serve --save-result` JSON (or a sweep's `points/*.json.gz`).
    Pace,
}

/// Every `--format` name.
pub const FORMAT_NAMES: [&str; 6] = ["auto", "aiperf", "vllm", "guidellm", "inference-perf", "pace"];

/// What a file that matches no format is told it should have been.
pub const EXPECTED: &str = "an AIPerf profile_export.jsonl (one JSON record a line with \"metadata\" and \"metrics\"), \
a `vllm bench serve --save-result --save-detailed` JSON (\"ttfts\", \"itls\", \"output_lens\"), \
a GuideLLM benchmarks report in JSON or YAML (\"benchmarks\" with per-request \"requests\"), \
an inference-perf per_request_lifecycle_metrics.json (a list of records with \"start_time\", \"end_time\", \"info\") \
or a `pace bench serve --save-result` JSON (\"timelines\")";

impl Format {
    /// The format named by `--format` (`None` for auto).
    pub fn from_name(name: &str) -> Option<Format> {
        match name {
            "aiperf" => Some(Format::Aiperf),
            "vllm" => Some(Format::Vllm),
            "guidellm" => Some(Format::Guidellm),
            "inference-perf" => Some(Format::InferencePerf),
            "pace" => Some(Format::Pace),
            _ => None,
        }
    }

    /// Its `--format` name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Aiperf => "aiperf",
            Format::Vllm => "vllm",
            Format::Guidellm => "guidellm",
            Format::InferencePerf => "inference-perf",
            Format::Pace => "pace",
        }
    }
}

/// One run (one load level) of an export: its requests go to the sink as they are read.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMeta {
    /// Which benchmark of a multi-benchmark file (GuideLLM), else empty.
    pub name: String,
    /// The load it was driven at, if recorded.
    pub level: Option<Level>,
    /// The run's duration as the tool measured it, seconds, if recorded.
    pub duration: Option<f64>,
    /// How its token times were obtained.
    pub timing: Timing,
}

/// Receives the runs of a file and their requests.
pub trait Sink {
    /// A new run starts; the requests that follow belong to it.
    fn run(&mut self, meta: RunMeta);
    /// One request of the current run.
    fn request(&mut self, req: Req);
    /// How the current run's token times were obtained, when that is known only after its
    /// requests were read.
    fn timing(&mut self, timing: Timing);
}

/// Opens a file, transparently gunzipping `.gz`.
fn open(path: &Path) -> Result<Box<dyn BufRead>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let r: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") { Box::new(flate2::read::GzDecoder::new(f)) } else { Box::new(f) };
    Ok(Box::new(BufReader::with_capacity(1 << 20, r)))
}

/// The format of a file, from its content; `None` when it is none of them.
pub fn detect(path: &Path) -> Result<Option<Format>> {
    let mut r = open(path)?;
    // The first non-blank line decides between JSON Lines, a JSON document and YAML.
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let first = line.trim();
    if first.starts_with('{') {
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(first) {
            if m.contains_key("metadata") && m.contains_key("metrics") {
                return Ok(Some(Format::Aiperf));
            }
        }
        // A JSON document: its top-level keys decide.
        #[derive(Deserialize)]
        struct Probe {
            ttfts: Option<IgnoredAny>,
            itls: Option<IgnoredAny>,
            benchmarks: Option<IgnoredAny>,
            timelines: Option<IgnoredAny>,
        }
        let rest = std::io::Cursor::new(line.clone().into_bytes()).chain(r);
        let Ok(p) = serde_json::from_reader::<_, Probe>(rest) else {
            return Ok(None);
        };
        return Ok(if p.timelines.is_some() {
            Some(Format::Pace)
        } else if p.ttfts.is_some() && p.itls.is_some() {
            Some(Format::Vllm)
        } else if p.benchmarks.is_some() {
            Some(Format::Guidellm)
        } else {
            None
        });
    }
    if first.starts_with('[') {
        // inference-perf: a list of records with start_time, end_time and info.
        let rest = std::io::Cursor::new(line.clone().into_bytes()).chain(r);
        #[derive(Deserialize)]
        #[allow(dead_code)] // the fields only have to be there
        struct Probe {
            start_time: IgnoredAny,
            end_time: IgnoredAny,
            info: IgnoredAny,
        }
        return Ok(serde_json::from_reader::<_, Vec<Probe>>(rest).ok().filter(|v| !v.is_empty()).map(|_| Format::InferencePerf));
    }
    // YAML: GuideLLM's report is the only YAML export.
    let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    if is_yaml || first.starts_with("benchmarks:") || first.starts_with("---") {
        let mut text = line.clone();
        r.read_to_string(&mut text)?;
        if let Ok(Value::Object(m)) = serde_yaml_ng::from_str::<Value>(&text) {
            if m.contains_key("benchmarks") {
                return Ok(Some(Format::Guidellm));
            }
        }
    }
    Ok(None)
}

/// Reads `path` as `format` into `sink`.
pub fn read(path: &Path, format: Format, sink: &mut dyn Sink) -> Result<()> {
    let what = || format!("reading {} as {}", path.display(), format.name());
    match format {
        Format::Aiperf => read_aiperf(path, sink),
        Format::Vllm => read_vllm(open(path)?, sink),
        Format::Guidellm => read_guidellm(path, sink),
        Format::InferencePerf => read_inference_perf(open(path)?, sink),
        Format::Pace => read_pace(open(path)?, sink),
    }
    .with_context(what)
}

/// Token times from chunk times: `n` tokens over the chunks in order, chunk `j` (0-based) of
/// `c` holding the tokens up to `ceil((j + 1) n / c)`; with as many tokens as chunks, one each.
/// Fewer tokens than chunks (a count that missed some) keeps one token per chunk.
pub fn spread(chunk_times: &[f64], n: usize) -> Vec<f64> {
    let c = chunk_times.len();
    if c == 0 || n <= c {
        return chunk_times.to_vec();
    }
    let mut out = Vec::with_capacity(n);
    for (j, &t) in chunk_times.iter().enumerate() {
        let upto = ((j + 1) * n).div_ceil(c);
        out.resize(upto, t);
    }
    out
}

/// `n` token times at a uniform pace from `first` to `last` (GuideLLM keeps no more).
pub fn uniform(first: f64, last: f64, n: usize) -> Vec<f64> {
    match n {
        0 => vec![],
        1 => vec![first],
        _ => (0..n).map(|i| first + (last - first) * i as f64 / (n - 1) as f64).collect(),
    }
}

/// A refusal: HTTP 429 or 503 by status, or by the reason phrase a tool kept instead.
pub fn is_refusal(code: Option<i64>, text: &str) -> bool {
    if let Some(c) = code {
        return c == 429 || c == 503;
    }
    let t = text.to_ascii_lowercase();
    ["429", "503", "too many requests", "service unavailable"].iter().any(|k| t.contains(k))
}

// ---------------------------------------------------------------- AIPerf

#[derive(Deserialize)]
struct AiperfMetric {
    value: Value,
    #[serde(default)]
    unit: String,
}

#[derive(Deserialize)]
struct AiperfMeta {
    request_start_ns: f64,
    request_end_ns: f64,
    #[serde(default)]
    benchmark_phase: Option<String>,
    #[serde(default)]
    was_cancelled: bool,
    #[serde(default)]
    cancellation_time_ns: Option<f64>,
}

#[derive(Deserialize)]
struct AiperfError {
    #[serde(default)]
    code: Option<i64>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct AiperfRecord {
    metadata: AiperfMeta,
    #[serde(default)]
    metrics: BTreeMap<String, AiperfMetric>,
    #[serde(default)]
    error: Option<AiperfError>,
}

/// A metric's value in seconds (AIPerf records each with its unit).
fn seconds(v: f64, unit: &str) -> f64 {
    match unit {
        "ns" => v * 1e-9,
        "us" => v * 1e-6,
        "ms" => v * 1e-3,
        _ => v,
    }
}

fn aiperf_level(path: &Path) -> Option<Level> {
    // The run's settings sit beside its records in profile_export_aiperf.json.
    let dir = path.parent()?;
    let text = std::fs::read_to_string(dir.join("profile_export_aiperf.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let config = v.get("input_config")?;
    // Current releases: a list of phases, the profiling one with its rate or concurrency;
    // earlier ones: `loadgen`.
    let phases = config.get("phases").and_then(Value::as_array);
    let load =
        phases.and_then(|ps| ps.iter().find(|p| p.get("kind").and_then(Value::as_str) == Some("profiling")).or(ps.last())).or_else(|| config.get("loadgen"))?;
    if let Some(r) = load.get("request_rate").or_else(|| load.get("rate")).and_then(Value::as_f64) {
        return Some(Level::Rate(r));
    }
    load.get("concurrency").and_then(Value::as_f64).map(Level::Concurrency)
}

fn read_aiperf(path: &Path, sink: &mut dyn Sink) -> Result<()> {
    let r = open(path)?;
    let mut timing = Timing::PerToken;
    // Streamed: each record is scored as it is read and only its summary kept.
    sink.run(RunMeta { name: String::new(), level: aiperf_level(path), duration: None, timing });
    for (i, line) in r.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: AiperfRecord = serde_json::from_str(&line).with_context(|| format!("line {}", i + 1))?;
        if rec.metadata.benchmark_phase.as_deref().is_some_and(|p| p != "profiling") {
            continue; // warm-up requests are not part of the run
        }
        let start = rec.metadata.request_start_ns * 1e-9;
        let mut end = rec.metadata.request_end_ns * 1e-9;
        let num = |k: &str| rec.metrics.get(k).and_then(|m| m.value.as_f64().map(|v| (v, m.unit.as_str())));
        let ttft = num("time_to_first_token").map(|(v, u)| seconds(v, u));
        // The server's count where it sent one (AIPerf's own re-tokenizes the text).
        let tokens = num("usage_completion_tokens")
            .or_else(|| num("output_sequence_length"))
            .or_else(|| num("output_token_count"))
            .map_or(0, |(v, _)| v.max(0.0) as usize);
        let mut chunks = Vec::new();
        if let Some(first) = ttft {
            chunks.push(start + first);
            if let Some(m) = rec.metrics.get("inter_chunk_latency") {
                let mut t = start + first;
                for gap in m.value.as_array().into_iter().flatten().filter_map(Value::as_f64) {
                    t += seconds(gap, &m.unit);
                    chunks.push(t);
                }
            }
        } else if tokens > 0 {
            // Not streamed: every token arrives with the whole answer.
            chunks.push(end);
        }
        if tokens > chunks.len() {
            timing = Timing::PerChunk;
        }
        let token_times = spread(&chunks, tokens);
        let outcome = if rec.metadata.was_cancelled {
            if let Some(c) = rec.metadata.cancellation_time_ns {
                end = c * 1e-9;
            }
            End::Cancelled
        } else if let Some(e) = &rec.error {
            let text = format!("{} {}", e.kind.as_deref().unwrap_or(""), e.message.as_deref().unwrap_or(""));
            if is_refusal(e.code, &text) {
                End::Refused
            } else {
                End::Failed
            }
        } else {
            End::Served
        };
        let token_times = if outcome == End::Refused { vec![] } else { token_times };
        sink.request(Req { start, end, outcome, token_times });
    }
    sink.timing(timing);
    Ok(())
}

// ---------------------------------------------------------------- vLLM

#[derive(Deserialize)]
struct VllmResult {
    #[serde(default)]
    duration: Option<f64>,
    #[serde(default)]
    request_rate: Option<Value>,
    #[serde(default)]
    max_concurrency: Option<f64>,
    #[serde(default)]
    output_lens: Vec<usize>,
    ttfts: Vec<Option<f64>>,
    itls: Vec<Vec<f64>>,
    #[serde(default)]
    errors: Vec<Option<String>>,
    #[serde(default)]
    start_times: Vec<f64>,
}

fn read_vllm(r: Box<dyn BufRead>, sink: &mut dyn Sink) -> Result<()> {
    let v: VllmResult = serde_json::from_reader(r)?;
    let n = v.ttfts.len();
    if v.itls.len() != n || (!v.output_lens.is_empty() && v.output_lens.len() != n) {
        bail!("ttfts ({n}), itls ({}) and output_lens ({}) must have one entry per request", v.itls.len(), v.output_lens.len());
    }
    let rate = v.request_rate.as_ref().and_then(|r| r.as_f64().or_else(|| r.as_str().and_then(|s| s.parse().ok())));
    // A concurrency cap with everything sent at once is a closed loop; a finite rate is open.
    let level = match (v.max_concurrency, rate) {
        (_, Some(r)) if r.is_finite() => Some(Level::Rate(r)),
        (Some(c), _) => Some(Level::Concurrency(c)),
        _ => None,
    };
    let mut timing = Timing::PerToken;
    let mut reqs = Vec::with_capacity(n);
    for i in 0..n {
        // Without start times (older vLLM) each request's clock starts at its own send.
        let start = v.start_times.get(i).copied().unwrap_or(0.0);
        let error = v.errors.get(i).cloned().flatten().filter(|e| !e.is_empty());
        let tokens = v.output_lens.get(i).copied().unwrap_or(0);
        let mut chunks = Vec::new();
        if let Some(ttft) = v.ttfts[i].filter(|t| *t > 0.0 || tokens > 0) {
            let mut t = start + ttft;
            chunks.push(t);
            for gap in &v.itls[i] {
                t += gap;
                chunks.push(t);
            }
        }
        if tokens > chunks.len() && !chunks.is_empty() {
            timing = Timing::PerChunk;
        }
        let token_times = spread(&chunks, tokens);
        let outcome = match &error {
            None => End::Served,
            Some(e) if token_times.is_empty() && is_refusal(None, e) => End::Refused,
            Some(_) => End::Failed,
        };
        let end = token_times.last().copied().unwrap_or(start);
        reqs.push(Req { start, end, outcome, token_times });
    }
    sink.run(RunMeta { name: String::new(), level, duration: v.duration, timing });
    for r in reqs {
        sink.request(r);
    }
    Ok(())
}

// ---------------------------------------------------------------- GuideLLM

fn read_guidellm(path: &Path, sink: &mut dyn Sink) -> Result<()> {
    let mut text = String::new();
    open(path)?.read_to_string(&mut text)?;
    let doc: Value = if text.trim_start().starts_with('{') { serde_json::from_str(&text)? } else { serde_yaml_ng::from_str(&text)? };
    drop(text);
    let benchmarks = doc.get("benchmarks").and_then(Value::as_array).context("no \"benchmarks\" list")?;
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    for (bi, b) in benchmarks.iter().enumerate() {
        let strategy = b.pointer("/config/strategy").or_else(|| b.pointer("/args/strategy")).or_else(|| b.get("scheduler").and_then(|s| s.get("strategy")));
        let level = strategy.and_then(|s| {
            let kind = s.get("type_").and_then(Value::as_str).unwrap_or("");
            match kind {
                "concurrent" => f(s, "streams").map(Level::Concurrency),
                "synchronous" => Some(Level::Concurrency(1.0)),
                "constant" | "poisson" | "async" => f(s, "rate").map(Level::Rate),
                _ => None,
            }
        });
        let name = strategy
            .and_then(|s| s.get("type_").and_then(Value::as_str))
            .map_or_else(|| format!("benchmark {}", bi + 1), |k| format!("benchmark {} ({k})", bi + 1));
        let duration = match (f(b, "start_time"), f(b, "end_time")) {
            (Some(s), Some(e)) if e > s => Some(e - s),
            _ => None,
        };
        sink.run(RunMeta { name, level, duration, timing: Timing::Estimated });
        let groups = b.get("requests").context("a benchmark without \"requests\" (was the report saved with per-request data?)")?;
        for (group, outcome) in [("successful", End::Served), ("errored", End::Failed), ("incomplete", End::Cancelled)] {
            for r in groups.get(group).and_then(Value::as_array).into_iter().flatten() {
                let t = r.pointer("/info/timings").unwrap_or(&Value::Null);
                let start = f(t, "request_start").or_else(|| f(r, "request_start_time")).or_else(|| f(r, "start_time"));
                let Some(start) = start else { continue };
                let end = f(t, "request_end").or_else(|| f(r, "request_end_time")).or_else(|| f(r, "end_time")).unwrap_or(start);
                let first = f(t, "first_token_iteration").or_else(|| f(r, "first_token_time"));
                let last = f(t, "last_token_iteration").or_else(|| f(r, "last_token_time")).or(first);
                let n = r
                    .pointer("/output_metrics/text_tokens")
                    .and_then(Value::as_f64)
                    .or_else(|| r.pointer("/output_metrics/total_tokens").and_then(Value::as_f64))
                    .or_else(|| f(r, "output_tokens"))
                    .unwrap_or(0.0)
                    .max(0.0) as usize;
                let token_times = match (first, last) {
                    (Some(a), Some(z)) => uniform(a, z.max(a), n),
                    _ => vec![],
                };
                let error = r.pointer("/info/error").and_then(Value::as_str).unwrap_or("");
                let outcome = if outcome == End::Failed && token_times.is_empty() && is_refusal(None, error) { End::Refused } else { outcome };
                sink.request(Req { start, end, outcome, token_times });
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- inference-perf

#[derive(Deserialize, Default)]
struct IpResponse {
    #[serde(default)]
    output_tokens: usize,
    #[serde(default)]
    output_token_times: Vec<f64>,
    #[serde(default)]
    chunk_times: Vec<f64>,
}

#[derive(Deserialize)]
struct IpInfo {
    #[serde(default)]
    response_metrics: Option<IpResponse>,
    // Older releases kept the response's fields in `info` itself.
    #[serde(default)]
    output_tokens: Option<usize>,
    #[serde(default)]
    output_token_times: Option<Vec<f64>>,
}

#[derive(Deserialize)]
struct IpError {
    #[serde(default)]
    error_type: String,
    #[serde(default)]
    error_msg: String,
}

#[derive(Deserialize)]
struct IpRecord {
    start_time: f64,
    end_time: f64,
    #[serde(default)]
    info: Option<IpInfo>,
    #[serde(default)]
    error: Option<IpError>,
    #[serde(default)]
    stage_id: Option<i64>,
}

fn read_inference_perf(r: Box<dyn BufRead>, sink: &mut dyn Sink) -> Result<()> {
    let recs: Vec<IpRecord> = serde_json::from_reader(r)?;
    // Stages (load levels) run one after another; records without one are one run.
    let mut stages: BTreeMap<i64, Vec<Req>> = BTreeMap::new();
    let mut timing = Timing::PerToken;
    for rec in recs {
        let (n, times, chunks) = match rec.info {
            Some(IpInfo { response_metrics: Some(m), .. }) => (m.output_tokens, m.output_token_times, m.chunk_times),
            Some(IpInfo { output_tokens, output_token_times, .. }) => (output_tokens.unwrap_or(0), output_token_times.unwrap_or_default(), vec![]),
            None => (0, vec![], vec![]),
        };
        let token_times = if times.len() >= n.max(1) {
            times
        } else if !chunks.is_empty() {
            timing = timing.max(Timing::PerChunk);
            spread(&chunks, n)
        } else if n > 0 {
            // Not streamed: the whole answer at the end.
            timing = timing.max(Timing::Estimated);
            vec![rec.end_time; n]
        } else {
            times
        };
        let outcome = match &rec.error {
            None => End::Served,
            Some(e) => {
                let code = e.error_type.strip_prefix("HTTP Error ").and_then(|c| c.trim().parse().ok());
                if token_times.is_empty() && is_refusal(code, &format!("{} {}", e.error_type, e.error_msg)) {
                    End::Refused
                } else {
                    End::Failed
                }
            }
        };
        stages.entry(rec.stage_id.unwrap_or(0)).or_default().push(Req { start: rec.start_time, end: rec.end_time, outcome, token_times });
    }
    let many = stages.len() > 1;
    for (stage, reqs) in stages {
        sink.run(RunMeta { name: if many { format!("stage {stage}") } else { String::new() }, level: None, duration: None, timing });
        for r in reqs {
            sink.request(r);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- pace

#[derive(Deserialize)]
struct PaceTimeline {
    record: pace_scheduler::slo::RequestRecord,
}

#[derive(Deserialize)]
struct PaceResult {
    #[serde(default)]
    request_rate: Option<Value>,
    #[serde(default)]
    max_concurrency: Option<f64>,
    #[serde(default)]
    closed_loop: bool,
    timelines: Vec<PaceTimeline>,
}

fn read_pace(r: Box<dyn BufRead>, sink: &mut dyn Sink) -> Result<()> {
    use pace_scheduler::slo::Outcome;
    let v: PaceResult = serde_json::from_reader(r)?;
    let rate = v.request_rate.as_ref().and_then(Value::as_f64).filter(|r| r.is_finite());
    let level = match (v.max_concurrency, rate) {
        (Some(c), _) if v.closed_loop || rate.is_none() => Some(Level::Concurrency(c)),
        (_, Some(r)) => Some(Level::Rate(r)),
        _ => None,
    };
    sink.run(RunMeta { name: String::new(), level, duration: None, timing: Timing::PerToken });
    for t in v.timelines {
        let r = t.record;
        let outcome = match r.outcome {
            Outcome::Completed => End::Served,
            Outcome::Rejected => End::Refused,
            Outcome::Aborted | Outcome::Abandoned => End::Cancelled,
            Outcome::Dropped | Outcome::Failed => End::Failed,
        };
        sink.request(Req { start: r.arrival, end: r.end, outcome, token_times: r.token_times });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_spread_over_chunks() {
        assert_eq!(spread(&[1.0, 2.0, 3.0], 3), vec![1.0, 2.0, 3.0]);
        assert_eq!(spread(&[1.0, 2.0], 4), vec![1.0, 1.0, 2.0, 2.0]);
        assert_eq!(spread(&[1.0, 2.0, 3.0], 4), vec![1.0, 1.0, 2.0, 3.0]);
        assert_eq!(spread(&[1.0, 2.0, 3.0], 1), vec![1.0, 2.0, 3.0], "a short count keeps a token per chunk");
        assert!(spread(&[], 5).is_empty());
        assert_eq!(uniform(1.0, 2.0, 3), vec![1.0, 1.5, 2.0]);
        assert_eq!(uniform(1.0, 2.0, 1), vec![1.0]);
    }

    #[test]
    fn refusals_by_status_or_reason() {
        assert!(is_refusal(Some(429), ""));
        assert!(is_refusal(Some(503), ""));
        assert!(!is_refusal(Some(500), "Service Unavailable"), "a status beats the text");
        assert!(is_refusal(None, "Too Many Requests"));
        assert!(!is_refusal(None, "Internal Server Error"));
    }
}
