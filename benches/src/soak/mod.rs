//! `pace bench soak`: a long, hostile, bounded run against one pace server, judged by
//! pass/fail checks (docs/reliability-soak.md is its report).
//!
//! The run, in order:
//! 1. **Saturation.** Unless `--request-rate` is given, a closed loop of
//!    `--calibrate-concurrency` polite clients (the soak's request mix, nobody leaves) runs for
//!    `--calibrate-s`; saturation is the rate of requests it completed over the last two thirds.
//!    The soak then offers `--overload` times that (1.5x by default).
//! 2. **Load.** For `--duration` seconds, seeded Poisson arrivals of a mix of requests: both
//!    endpoints, streaming and not, `n` = 1 and 2, sampled (temperature 0.8) so outputs end by
//!    themselves at different lengths. A `--disconnect-fraction` of the clients leave at a random
//!    moment: while admission is decided (the raw request is written and the socket closed
//!    after 0-300 ms, before any response), once the response head has come but no token, in
//!    the middle of a stream, after the first of two streamed choices has finished, or (not
//!    streaming) at a random time, which may fall after one of two choices has finished.
//!    Beside them, `--slow-connections` sockets send a request head at one byte per
//!    `--slow-byte-interval` seconds, and open a new one whenever the server cuts one.
//!    Throughout, `/health` is probed every second (a fresh connection each time) and
//!    `/metrics` read every 5 s (RSS, running, waiting, KV usage, the in-flight idle gauge).
//! 3. **Drain.** Sending stops; every client ends (each is bounded by `--request-timeout`);
//!    the soak waits until the server is idle.
//!
//! The checks:
//! - **no 5xx**: no client got a 5xx other than drop-late's deliberate 503 `dropped` (smooth's
//!   refusals, 429 `predicted_late`, are counted apart; both carry Retry-After), no
//!   stream carried an error event other than drop-late's, and the server counted no 500;
//! - **served**: every request whose client stayed ended properly (every choice finished, the
//!   stream ended with `[DONE]`), or was refused with 429 / drop-late's 503;
//! - **accounted**: the server's `pace_http_requests_total` for the two generation routes grew
//!   by exactly the number of requests sent (a client that left before the response head is
//!   status 499); `pace_requests_total` (one per choice the engine took) grew by at least the
//!   choices of requests answered 200 and at most the choices sent;
//! - **idle**: afterwards running = waiting = 0, KV usage = 0 and
//!   `pace_inflight_max_idle_latency_seconds` = 0;
//! - **memory**: RSS (`process_resident_memory_bytes`) over the last `--rss-window` seconds of
//!   the load grows by less than `--rss-slope-limit` MB/min (a least-squares slope; judged only
//!   when the load lasts at least the window plus a minute);
//! - **health**: every probe answered 200 within `--health-limit` seconds;
//! - **slow connections cut**: each slow socket was cut by the server (its header timeout)
//!   within `--slow-cut-limit` seconds.
//!
//! Every run is bounded: in time (`--duration`, `--request-timeout`, `--drain-timeout`), in
//! requests (`--max-requests`) and in sockets (`--slow-connections` plus the requests in flight).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::arrivals::ArrivalProcess;
use crate::launch::ServerArgs;
use crate::sse::SseParser;

mod report;

use report::{judge, markdown, summary_table};
pub use report::{slope, Check, SoakReport};

