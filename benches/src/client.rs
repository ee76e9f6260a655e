//! One streaming request against an OpenAI-compatible server, timed on the client.
//!
//! Arrival is the moment the request is handed to the connection (after any concurrency slot
//! was acquired); token times come from the SSE frames as [`crate::sse`] describes. How a
//! request ends decides its [`Outcome`]:
//! - HTTP 429 or 503 before the stream: `Rejected` (admission control; `Retry-After` kept);
//! - any other HTTP error, a connection error, a broken or malformed stream, a stream that ends
//!   without `[DONE]`, an error event, or `finish_reason: "error"`: `Failed`;
//! - an error event whose code, type or message mentions "drop" (pace's `drop-late` policy):
//!   `Dropped`;
//! - `finish_reason: "abort"`, the benchmark's hard time limit cutting the stream, or the run
//!   ending once its counted requests have: `Aborted`;
//! - the client's patience running out: it closes the connection at the moment its idle latency
//!   reaches its patience, judged from its own frame times (evaluation.md, point 3):
//!   `Abandoned`;
//! - otherwise, `[DONE]` after the last chunk: `Completed`.

use std::time::Duration;

use pace_scheduler::slo::{Outcome, RequestRecord, SloClass};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::dataset::Prompt;
use crate::sse::{parse_chunk, token_times, truncate, SseParser};

/// Seconds since the start of a run.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn start() -> Self {
        Self { start: Instant::now() }
    }

    /// Seconds since the start.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// The instant `offset` seconds after the start.
    pub fn at(&self, offset: f64) -> Instant {
        self.start + Duration::from_secs_f64(offset.max(0.0))
    }
}

/// The API a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/v1/completions`: `prompt`, `max_tokens`, chunks carry `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: one user message, `max_completion_tokens`, chunks carry
    /// `choices[0].delta.content`.
    Chat,
}

/// A server to benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// Name in reports.
    pub label: String,
    /// Base URL, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    /// Endpoint path, e.g. `/v1/completions`.
    pub endpoint: String,
    /// Model name sent in each request.
    pub model: String,
    /// Bearer token, if the server wants one.
    #[serde(skip)]
    pub api_key: Option<String>,
    /// Longest prompt plus output the server takes, if it says (`/v1/models`).
    #[serde(default)]
    pub max_model_len: Option<usize>,
}

impl Target {
    /// Full URL of the endpoint.
    pub fn url(&self) -> String {
        format!("{}{}", self.base_url.trim_end_matches('/'), self.endpoint)
    }

    /// Which API the endpoint speaks, from its path.
    pub fn api(&self) -> Api {
        if self.endpoint.trim_end_matches('/').ends_with("chat/completions") {
            Api::Chat
        } else {
            Api::Completions
        }
    }
}

/// Per-request options shared by every request of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestOptions {
    /// Send `ignore_eos: true` (vLLM, pace and llama.cpp honour it) so outputs reach `max_tokens`.
    pub ignore_eos: bool,
    /// Ask for the usage chunk (`stream_options.include_usage`) and count tokens from it.
    pub include_usage: bool,
    /// Sampling temperature (vLLM's benchmark defaults to greedy, 0).
    pub temperature: f64,
    /// Extra fields merged into every body (`--extra-body`), overriding the defaults.
    pub extra_body: Map<String, Value>,
}

/// The JSON body of one streaming request asking for `max_tokens`.
pub fn request_body(target: &Target, prompt: &Prompt, max_tokens: usize, opts: &RequestOptions) -> Value {
    let mut body = json!({
        "model": target.model,
        "stream": true,
        "temperature": opts.temperature,
    });
    let obj = body.as_object_mut().expect("object literal");
    match target.api() {
        Api::Completions => {
            obj.insert("prompt".into(), json!(prompt.text));
            obj.insert("max_tokens".into(), json!(max_tokens));
        }
        Api::Chat => {
            obj.insert("messages".into(), json!([{"role": "user", "content": prompt.text}]));
            obj.insert("max_completion_tokens".into(), json!(max_tokens));
        }
    }
    if opts.include_usage {
        obj.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if opts.ignore_eos {
        obj.insert("ignore_eos".into(), json!(true));
    }
    for (k, v) in &opts.extra_body {
        obj.insert(k.clone(), v.clone());
    }
    body
}

/// One request as the client saw it: the metrics' input and what the report needs besides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestResult {
    /// Index in the workload.
    pub index: usize,
    /// Planned send time, seconds from the start of the run.
    pub scheduled: f64,
    /// Timestamps and outcome (arrival = actual send time, seconds from the start of the run).
    pub record: RequestRecord,
    /// Prompt tokens under the benchmark's tokenizer.
    pub prompt_len: usize,
    /// Output tokens asked for.
    pub max_tokens: usize,
    /// The prompt's true output length (the dataset's `output_len`): what it would produce if
    /// served to the end, for the ceiling.
    #[serde(default)]
    pub true_len: usize,
    /// HTTP status, if a response head arrived.
    pub status: Option<u16>,
    /// `finish_reason` of the last chunk.
    pub finish_reason: Option<String>,
    /// Server's `usage.prompt_tokens`.
    pub usage_prompt_tokens: Option<usize>,
    /// Server's `usage.completion_tokens`.
    pub usage_completion_tokens: Option<usize>,
    /// SSE frames that carried output text.
    pub content_frames: usize,
    /// `Retry-After` of a rejection, seconds.
    pub retry_after: Option<f64>,
    /// What went wrong, for anything but a completed request.
    pub error: Option<String>,
}