/// `pace bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Model name sent with each request (default: the first one on /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds of load.
    #[arg(long, default_value_t = 600.0)]
    pub duration: f64,
    /// Offered requests per second; default: --overload times the measured saturation.
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Offered load over saturation.
    #[arg(long, default_value_t = 1.5)]
    pub overload: f64,
    /// Seconds of the closed loop that measures saturation.
    #[arg(long, default_value_t = 60.0)]
    pub calibrate_s: f64,
    /// Clients of that closed loop.
    #[arg(long, default_value_t = 32)]
    pub calibrate_concurrency: usize,
    /// Fraction of clients that leave at a random moment.
    #[arg(long, default_value_t = 0.2)]
    pub disconnect_fraction: f64,
    /// Sockets that send a request head one byte at a time.
    #[arg(long, default_value_t = 200)]
    pub slow_connections: usize,
    /// Seconds between two bytes of a slow connection.
    #[arg(long, default_value_t = 1.0)]
    pub slow_byte_interval: f64,
    /// A slow connection must be cut within this many seconds (the server's --header-timeout,
    /// 15 s by default, plus slack).
    #[arg(long, default_value_t = 20.0)]
    pub slow_cut_limit: f64,
    /// Output tokens asked for, uniform in MIN:MAX.
    #[arg(long, default_value = "16:128")]
    pub max_tokens: String,
    /// Sampling temperature of every request.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Seed of the mix, the arrivals and the departures (default: a fresh one, saved).
    #[arg(long)]
    pub seed: Option<u64>,
    /// A client still waiting after this many seconds gives up (and the check fails).
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Seconds to wait, after the load, for every client to end and the server to be idle.
    #[arg(long, default_value_t = 900.0)]
    pub drain_timeout: f64,
    /// Seconds at the end of the load over which RSS growth is judged.
    #[arg(long, default_value_t = 300.0)]
    pub rss_window: f64,
    /// Largest RSS growth allowed over that window, MB (10^6 bytes) per minute.
    #[arg(long, default_value_t = 1.0)]
    pub rss_slope_limit: f64,
    /// Slowest /health answer allowed, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub health_limit: f64,
    /// Hard cap on requests sent.
    #[arg(long, default_value_t = 100_000)]
    pub max_requests: usize,
    /// Directory for report.md and soak.json (default: pace-soak-DATE).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
}

/// Prompts of the mix: short questions and long passages, so prompt lengths vary.
const PROMPTS: [&str; 10] = [
    "Write a haiku about the sea.",
    "What is the capital of France? Answer in one sentence.",
    "List three uses of a paper clip.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me a recipe for a simple tomato soup, with the ingredients first and then the steps.",
    "Summarize the following text in two sentences. The history of the bicycle begins in the early nineteenth century, when inventors in Europe built two-wheeled machines that riders pushed along with their feet. Pedals attached to the front wheel came decades later, and the tall high-wheelers of the 1870s made riding fast but dangerous. The safety bicycle, with two wheels of equal size and a chain driving the rear one, settled the design by the 1890s, and pneumatic tyres made it comfortable. Cycling clubs, road improvements and the freedom bicycles gave to women followed.",
    "Translate into French: The train leaves at seven in the morning, so we should pack tonight.",
    "Write a short story, about five sentences long, in which a lighthouse keeper finds a message in a bottle. The story should have a surprising but gentle ending, and the keeper should have a name. Do not use dialogue.",
    "What are the differences between a list and a tuple in Python? Give an example of each.",
    "You are reviewing a pull request. The change replaces a recursive directory walk with an iterative one that keeps an explicit stack, adds a depth limit of 64, and skips symbolic links. Write three review comments: one about correctness, one about error handling, and one about tests.",
];

/// When a leaving client leaves.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Leave {
    /// The raw request is written, the socket closed 0-300 ms later without reading.
    Admission,
    /// Once the response head has come, before any token.
    BeforeFirstToken,
    /// After a random number of content frames.
    MidStream,
    /// After the first of two streamed choices has finished.
    AfterFirstChoice,
    /// Not streaming: at a random time in the first few seconds.
    Anytime,
}

/// One request of the mix.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Place in the arrival sequence.
    pub index: usize,
    /// Send time, seconds from the start of the load.
    pub at: f64,
    /// `/v1/chat/completions` (else `/v1/completions`).
    pub chat: bool,
    /// `stream: true`.
    pub stream: bool,
    /// Choices asked for.
    pub n: usize,
    /// `max_tokens`.
    pub max_tokens: usize,
    /// Index into the prompts.
    pub prompt: usize,
    /// Whether and when the client leaves.
    pub leave: Option<Leave>,
    /// For `Admission` and `Anytime`: seconds after sending.
    pub leave_after_s: f64,
    /// For `MidStream`: content frames read first.
    pub leave_after_frames: usize,
}

fn parse_range(s: &str) -> Result<(usize, usize)> {
    let (a, b) = s.split_once(':').context("--max-tokens is MIN:MAX")?;
    let (a, b): (usize, usize) = (a.trim().parse()?, b.trim().parse()?);
    if a == 0 || a > b {
        bail!("--max-tokens MIN:MAX needs 1 <= MIN <= MAX");
    }
    Ok((a, b))
}

/// The request with this index of the seeded mix.
pub fn plan(index: usize, at: f64, seed: u64, max_tokens: (usize, usize), disconnect_fraction: f64) -> Plan {
    let mut rng = StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let chat = rng.random_bool(0.5);
    let stream = rng.random_bool(0.5);
    let n = if rng.random_bool(0.5) { 2 } else { 1 };
    let max_tokens = rng.random_range(max_tokens.0..=max_tokens.1);
    let prompt = rng.random_range(0..PROMPTS.len());
    let leave = if rng.random_bool(disconnect_fraction.clamp(0.0, 1.0)) {
        let moments: &[Leave] = match (stream, n) {
            (true, 2) => &[Leave::Admission, Leave::BeforeFirstToken, Leave::MidStream, Leave::AfterFirstChoice],
            (true, _) => &[Leave::Admission, Leave::BeforeFirstToken, Leave::MidStream],
            (false, _) => &[Leave::Admission, Leave::Anytime],
        };
        Some(moments[rng.random_range(0..moments.len())])
    } else {
        None
    };
    let leave_after_s = match leave {
        Some(Leave::Admission) => rng.random_range(0.0..0.3),
        Some(Leave::Anytime) => rng.random_range(0.0..5.0),
        _ => 0.0,
    };
    let leave_after_frames = rng.random_range(1..max_tokens.max(2));
    Plan { index, at, chat, stream, n, max_tokens, prompt, leave, leave_after_s, leave_after_frames }
}

/// The request body of a plan.
pub fn body(p: &Plan, model: &str, temperature: f64) -> Value {
    let mut b = if p.chat {
        json!({"model": model, "messages": [{"role": "user", "content": PROMPTS[p.prompt]}]})
    } else {
        json!({"model": model, "prompt": PROMPTS[p.prompt]})
    };
    b["max_tokens"] = json!(p.max_tokens);
    b["n"] = json!(p.n);
    b["temperature"] = json!(temperature);
    if p.stream {
        b["stream"] = json!(true);
    }
    b
}

/// How one request ended, as its client saw it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ended {
    /// The response status, if a head was read.
    pub status: Option<u16>,
    /// `completed`, `left`, `rejected` (429), `shed` (429 predicted_late), `dropped`
    /// (drop-late), `http_error`, `stream_error`, `incomplete`, `transport_error`, `timeout`.
    pub kind: &'static str,
    /// What went wrong, or where the client left.
    pub detail: Option<String>,
    /// A refusal carried Retry-After.
    pub retry_after: bool,
    /// Seconds from the start of the load to the end.
    pub end_s: f64,
}

/// One request: the plan and how it ended.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// What was sent.
    pub plan: Plan,
    /// How it ended.
    pub ended: Ended,
}

/// The target's address, for raw sockets.
pub(crate) fn socket_addr(base_url: &str) -> Result<SocketAddr> {
    let rest = base_url.trim_end_matches('/').strip_prefix("http://").context("the soak speaks plain http://")?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = if hostport.contains(':') { hostport.to_string() } else { format!("{hostport}:80") };
    std::net::ToSocketAddrs::to_socket_addrs(&hostport)?.next().with_context(|| format!("resolving {hostport}"))
}

/// The target of a soak.
#[derive(Debug, Clone)]
struct Target {
    base_url: String,
    addr: SocketAddr,
    model: String,
    api_key: Option<String>,
}

impl Target {
    fn path(p: &Plan) -> &'static str {
        if p.chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        }
    }
}

fn error_kind(status: u16, body: &str) -> &'static str {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let code = v.pointer("/error/code").and_then(|c| c.as_str()).unwrap_or("");
    let message = v.pointer("/error/message").and_then(|c| c.as_str()).unwrap_or("");
    match status {
        429 if message.contains("predicted_late") => "shed",
        429 => "rejected",
        503 if code == "dropped" => "dropped",
        _ => "http_error",
    }
}