/// State of one exchange, filled in as it goes so a cut-off request keeps what it received.
#[derive(Debug, Default)]
pub struct Exchange {
    arrival: f64,
    status: Option<u16>,
    frame_times: Vec<f64>,
    usage_prompt: Option<usize>,
    usage_completion: Option<usize>,
    finish_reason: Option<String>,
    retry_after: Option<f64>,
    error: Option<String>,
    verdict: Option<Outcome>,
    done: bool,
    last_read: f64,
    started: bool,
}

/// The error of a request cut by the run's hard time limit.
pub const CUT_BY_TIME_LIMIT: &str = "cut by the run's time limit";

/// The error of an uncounted request cut when every counted request had ended.
pub const CUT_AFTER_COUNTED: &str = "cut: every counted request had ended";

/// The error of a request whose client's patience ran out.
pub const PATIENCE_RAN_OUT: &str = "the client's patience ran out";

/// A client that leaves when its idle latency reaches `patience` seconds, for reading `class`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Leave {
    /// The reader's class (deadlines).
    pub class: SloClass,
    /// Seconds of idle latency it tolerates.
    pub patience: f64,
}

/// Sleeps until `t` on `clock`, or forever for `None`.
async fn until(clock: &Clock, t: Option<f64>) {
    match t {
        Some(t) => tokio::time::sleep_until(clock.at(t)).await,
        None => std::future::pending().await,
    }
}

/// Largest error body read from a refused request.
const MAX_ERROR_BODY: usize = 64 * 1024;

impl Exchange {
    fn fail(&mut self, outcome: Outcome, message: String, now: f64) {
        self.verdict.get_or_insert(outcome);
        self.error.get_or_insert(message);
        self.last_read = now;
    }

    fn on_event(&mut self, data: &str, now: f64) {
        let c = parse_chunk(data);
        if c.done {
            self.done = true;
            return;
        }
        if let Some((message, kind)) = c.error {
            let dropped = format!("{kind} {message}").to_ascii_lowercase().contains("drop");
            let outcome = if dropped { Outcome::Dropped } else { Outcome::Failed };
            self.fail(outcome, format!("error event [{kind}]: {message}"), now);
        }
        if !c.text.is_empty() {
            self.frame_times.push(now);
        }
        if c.finish_reason.is_some() {
            self.finish_reason = c.finish_reason;
        }
        self.usage_completion = c.completion_tokens.or(self.usage_completion);
        self.usage_prompt = c.prompt_tokens.or(self.usage_prompt);
    }

    /// When a client with `leave` gives up if no further frame comes.
    fn departure(&self, leave: Option<Leave>) -> Option<f64> {
        let l = leave.filter(|l| l.patience.is_finite())?;
        Some(l.class.departure(self.arrival, self.frame_times.len(), l.patience))
    }

    fn abandon(&mut self, at: f64) {
        self.verdict.get_or_insert(Outcome::Abandoned);
        self.error.get_or_insert(PATIENCE_RAN_OUT.to_string());
        self.last_read = at;
    }