/// Writes the whole request on a raw socket and closes it `after` seconds later without
/// reading: the server has the request, the client is gone. A response head that came first is
/// noted.
async fn leave_during_admission(t: &Target, p: &Plan, body: &Value) -> Ended {
    let payload = body.to_string();
    let mut head = format!("POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", Target::path(p), t.addr, payload.len());
    if let Some(k) = &t.api_key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    head.push_str("\r\n");
    let mut s = match TcpStream::connect(t.addr).await {
        Ok(s) => s,
        Err(e) => return Ended { kind: "transport_error", detail: Some(format!("connect: {e}")), ..Ended::default() },
    };
    if let Err(e) = s.write_all(format!("{head}{payload}").as_bytes()).await {
        return Ended { kind: "transport_error", detail: Some(format!("write: {e}")), ..Ended::default() };
    }
    tokio::time::sleep(Duration::from_secs_f64(p.leave_after_s)).await;
    let mut buf = [0u8; 32];
    let status = match s.try_read(&mut buf) {
        Ok(n) if n >= 12 => std::str::from_utf8(&buf[9..12]).ok().and_then(|c| c.parse().ok()),
        _ => None,
    };
    Ended { status, kind: "left", detail: Some("admission".into()), ..Ended::default() }
}

/// Runs one request over HTTP, recording into `st` as it goes (so a caller that stops waiting
/// still sees how far it got).
async fn drive(client: &reqwest::Client, t: &Target, p: &Plan, body: &Value, st: &mut Ended) {
    let mut req = client.post(format!("{}{}", t.base_url, Target::path(p))).header("content-type", "application/json").body(body.to_string());
    if let Some(k) = &t.api_key {
        req = req.bearer_auth(k);
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            st.kind = "transport_error";
            st.detail = Some(format!("send: {e}"));
            return;
        }
    };
    let status = resp.status().as_u16();
    st.status = Some(status);
    if status != 200 {
        st.retry_after = resp.headers().contains_key("retry-after");
        let mut text = Vec::new();
        while let Ok(Some(c)) = resp.chunk().await {
            text.extend_from_slice(&c);
            if text.len() > 65_536 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&text).to_string();
        st.kind = error_kind(status, &text);
        st.detail = Some(text.chars().take(300).collect());
        return;
    }
    if !p.stream {
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                st.kind = "transport_error";
                st.detail = Some(format!("body: {e}"));
                return;
            }
        };
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let choices = v["choices"].as_array().cloned().unwrap_or_default();
        let finished = choices.iter().filter(|c| c["finish_reason"].is_string()).count();
        if choices.len() == p.n && finished == p.n {
            st.kind = "completed";
        } else {
            st.kind = "incomplete";
            st.detail = Some(format!("{finished} of {} choices finished: {}", p.n, String::from_utf8_lossy(&bytes).chars().take(300).collect::<String>()));
        }
        return;
    }
    if p.leave == Some(Leave::BeforeFirstToken) {
        st.kind = "left";
        st.detail = Some("before_first_token".into());
        return;
    }
    let mut parser = SseParser::default();
    let (mut frames, mut finished, mut done) = (0usize, BTreeSet::new(), false);
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                st.kind = "transport_error";
                st.detail = Some(format!("stream: {e}"));
                return;
            }
        };
        for data in parser.push(&chunk) {
            if data.trim() == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            if let Some(e) = v.get("error") {
                st.kind = if e["code"] == "dropped" { "dropped" } else { "stream_error" };
                st.detail = Some(data.chars().take(300).collect());
                return;
            }
            for c in v["choices"].as_array().into_iter().flatten() {
                let text = c["text"].as_str().or_else(|| c.pointer("/delta/content").and_then(|x| x.as_str())).unwrap_or("");
                if !text.is_empty() {
                    frames += 1;
                }
                if c["finish_reason"].is_string() {
                    finished.insert(c["index"].as_u64().unwrap_or(0));
                }
            }
            let leave_now = match p.leave {
                Some(Leave::MidStream) => frames >= p.leave_after_frames && finished.len() < p.n,
                Some(Leave::AfterFirstChoice) => !finished.is_empty() && finished.len() < p.n,
                _ => false,
            };
            if leave_now {
                st.kind = "left";
                st.detail = Some(if p.leave == Some(Leave::MidStream) { "mid_stream" } else { "after_first_choice" }.into());
                return;
            }
        }
    }
    if done && finished.len() == p.n {
        st.kind = "completed";
    } else {
        st.kind = "incomplete";
        st.detail = Some(format!("stream closed: [DONE] {done}, {} of {} choices finished", finished.len(), p.n));
    }
}

/// One request of the soak, start to end.
async fn run_one(client: &reqwest::Client, t: &Target, p: &Plan, temperature: f64, timeout: f64, t0: Instant) -> Ended {
    let body = body(p, &t.model, temperature);
    let mut ended = if p.leave == Some(Leave::Admission) {
        leave_during_admission(t, p, &body).await
    } else {
        let mut st = Ended::default();
        let limit = match p.leave {
            Some(Leave::Anytime) => p.leave_after_s.min(timeout),
            _ => timeout,
        };
        let r = tokio::time::timeout(Duration::from_secs_f64(limit), drive(client, t, p, &body, &mut st)).await;
        if r.is_err() {
            if p.leave == Some(Leave::Anytime) {
                st.kind = "left";
                st.detail = Some("anytime".into());
            } else {
                st.kind = "timeout";
                st.detail = Some(format!("no end after {timeout} s"));
            }
        }
        st
    };
    ended.end_s = t0.elapsed().as_secs_f64();
    ended
}

/// Prometheus text: (name, labels, value) per sample line.
pub fn parse_prometheus(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let mut labels = BTreeMap::new();
                let body = rest.trim_end_matches('}');
                let mut rest = body;
                while let Some((k, after)) = rest.split_once("=\"") {
                    let Some(end) = after.find('"') else { break };
                    labels.insert(k.trim_start_matches(',').to_string(), after[..end].to_string());
                    rest = &after[end + 1..];
                }
                (n.to_string(), labels)
            }
            None => (series.to_string(), BTreeMap::new()),
        };
        out.push((name, labels, value));
    }
    out
}

/// The sum of the samples of `name` whose labels pass `keep`.
fn sum(m: &[(String, BTreeMap<String, String>, f64)], name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
    m.iter().filter(|(n, l, _)| n == name && keep(l)).map(|(_, _, v)| v).sum()
}

/// The server's state at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Seconds from the start of the load.
    pub t: f64,
    /// `process_resident_memory_bytes` (0 when not exported).
    pub rss_bytes: f64,
    /// `pace_num_requests_running`.
    pub running: f64,
    /// `pace_num_requests_waiting`.
    pub waiting: f64,
    /// `pace_kv_cache_usage_perc`.
    pub kv_usage: f64,
    /// `pace_inflight_max_idle_latency_seconds`.
    pub inflight_idle_s: f64,
}

type Series = Vec<(String, BTreeMap<String, String>, f64)>;

async fn scrape(client: &reqwest::Client, base: &str) -> Result<Series> {
    let text = client.get(format!("{base}/metrics")).timeout(Duration::from_secs(10)).send().await?.text().await?;
    Ok(parse_prometheus(&text))
}

fn sample_of(m: &Series, t: f64) -> Sample {
    let any = |_: &BTreeMap<String, String>| true;
    Sample {
        t,
        rss_bytes: sum(m, "process_resident_memory_bytes", any),
        running: sum(m, "pace_num_requests_running", any),
        waiting: sum(m, "pace_num_requests_waiting", any),
        kv_usage: sum(m, "pace_kv_cache_usage_perc", any),
        inflight_idle_s: sum(m, "pace_inflight_max_idle_latency_seconds", any),
    }
}

/// The counters the accounting check compares, read at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// `pace_http_requests_total` of the two generation routes, by status.
    pub http: BTreeMap<String, f64>,
    /// `pace_requests_total` by finish reason.
    pub finished: BTreeMap<String, f64>,
    /// `pace_requests_rejected_total` by reason.
    pub rejected: BTreeMap<String, f64>,
    /// Prompt tokens looked up in the prefix cache (`queries`) and found there (`hits`).
    #[serde(default)]
    pub prefix_cache: BTreeMap<String, f64>,
}

fn counters(m: &Series) -> Counters {
    let mut c = Counters::default();
    for (name, labels, v) in m {
        let entry = |map: &mut BTreeMap<String, f64>, key: &str| *map.entry(labels.get(key).cloned().unwrap_or_default()).or_default() += v;
        match name.as_str() {
            "pace_http_requests_total" if labels.get("handler").is_some_and(|h| h == "/v1/completions" || h == "/v1/chat/completions") => {
                entry(&mut c.http, "status")
            }
            "pace_requests_total" => entry(&mut c.finished, "finished_reason"),
            "pace_requests_rejected_total" => entry(&mut c.rejected, "reason"),
            "pace_prefix_cache_queries_total" => *c.prefix_cache.entry("queries".into()).or_default() += v,
            "pace_prefix_cache_hits_total" => *c.prefix_cache.entry("hits".into()).or_default() += v,
            _ => {}
        }
    }
    c
}