    /// Runs the request, recording into `self` as it goes. With `leave`, the client closes the
    /// connection once its idle latency reaches its patience (dropping the response does).
    pub async fn run(&mut self, client: &reqwest::Client, target: &Target, body: &Value, clock: &Clock, leave: Option<Leave>) {
        let mut req = client.post(target.url()).header("content-type", "application/json").body(body.to_string());
        if let Some(key) = &target.api_key {
            req = req.bearer_auth(key);
        }
        self.arrival = clock.now();
        self.last_read = self.arrival;
        self.started = true;
        let dep = self.departure(leave);
        let sent = tokio::select! {
            r = req.send() => r,
            _ = until(clock, dep) => return self.abandon(dep.unwrap_or_default()),
        };
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => return self.fail(Outcome::Failed, format!("request failed: {e}"), clock.now()),
        };
        let status = resp.status();
        self.status = Some(status.as_u16());
        if !status.is_success() {
            self.retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<f64>().ok());
            let mut body = Vec::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_ERROR_BODY {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&body);
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_else(|| truncate(text.trim(), 300));
            let outcome = if matches!(status.as_u16(), 429 | 503) { Outcome::Rejected } else { Outcome::Failed };
            return self.fail(outcome, format!("HTTP {}: {message}", status.as_u16()), clock.now());
        }
        let mut parser = SseParser::default();
        loop {
            let dep = self.departure(leave);
            let chunk = tokio::select! {
                c = resp.chunk() => c,
                _ = until(clock, dep) => return self.abandon(dep.unwrap_or_default()),
            };
            match chunk {
                Ok(Some(bytes)) => {
                    let now = clock.now();
                    self.last_read = now;
                    for data in parser.push(&bytes) {
                        self.on_event(&data, now);
                    }
                    if self.done {
                        break;
                    }
                }
                Ok(None) => {
                    let now = clock.now();
                    self.last_read = now;
                    if let Some(data) = parser.finish() {
                        self.on_event(&data, now);
                    }
                    break;
                }
                Err(e) => return self.fail(Outcome::Failed, format!("stream broke: {e}"), clock.now()),
            }
        }
    }

    /// Whether [`Self::run`] began (the request was handed to the connection).
    pub fn started(&self) -> bool {
        self.started
    }

    /// The finished request, which asked for `max_tokens`. `cut`: the run stopped it at that
    /// time, for that reason.
    pub fn finish(self, index: usize, scheduled: f64, prompt: &Prompt, max_tokens: usize, class: SloClass, cut: Option<(f64, &str)>) -> RequestResult {
        let (outcome, error, end) = if let Some((t, why)) = cut {
            (Outcome::Aborted, Some(why.to_string()), t)
        } else if let Some(v) = self.verdict {
            (v, self.error, self.last_read)
        } else if !self.done {
            (Outcome::Failed, Some("stream ended without [DONE]".to_string()), self.last_read)
        } else {
            match self.finish_reason.as_deref() {
                Some("abort") => (Outcome::Aborted, Some("finish_reason abort".to_string()), self.last_read),
                Some("error") => (Outcome::Failed, Some("finish_reason error".to_string()), self.last_read),
                _ => (Outcome::Completed, None, self.last_read),
            }
        };
        let times = token_times(&self.frame_times, self.usage_completion);
        let end = if outcome == Outcome::Completed { times.last().copied().unwrap_or(end) } else { end };
        RequestResult {
            index,
            scheduled,
            record: RequestRecord { arrival: self.arrival, token_times: times, outcome, end, class },
            prompt_len: prompt.prompt_len,
            max_tokens,
            true_len: prompt.output_len,
            status: self.status,
            finish_reason: self.finish_reason,
            usage_prompt_tokens: self.usage_prompt,
            usage_completion_tokens: self.usage_completion,
            content_frames: self.frame_times.len(),
            retry_after: self.retry_after,
            error,
        }
    }
}

/// The HTTP client of a run: no overall timeout (the run's limits bound it), small connect timeout.
pub fn http_client(max_connections: usize) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).pool_max_idle_per_host(max_connections).tcp_nodelay(true).build()?)
}

/// The first model a server lists on `/v1/models`, and its `max_model_len` when the server
/// says (vLLM and pace do).
pub async fn first_model(client: &reqwest::Client, base_url: &str, api_key: Option<&str>) -> anyhow::Result<(String, Option<usize>)> {
    let url = format!("{}/v1/models", base_url.trim_end_matches('/'));
    let mut req = client.get(&url);
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    let v: Value = serde_json::from_slice(&resp.bytes().await?).map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    let id = v.pointer("/data/0/id").and_then(|x| x.as_str()).map(str::to_owned).ok_or_else(|| anyhow::anyhow!("GET {url}: no model listed; pass --model"))?;
    Ok((id, v.pointer("/data/0/max_model_len").and_then(|x| x.as_u64()).map(|n| n as usize)))
}