fn delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0))).filter(|(_, v)| *v != 0.0).collect()
}

/// What the slow connections saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SlowStats {
    /// Connections opened.
    pub opened: usize,
    /// Connections that could not be opened (refused at accept, reset).
    pub connect_failures: usize,
    /// Connections the server closed.
    pub cut: usize,
    /// Seconds each cut connection lived.
    pub lifetimes_s: Vec<f64>,
    /// First line of what the server wrote before closing, with counts.
    pub responses: BTreeMap<String, usize>,
}

/// One slow connection after another until `stop`: each sends a request head a byte at a time.
pub(crate) async fn slow_connection(addr: SocketAddr, interval: Duration, stop: Arc<AtomicBool>, stats: Arc<Mutex<SlowStats>>) {
    let head = b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nX-Slow: ";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            stats.lock().unwrap().connect_failures += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        stats.lock().unwrap().opened += 1;
        let start = Instant::now();
        let mut i = 0usize;
        let mut got = Vec::new();
        let cut = loop {
            if stop.load(Ordering::Relaxed) {
                break false;
            }
            let byte = head.get(i).copied().unwrap_or(b'a');
            i += 1;
            if s.write_all(&[byte]).await.is_err() {
                break true;
            }
            let mut buf = [0u8; 256];
            tokio::select! {
                r = s.readable() => {
                    let _ = r;
                    match s.try_read(&mut buf) {
                        Ok(0) => break true,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break true,
                    }
                }
                _ = tokio::time::sleep(interval) => {}
            }
        };
        if cut {
            let mut st = stats.lock().unwrap();
            st.cut += 1;
            st.lifetimes_s.push(start.elapsed().as_secs_f64());
            let first = String::from_utf8_lossy(&got).lines().next().unwrap_or("(nothing)").to_string();
            *st.responses.entry(if first.is_empty() { "(nothing)".into() } else { first }).or_default() += 1;
        }
    }
}

/// One `/health` probe.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// Seconds from the start of the load.
    pub t: f64,
    /// Seconds to the answer.
    pub latency_s: f64,
    /// Its status (None: no answer).
    pub status: Option<u16>,
}

/// Probes `/health` every second and samples `/metrics` every 5 s until `stop`.
async fn monitor(base: String, t0: Instant, stop: Arc<AtomicBool>, probes: Arc<Mutex<Vec<Probe>>>, samples: Arc<Mutex<Vec<Sample>>>) {
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("http client");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let start = Instant::now();
        let status = fresh.get(format!("{base}/health")).timeout(Duration::from_secs(10)).send().await.ok().map(|r| r.status().as_u16());
        probes.lock().unwrap().push(Probe { t: t0.elapsed().as_secs_f64(), latency_s: start.elapsed().as_secs_f64(), status });
        if k.is_multiple_of(5) {
            if let Ok(m) = scrape(&fresh, &base).await {
                samples.lock().unwrap().push(sample_of(&m, t0.elapsed().as_secs_f64()));
            }
        }
        k += 1;
    }
}

/// Closed loop of polite clients for `secs`: completed requests per second over its last two
/// thirds.
async fn calibrate(client: &reqwest::Client, t: &Target, a: &SoakArgs, seed: u64, range: (usize, usize)) -> f64 {
    let t0 = Instant::now();
    let counted_from = a.calibrate_s / 3.0;
    let done = Arc::new(Mutex::new(0usize));
    let mut set = JoinSet::new();
    for c in 0..a.calibrate_concurrency.max(1) {
        let (client, t, done, a) = (client.clone(), t.clone(), done.clone(), a.clone());
        set.spawn(async move {
            let mut i = c;
            while t0.elapsed().as_secs_f64() < a.calibrate_s {
                let p = plan(i, 0.0, seed.wrapping_add(1), range, 0.0);
                i += a.calibrate_concurrency;
                let e = run_one(&client, &t, &p, a.temperature, a.request_timeout, t0).await;
                if e.kind == "completed" && e.end_s >= counted_from && e.end_s <= a.calibrate_s {
                    *done.lock().unwrap() += 1;
                } else if e.kind != "completed" {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let n = *done.lock().unwrap();
    n as f64 / (a.calibrate_s - counted_from)
}

/// Polls /metrics until the server is idle (running, waiting, KV usage and the in-flight idle
/// gauge all 0) or `timeout` seconds pass; returns the last sample.
async fn wait_idle(client: &reqwest::Client, base: &str, t0: Instant, timeout: f64) -> Sample {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    loop {
        let s = scrape(client, base).await.map(|m| sample_of(&m, t0.elapsed().as_secs_f64())).unwrap_or_default();
        let idle = s.running == 0.0 && s.waiting == 0.0 && s.kv_usage == 0.0 && s.inflight_idle_s == 0.0;
        if idle || Instant::now() >= deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn count<K: Ord>(map: &mut BTreeMap<K, usize>, k: K) {
    *map.entry(k).or_default() += 1;
}

/// Runs a soak; writes `report.md` and `soak.json`; an error if a check failed.
pub async fn soak(a: &SoakArgs) -> Result<SoakReport> {
    let prov = crate::provenance::collect();
    let range = parse_range(&a.max_tokens)?;
    if !(a.duration > 0.0 && a.overload > 0.0 && a.slow_byte_interval > 0.0 && a.request_timeout > 0.0) {
        bail!("--duration, --overload, --slow-byte-interval and --request-timeout must be positive");
    }
    let seed = a.seed.unwrap_or_else(rand::random);
    let dir = a.result_dir.clone().unwrap_or_else(|| PathBuf::from(format!("pace-soak-{}", prov.date.replace([':', ' '], "-"))));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let (base_url, target_desc, mut server) = a.server.start(&client, &dir.join("logs")).await?;
    let model = match &a.model {
        Some(m) => m.clone(),
        None => crate::client::first_model(&client, &base_url, a.api_key.as_deref()).await?.0,
    };
    let t = Target { addr: socket_addr(&base_url)?, base_url: base_url.clone(), model: model.clone(), api_key: a.api_key.clone() };

    // 1. Saturation.
    let (saturation, rate) = match a.request_rate {
        Some(r) if r > 0.0 => (None, r),
        Some(_) => bail!("--request-rate must be positive"),
        None => {
            eprintln!("measuring saturation: {} clients in a closed loop for {} s", a.calibrate_concurrency, a.calibrate_s);
            let s = calibrate(&client, &t, a, seed, range).await;
            if s <= 0.0 {
                bail!("no request completed while measuring saturation");
            }
            (Some(s), s * a.overload)
        }
    };
    eprintln!("offering {rate:.3} req/s for {} s", a.duration);
    let t_pre = Instant::now();
    wait_idle(&client, &base_url, t_pre, a.drain_timeout).await;
    let before = counters(&scrape(&client, &base_url).await?);

    // 2. Load.
    let t0 = Instant::now();
    let stop_monitor = Arc::new(AtomicBool::new(false));
    let (probes, samples) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let mon = tokio::spawn(monitor(base_url.clone(), t0, stop_monitor.clone(), probes.clone(), samples.clone()));
    let stop_slow = Arc::new(AtomicBool::new(false));
    let slow = Arc::new(Mutex::new(SlowStats::default()));
    let mut slow_tasks = JoinSet::new();
    for _ in 0..a.slow_connections {
        slow_tasks.spawn(slow_connection(t.addr, Duration::from_secs_f64(a.slow_byte_interval), stop_slow.clone(), slow.clone()));
    }
    let expected = (rate * a.duration * 1.5 + 16.0).ceil() as usize;
    let schedule: Vec<f64> = ArrivalProcess::new(rate, 1.0)?.schedule(expected.min(a.max_requests), seed).into_iter().filter(|&s| s < a.duration).collect();
    let mut set = JoinSet::new();
    for (i, &at) in schedule.iter().enumerate() {
        let wait = at - t0.elapsed().as_secs_f64();
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
        let p = plan(i, at, seed, range, a.disconnect_fraction);
        let (client, t, temp, timeout) = (client.clone(), t.clone(), a.temperature, a.request_timeout);
        set.spawn(async move {
            let ended = run_one(&client, &t, &p, temp, timeout, t0).await;
            Record { plan: p, ended }
        });
    }
    let sent = schedule.len();
    stop_slow.store(true, Ordering::Relaxed);
    let load_end = t0.elapsed().as_secs_f64();
    eprintln!("sent {sent} requests in {load_end:.0} s; draining");

    // 3. Drain.
    let mut records = Vec::with_capacity(sent);
    let drain_deadline = Instant::now() + Duration::from_secs_f64(a.drain_timeout + a.request_timeout);
    while let Ok(Some(r)) = tokio::time::timeout_at(drain_deadline.into(), set.join_next()).await {
        if let Ok(r) = r {
            records.push(r);
        }
    }
    set.abort_all();
    while slow_tasks.join_next().await.is_some() {}
    let idle_after = wait_idle(&client, &base_url, t0, a.drain_timeout).await;
    let drain_s = t0.elapsed().as_secs_f64() - load_end;
    let after = counters(&scrape(&client, &base_url).await?);
    stop_monitor.store(true, Ordering::Relaxed);
    mon.await.ok();
    if let Some(s) = server.take() {
        let status = s.stop().await?;
        if !status.success() {
            eprintln!("warning: the server exited with {status}");
        }
    }
    records.sort_by_key(|r| r.plan.index);
    let report =
        judge(a, prov, target_desc, model, seed, saturation, rate, sent, records, before, after, &slow, &probes, &samples, idle_after, drain_s, load_end);
    std::fs::write(dir.join("soak.json"), serde_json::to_string(&report)?)?;
    std::fs::write(dir.join("report.md"), markdown(&report, a))?;
    println!("{}", summary_table(&report));
    println!("wrote {}", dir.join("report.md").display());
    if !report.passed {
        bail!("the soak failed: {}", report.checks.iter().filter(|c| c.verdict == "FAIL").map(|c| c.name).collect::<Vec<_>>().join(", "));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_seeded_and_covers_every_moment() {
        let plans: Vec<Plan> = (0..2000).map(|i| plan(i, 0.0, 7, (16, 128), 0.2)).collect();
        let again: Vec<Plan> = (0..2000).map(|i| plan(i, 0.0, 7, (16, 128), 0.2)).collect();
        assert_eq!(serde_json::to_string(&plans).unwrap(), serde_json::to_string(&again).unwrap());
        let leaving = plans.iter().filter(|p| p.leave.is_some()).count() as f64 / 2000.0;
        assert!((0.16..0.24).contains(&leaving), "{leaving}");
        let moments: BTreeSet<Leave> = plans.iter().filter_map(|p| p.leave).collect();
        assert_eq!(moments.len(), 5, "{moments:?}");
        assert!(plans.iter().all(|p| (16..=128).contains(&p.max_tokens) && (1..=2).contains(&p.n)));
        assert!(plans.iter().filter(|p| p.leave == Some(Leave::AfterFirstChoice)).all(|p| p.stream && p.n == 2));
        assert!(plans.iter().filter(|p| p.leave == Some(Leave::Anytime)).all(|p| !p.stream));
    }

    #[test]
    fn prometheus_text_is_parsed_with_labels() {
        let text = "# HELP x y\npace_http_requests_total{model_name=\"m\",handler=\"/v1/completions\",status=\"499\"} 3\nprocess_resident_memory_bytes 1.5e8\n";
        let m = parse_prometheus(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].1.get("status").map(String::as_str), Some("499"));
        assert_eq!(m[0].1.get("handler").map(String::as_str), Some("/v1/completions"));
        assert_eq!(m[1].2, 1.5e8);
        assert_eq!(counters(&m).http.get("499"), Some(&3.0));
    }

    #[test]
    fn slope_is_least_squares() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 2.0 * i as f64 + 5.0)).collect();
        assert!((slope(&pts).unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(slope(&pts[..2]), None);
    }

    #[test]
    fn refusals_are_told_apart() {
        assert_eq!(error_kind(429, "{}"), "rejected");
        assert_eq!(
            error_kind(429, r#"{"error":{"message":"request rejected at admission (predicted_late); retry after 1.0 s","code":"unavailable"}}"#),
            "shed"
        );
        assert_eq!(error_kind(503, r#"{"error":{"message":"x","code":"dropped"}}"#), "dropped");
        assert_eq!(error_kind(503, r#"{"error":{"message":"the engine has stopped","code":"unavailable"}}"#), "http_error");
        assert_eq!(error_kind(500, "{}"), "http_error");
    }
}
