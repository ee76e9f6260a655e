//! Prometheus metrics: per-token delivery histograms, live goodput gauges over a sliding window,
//! and engine load. Every series carries the `model_name` and `scheduler` labels (global labels
//! of the recorder), so two instances of an A/B test are told apart on one panel. The configured
//! binary-SLO thresholds are bucket boundaries of the TTFT, TPOT and E2E histograms, so
//! attainment can be read as `bucket{le=SLO} / count`.
//!
//! Names follow vLLM's (`vllm:X` is `pace_X`) wherever the meaning is the same; where pace's
//! differs the name does too (docs/metrics.md has the table). Per-token series (TTFT, inter-token
//! latency, token lateness, generated tokens) are observed as each token is delivered, so a
//! stall shows on a panel when the stalled token arrives, not when its request ends; per-request
//! series are observed when the request ends.
//!
//! The gauges come from `pace_scheduler::slo` — the same code the benchmark client uses — over
//! the requests that ended in the last `--metrics-window` seconds, with server-side timestamps:
//! arrival when the request was accepted, each token when the frame carrying it was written.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use pace_scheduler::slo::{Outcome, RequestRecord, SloClass, SloParams};
use pace_scheduler::{FinishReason, RejectReason, SchedulerStats};

const TTFT: &str = "pace_time_to_first_token_seconds";
const ITL: &str = "pace_inter_token_latency_seconds";
const TPOT: &str = "pace_request_time_per_output_token_seconds";
const LATENESS: &str = "pace_token_lateness_seconds";
const PREFILL: &str = "pace_request_prefill_time_seconds";
const DECODE: &str = "pace_request_decode_time_seconds";
const INFERENCE: &str = "pace_request_inference_time_seconds";
const E2E: &str = "pace_e2e_request_latency_seconds";
const IDLE: &str = "pace_user_idle_latency_seconds";
const QUEUE: &str = "pace_request_queue_time_seconds";
const PROMPT_TOKENS: &str = "pace_request_prompt_tokens";
const GEN_TOKENS: &str = "pace_request_generation_tokens";
const STEP: &str = "pace_step_duration_seconds";
const STEP_TOKENS: &str = "pace_iteration_tokens_total";
const STEP_ERROR: &str = "pace_step_time_prediction_error_ratio";
const LENGTH_ERROR: &str = "pace_output_length_prediction_error_ratio";
const GRAMMAR_COMPILE: &str = "pace_structured_output_compile_seconds";
const PREPARE: &str = "pace_request_preparation_seconds";

/// Finish reasons as exported (`finished_reason` label values).
pub const FINISH_REASONS: [&str; 6] = ["stop", "length", "abort", "dropped", "rejected", "error"];

/// The finish reasons `pace_request_success_total` counts (vLLM's `request_success_total`).
pub const SUCCESS_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// The KV cache's configuration, exported as `pace_cache_config_info` (vLLM's `cache_config_info`).
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the pool (`num_gpu_blocks`, whatever the device).
    pub num_blocks: usize,
    /// Element type of the cache (`f32`, `f16`, ...).
    pub cache_dtype: String,
    /// Whether full blocks are shared across requests.
    pub enable_prefix_caching: bool,
}

/// Publishes the cache configuration (once, at start).
pub fn publish_cache_config(c: &CacheConfig) {
    gauge!(
        "pace_cache_config_info",
        "block_size" => c.block_size.to_string(),
        "num_gpu_blocks" => c.num_blocks.to_string(),
        "cache_dtype" => c.cache_dtype.clone(),
        "enable_prefix_caching" => if c.enable_prefix_caching { "True" } else { "False" }
    )
    .set(1.0);
}

/// Label value of a finish reason (one of [`FINISH_REASONS`]).
pub fn finish_label(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Dropped => "dropped",
        FinishReason::Rejected => "rejected",
        FinishReason::Error => "error",
    }
}

/// How a request that finished with `r` counts in the goodput metrics.
pub fn outcome(r: FinishReason) -> Outcome {
    match r {
        FinishReason::Stop | FinishReason::Length => Outcome::Completed,
        FinishReason::Abort => Outcome::Aborted,
        FinishReason::Dropped => Outcome::Dropped,
        FinishReason::Rejected => Outcome::Rejected,
        FinishReason::Error => Outcome::Failed,
    }
}

/// A request refused before it reached the scheduler or by it (`reason` label: a
/// [`reject_label`] or one of [`OTHER_REJECTIONS`]).
pub fn record_rejected(reason: &'static str) {
    counter!("pace_requests_rejected_total", "reason" => reason).increment(1);
}

/// A connection closed at accept because `--max-connections` were open.
pub fn record_connection_refused() {
    counter!("pace_http_connections_refused_total").increment(1);
}

/// A connection the server closed: `idle` (silent past the keep-alive timeout),
/// `header_timeout` (a request's headers not in on time) or `slots_full` (the one idle longest,
/// to make room for a new connection).
pub fn record_connection_closed(reason: &'static str) {
    counter!("pace_http_connections_closed_total", "reason" => reason).increment(1);
}

/// Route patterns as exported (`handler` label values of `pace_http_requests_total`).
pub const HTTP_HANDLERS: [&str; 17] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/health",
    "/ready",
    "/live",
    "/metrics",
    "/version",
    "/get_load",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/v1/chat/completions/render",
    "/v1/completions/render",
];

/// The `handler` label of a matched route pattern (`other` for anything not in [`HTTP_HANDLERS`]).
pub fn http_handler_label(pattern: &str) -> &'static str {
    HTTP_HANDLERS.iter().find(|h| **h == pattern).copied().unwrap_or("other")
}

/// One HTTP request answered with `status` (499: the client left before the response head).
pub fn record_http(handler: &'static str, status: u16) {
    counter!("pace_http_requests_total", "handler" => handler, "status" => status.to_string()).increment(1);
}

/// Prompt tokens of an admitted request.
pub fn record_prompt_tokens(n: usize) {
    counter!("pace_prompt_tokens_total").increment(n as u64);
}

/// Label value of a rejection reason.
pub fn reject_label(r: RejectReason) -> &'static str {
    match r {
        RejectReason::QueueFull => "queue_full",
        RejectReason::QueueTokens => "queue_tokens",
        RejectReason::PredictedLate => "predicted_late",
        RejectReason::TooLong => "too_long",
        RejectReason::Invalid => "invalid",
    }
}

/// Rejection label values beyond the scheduler's reasons.
pub const OTHER_REJECTIONS: [&str; 3] = ["draining", "loading", "preparing_full"];

fn buckets_with(base: &[f64], extra: &[Option<f64>]) -> Vec<f64> {
    let mut b: Vec<f64> = base.to_vec();
    b.extend(extra.iter().flatten().copied().filter(|v| v.is_finite() && *v > 0.0));
    b.sort_by(f64::total_cmp);
    b.dedup_by(|a, b| (*a - *b).abs() < 1e-12);
    b
}

/// Installs the global recorder; returns the handle `/metrics` renders. A process has one
/// recorder: a second call (in-process tests start several servers) returns the first one's
/// handle, with the first one's labels and buckets.
pub fn install(model_name: &str, scheduler: &str, slo: &SloParams) -> anyhow::Result<PrometheusHandle> {
    static HANDLE: std::sync::Mutex<Option<PrometheusHandle>> = std::sync::Mutex::new(None);
    let mut installed = HANDLE.lock().map_err(|_| anyhow::anyhow!("metrics recorder lock poisoned"))?;
    if let Some(h) = installed.as_ref() {
        return Ok(h.clone());
    }
    let handle = install_recorder(model_name, scheduler, slo)?;
    *installed = Some(handle.clone());
    Ok(handle)
}

fn install_recorder(model_name: &str, scheduler: &str, slo: &SloParams) -> anyhow::Result<PrometheusHandle> {
    let lat = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
    let itl = [0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0];
    let idle = [0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0];
    let tokens = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0];
    // Predicted over actual: 1 is exact; 0.9 and 1.1 bound the 10% band.
    let ratio = [0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0];
    let b = slo.binary;
    let handle = PrometheusBuilder::new()
        .add_global_label("model_name", model_name)
        .add_global_label("scheduler", scheduler)
        .set_buckets_for_metric(Matcher::Full(TTFT.into()), &buckets_with(&lat, &[b.ttft]))?
        .set_buckets_for_metric(Matcher::Full(TPOT.into()), &buckets_with(&itl, &[b.tpot]))?
        .set_buckets_for_metric(Matcher::Full(ITL.into()), &buckets_with(&itl, &[b.tpot]))?
        .set_buckets_for_metric(Matcher::Full(E2E.into()), &buckets_with(&lat, &[b.e2el]))?
        .set_buckets_for_metric(Matcher::Full(IDLE.into()), &idle)?
        .set_buckets_for_metric(Matcher::Full(LATENESS.into()), &idle)?
        .set_buckets_for_metric(Matcher::Full(QUEUE.into()), &lat)?
        .set_buckets_for_metric(Matcher::Full(PREFILL.into()), &lat)?
        .set_buckets_for_metric(Matcher::Full(DECODE.into()), &lat)?
        .set_buckets_for_metric(Matcher::Full(INFERENCE.into()), &lat)?
        .set_buckets_for_metric(Matcher::Full(PROMPT_TOKENS.into()), &tokens)?
        .set_buckets_for_metric(Matcher::Full(GEN_TOKENS.into()), &tokens)?
        .set_buckets_for_metric(Matcher::Full(STEP_TOKENS.into()), &tokens)?
        .set_buckets_for_metric(Matcher::Full(STEP.into()), &[0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12])?
        .set_buckets_for_metric(Matcher::Full(STEP_ERROR.into()), &ratio)?
        .set_buckets_for_metric(Matcher::Full(LENGTH_ERROR.into()), &ratio)?
        .set_buckets_for_metric(Matcher::Full(GRAMMAR_COMPILE.into()), &[0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])?
        .set_buckets_for_metric(Matcher::Full(PREPARE.into()), &[0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0])?
        .install_recorder()?;
    describe();
    // Counters exist from the start, so rates and alerts have series before the first event.
    for r in FINISH_REASONS {
        counter!("pace_requests_total", "finished_reason" => r).absolute(0);
    }
    for r in SUCCESS_REASONS {
        counter!("pace_request_success_total", "finished_reason" => r).absolute(0);
    }
    for r in RejectReason::ALL.map(reject_label).iter().chain(OTHER_REJECTIONS.iter()) {
        counter!("pace_requests_rejected_total", "reason" => *r).absolute(0);
    }
    counter!("pace_num_preemptions_total").absolute(0);
    counter!("pace_prefix_cache_queries_total").absolute(0);
    counter!("pace_prefix_cache_hits_total").absolute(0);
    counter!("pace_kv_events_dropped_total").absolute(0);
    counter!("pace_http_connections_refused_total").absolute(0);
    counter!("pace_nonfinite_logits_total").absolute(0);
    counter!("pace_prompt_tokens_total").absolute(0);
    counter!("pace_generation_tokens_total").absolute(0);
    counter!("pace_structured_output_masks_total").absolute(0);
    counter!("pace_structured_output_mask_microseconds_total").absolute(0);
    counter!("pace_structured_output_errors_total").absolute(0);
    Ok(handle)
}

fn describe() {
    describe_histogram!(TTFT, Unit::Seconds, "Time to first token: first token's delivery minus arrival.");
    describe_histogram!(ITL, Unit::Seconds, "Gaps between consecutive token deliveries, observed at each delivery.");
    describe_histogram!(TPOT, Unit::Seconds, "Time per output token after the first, per request: (last - first delivery) / (tokens - 1).");
    describe_histogram!(
        LATENESS,
        Unit::Seconds,
        "Per delivered token, how late it came against its reader's deadline (0 if on time), observed at delivery; a request's user idle latency is the largest of these."
    );
    describe_histogram!(PREFILL, Unit::Seconds, "First scheduling to first token's delivery, per request.");
    describe_histogram!(DECODE, Unit::Seconds, "First token's delivery to the last token's, per request.");
    describe_histogram!(INFERENCE, Unit::Seconds, "First scheduling to the last token's delivery, per request.");
    describe_histogram!(E2E, Unit::Seconds, "End-to-end latency: last token's delivery minus arrival.");
    describe_histogram!(IDLE, Unit::Seconds, "User idle latency: worst lateness against the reading-rate deadlines.");
    describe_histogram!(QUEUE, Unit::Seconds, "Arrival to first scheduling.");
    describe_histogram!(PROMPT_TOKENS, Unit::Count, "Prompt tokens per request.");
    describe_histogram!(GEN_TOKENS, Unit::Count, "Generated tokens per request.");
    describe_histogram!(STEP, Unit::Seconds, "Duration of one engine step (one forward pass).");
    describe_histogram!(STEP_TOKENS, Unit::Count, "Tokens fed to the model per engine step (prompt and decode).");
    describe_histogram!(STEP_ERROR, Unit::Count, "The scheduler's predicted step time over the measured one (1 is exact).");
    describe_histogram!(
        LENGTH_ERROR,
        Unit::Count,
        "Expected output length at admission (learned lengths) over the actual one, for requests that stopped by themselves."
    );
    describe_gauge!("pace_goodput_requests_per_second", "Requests that met the binary SLO per second, over the metrics window.");
    describe_gauge!("pace_goodput_tokens_per_second", "Output tokens of requests that met the binary SLO per second, over the window.");
    describe_gauge!("pace_smooth_goodput_per_second", "Sum of benefits n - alpha f(idle) per second, over the window.");
    describe_gauge!("pace_slo_attainment_ratio", "Requests that met the binary SLO over requests completed, in the window.");
    describe_gauge!("pace_inflight_max_idle_latency_seconds", "Largest idle latency among requests still streaming.");
    describe_gauge!("pace_num_requests_running", "Requests in the running batch.");
    describe_gauge!("pace_num_requests_waiting", "Requests waiting for admission or after preemption.");
    describe_gauge!(
        "pace_predicted_wait_seconds",
        "Seconds until a request arriving now would start: the prompt tokens queued, at full prefill steps (the load routers read, /get_load)."
    );
    describe_gauge!(
        "pace_sustained_overload",
        "smooth: 1 while its door judges the overload sustained: over its window (60 s) more new requests arrived than ran to their ends (closed-loop clients answering an end are not new demand); it then refuses requests that would wait behind others for more than a small share of their value. Else 0."
    );
    describe_counter!(
        "pace_door_returns_total",
        "smooth: arrivals within moments of the end of another request (finished, left or refused), taken as closed-loop clients answering it and not counted as new demand."
    );
    describe_gauge!("pace_kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1, as vLLM's kv_cache_usage_perc).");
    describe_gauge!("pace_cache_config_info", "The KV cache's configuration, as labels (value 1).");
    describe_counter!("pace_requests_total", "Every request that ended, by finish reason: rejected and failed ones included.");
    describe_counter!(
        "pace_request_success_total",
        "Requests that finished by stop, length or abort (vLLM's request_success_total: rejections and errors not counted)."
    );
    describe_counter!("pace_requests_rejected_total", "Requests refused at admission, by reason.");
    describe_counter!("pace_http_requests_total", "HTTP requests by route and status; 499: the client closed the connection before the response head.");
    describe_counter!(
        "pace_http_connections_refused_total",
        "Connections closed at accept because --max-connections were open, each with a request in flight, and the probe reserve was full."
    );
    describe_counter!(
        "pace_http_connections_closed_total",
        "Connections the server closed: idle (silent past --keep-alive-timeout), header_timeout (a request's headers not in within --header-timeout) or slots_full (idle longest, to make room for a new one)."
    );
    describe_counter!(
        "pace_nonfinite_logits_total",
        "Requests failed (500, finish reason error) because the model's logits for them were not finite (NaN or +inf): a numerical fault, never sampled from."
    );
    describe_counter!("pace_num_preemptions_total", "Requests preempted (to be recomputed) for lack of KV blocks.");
    describe_counter!("pace_kv_events_dropped_total", "KV event batches dropped because the publisher's queue was full (--kv-events-config).");
    describe_counter!("pace_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (every admitted prompt's tokens).");
    describe_counter!("pace_prefix_cache_hits_total", "Prompt tokens found in the prefix cache when their request started (not computed again).");
    describe_counter!("pace_prompt_tokens_total", "Prompt tokens of admitted requests.");
    describe_counter!("pace_generation_tokens_total", "Output tokens delivered, counted at delivery.");
    describe_histogram!(
        PREPARE,
        Unit::Seconds,
        "Preparing one request on the blocking pool: tokenizing, chat template, grammar (the wait for a turn not included)."
    );
    describe_histogram!(GRAMMAR_COMPILE, Unit::Seconds, "Compiling a request's structured-output grammar (JSON schema, regex, choice, Lark), by kind.");
    describe_counter!("pace_structured_output_requests_total", "Requests with a structured-output grammar, by kind.");
    describe_counter!("pace_structured_output_masks_total", "Token masks computed for constrained outputs (one per constrained token).");
    describe_counter!(
        "pace_structured_output_mask_microseconds_total",
        "CPU time spent computing token masks, in microseconds (a counter is an integer; overlapped with the forward pass); divided by masks_total: the cost per constrained token."
    );
    describe_counter!(
        "pace_structured_output_errors_total",
        "Constrained outputs whose grammar stopped on an error (limits exceeded); each ended at once with EOS."
    );
}

/// A request prepared (tokenized, templated, its grammar compiled) in `secs`.
pub fn record_preparation(secs: f64) {
    histogram!(PREPARE).record(secs);
}

/// A request's grammar compiled in `secs`.
pub fn record_grammar_compile(kind: &'static str, secs: f64) {
    histogram!(GRAMMAR_COMPILE, "kind" => kind).record(secs);
    counter!("pace_structured_output_requests_total", "kind" => kind).increment(1);
}

/// The mask counters of every constrained output so far.
pub fn publish_structured(s: &pace_models::constraint::MaskStats) {
    use std::sync::atomic::Ordering::Relaxed;
    counter!("pace_structured_output_masks_total").absolute(s.masks.load(Relaxed));
    counter!("pace_structured_output_mask_microseconds_total").absolute(s.nanos.load(Relaxed) / 1_000);
    counter!("pace_structured_output_errors_total").absolute(s.errors.load(Relaxed));
}

/// The standard process series (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
/// `process_open_fds`, `process_threads`, `process_start_time_seconds`, ...), as every
/// Prometheus client library and vLLM export them; read at each scrape.
pub fn collect_process() {
    static COLLECTOR: std::sync::OnceLock<metrics_process::Collector> = std::sync::OnceLock::new();
    COLLECTOR
        .get_or_init(|| {
            let c = metrics_process::Collector::default();
            c.describe();
            c
        })
        .collect();
}

/// Queue time of a request at its first scheduling.
pub fn record_queue_time(secs: f64) {
    histogram!(QUEUE).record(secs.max(0.0));
}

/// One engine step: its measured time, the scheduler's prediction of it, its tokens.
pub fn record_step(secs: f64, predicted_secs: f64, tokens: usize) {
    histogram!(STEP).record(secs);
    histogram!(STEP_TOKENS).record(tokens as f64);
    if secs > 0.0 && predicted_secs > 0.0 {
        histogram!(STEP_ERROR).record(predicted_secs / secs);
    }
}

/// `n` requests failed on logits that were not finite.
pub fn record_broken_logits(n: usize) {
    counter!("pace_nonfinite_logits_total").increment(n as u64);
}

/// The length model's error on one request that stopped by itself (expected over actual).
pub fn record_length_error(ratio: f64) {
    if ratio.is_finite() && ratio > 0.0 {
        histogram!(LENGTH_ERROR).record(ratio);
    }
}

/// Engine load after a step.
pub fn publish_engine(s: &SchedulerStats) {
    gauge!("pace_num_requests_running").set(s.running as f64);
    gauge!("pace_num_requests_waiting").set(s.waiting as f64);
    gauge!("pace_predicted_wait_seconds").set(s.predicted_wait_s);
    let usage = if s.kv_blocks_total > 0 { s.kv_blocks_used as f64 / s.kv_blocks_total as f64 } else { 0.0 };
    gauge!("pace_kv_cache_usage_perc").set(usage);
    counter!("pace_num_preemptions_total").absolute(s.preemptions);
    counter!("pace_prefix_cache_queries_total").absolute(s.prefix_cache_queries);
    counter!("pace_prefix_cache_hits_total").absolute(s.prefix_cache_hits);
    if let Some(door) = s.door {
        gauge!("pace_sustained_overload").set(f64::from(u8::from(door.overloaded)));
        counter!("pace_door_returns_total").absolute(door.returns);
    }
}

/// A request in flight, as the server has delivered it so far.
#[derive(Debug)]
pub struct Live {
    /// Arrival, engine clock.
    pub arrival: f64,
    /// Delivery times so far.
    pub token_times: Vec<f64>,
    /// Reading class.
    pub class: SloClass,
    /// When the engine first scheduled it (engine clock), once it has.
    pub scheduled: Option<f64>,
    /// The largest lateness of a delivered token so far (0 before any is late): the idle
    /// latency without the wait for the next token, kept so a scrape costs O(1) per stream.
    worst_late: f64,
}

impl Live {
    /// `n` tokens delivered at `now`: the per-token histograms (TTFT for the first, the gap
    /// since the previous delivery, each token's lateness) and the token counter are observed
    /// now, while the request runs.
    pub fn deliver(&mut self, n: usize, now: f64) {
        for _ in 0..n {
            match self.token_times.last() {
                None => histogram!(TTFT).record((now - self.arrival).max(0.0)),
                Some(prev) => histogram!(ITL).record((now - prev).max(0.0)),
            }
            let deadline = self.class.deadline(self.arrival, self.token_times.len() + 1);
            histogram!(LATENESS).record((now - deadline).max(0.0));
            self.worst_late = self.worst_late.max(now - deadline);
            self.token_times.push(now);
        }
        if n > 0 {
            counter!("pace_generation_tokens_total").increment(n as u64);
        }
    }
}

/// What the goodput gauges need of a finished request, computed once when it ends.
#[derive(Debug, Clone, Copy)]
struct Finished {
    end: f64,
    completed: bool,
    passed: bool,
    tokens: usize,
    benefit: f64,
}

/// The sliding window of finished requests and the registry of live ones.
pub struct Window {
    params: SloParams,
    window_s: f64,
    finished: Mutex<VecDeque<Finished>>,
    live: Mutex<HashMap<u64, Arc<Mutex<Live>>>>,
}

impl Window {
    /// A window of `window_s` seconds computed with `params`.
    pub fn new(params: SloParams, window_s: f64) -> Self {
        Self { params, window_s, finished: Mutex::new(VecDeque::new()), live: Mutex::new(HashMap::new()) }
    }

    /// Registers a live request; returns its timeline to append delivery times to.
    pub fn start(&self, id: u64, arrival: f64, class: SloClass) -> Arc<Mutex<Live>> {
        let live = Arc::new(Mutex::new(Live { arrival, token_times: Vec::new(), class, scheduled: None, worst_late: 0.0 }));
        if let Ok(mut m) = self.live.lock() {
            m.insert(id, live.clone());
        }
        live
    }

    /// Requests registered by [`Window::start`] and not yet finished.
    pub fn live_count(&self) -> usize {
        self.live.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Records a finished (or rejected) request: its log line, histograms, counters and the
    /// window. The record's outcome is [`outcome`] of `reason`.
    /// `name` is the id the client was given (the response's `id`, with `#i` for choice `i` of
    /// several), which the log line carries; `scheduled` is when the engine first scheduled it.
    /// The per-token series were observed at delivery ([`Live::deliver`]); the per-request ones
    /// are observed here.
    pub fn finish(&self, id: u64, name: &str, record: RequestRecord, prompt_tokens: usize, reason: FinishReason, scheduled: Option<f64>) {
        if let Ok(mut m) = self.live.lock() {
            m.remove(&id);
        }
        let label = finish_label(reason);
        if reason != FinishReason::Rejected {
            log_finished(name, &record, prompt_tokens, label);
        }
        counter!("pace_requests_total", "finished_reason" => label).increment(1);
        if SUCCESS_REASONS.contains(&label) {
            counter!("pace_request_success_total", "finished_reason" => label).increment(1);
        }
        if record.outcome != Outcome::Rejected {
            if let (Some(&first), Some(&last)) = (record.token_times.first(), record.token_times.last()) {
                if let Some(s) = scheduled {
                    histogram!(PREFILL).record((first - s).max(0.0));
                    histogram!(INFERENCE).record((last - s).max(0.0));
                }
                histogram!(DECODE).record((last - first).max(0.0));
            }
            if record.num_tokens() >= 2 {
                histogram!(TPOT).record(record.tpot());
            }
            if record.outcome == Outcome::Completed {
                if let Some(e) = record.e2e() {
                    histogram!(E2E).record(e);
                }
            }
            histogram!(IDLE).record(record.idle_latency());
            histogram!(PROMPT_TOKENS).record(prompt_tokens as f64);
            histogram!(GEN_TOKENS).record(record.num_tokens() as f64);
        }
        let summary = Finished {
            end: record.end,
            completed: record.outcome == Outcome::Completed,
            passed: record.passes(&self.params.binary),
            tokens: record.num_tokens(),
            benefit: record.benefit(&self.params),
        };
        if let Ok(mut f) = self.finished.lock() {
            f.push_back(summary);
        }
    }

    /// Recomputes the goodput gauges at engine time `now`.
    pub fn update_gauges(&self, now: f64) {
        let Some(g) = self.gauges(now) else { return };
        gauge!("pace_goodput_requests_per_second").set(g.request_goodput);
        gauge!("pace_goodput_tokens_per_second").set(g.token_goodput);
        gauge!("pace_smooth_goodput_per_second").set(g.smooth_goodput);
        gauge!("pace_slo_attainment_ratio").set(g.attainment);
        gauge!("pace_inflight_max_idle_latency_seconds").set(g.max_idle_in_flight);
    }

    /// The gauges at `now`: the quantities [`pace_scheduler::slo::WindowStats::compute`] gives
    /// over the window, from each request's summary, and the largest idle latency in flight;
    /// O(requests in the window + streams live), nothing copied (the endpoint picker scrapes
    /// every 50 ms). `None` if a lock is poisoned.
    fn gauges(&self, now: f64) -> Option<Gauges> {
        let start = now - self.window_s;
        let (mut completed, mut passed, mut passed_tokens, mut benefit) = (0usize, 0usize, 0usize, 0.0);
        {
            let mut f = self.finished.lock().ok()?;
            while f.front().is_some_and(|r| r.end < start) {
                f.pop_front();
            }
            for r in f.iter().filter(|r| r.end >= start && r.end <= now) {
                completed += usize::from(r.completed);
                if r.passed {
                    passed += 1;
                    passed_tokens += r.tokens;
                }
                benefit += r.benefit;
            }
        }
        let window = if self.window_s > 0.0 { self.window_s } else { f64::INFINITY };
        let max_idle_in_flight = self
            .live
            .lock()
            .ok()?
            .values()
            .filter_map(|l| l.lock().ok().map(|l| l.worst_late.max(now - l.class.deadline(l.arrival, l.token_times.len() + 1))))
            .fold(0.0f64, f64::max);
        Some(Gauges {
            request_goodput: passed as f64 / window,
            token_goodput: passed_tokens as f64 / window,
            smooth_goodput: benefit / window,
            attainment: if completed > 0 { passed as f64 / completed as f64 } else { 0.0 },
            max_idle_in_flight,
        })
    }
}

/// The window's gauges at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Gauges {
    request_goodput: f64,
    token_goodput: f64,
    smooth_goodput: f64,
    attainment: f64,
    max_idle_in_flight: f64,
}

/// One log line per finished request (`RUST_LOG=pace::request=info`), its numbers as fields
/// (`request_id`: the id the client was given).
fn log_finished(id: &str, r: &RequestRecord, prompt_tokens: usize, reason: &str) {
    let ttft = r.ttft().map(|t| (t * 1e3).round() / 1e3);
    tracing::info!(
        target: "pace::request",
        request_id = %id,
        reason = %reason,
        prompt_tokens,
        output_tokens = r.num_tokens(),
        ttft_s = ttft,
        tpot_s = (r.tpot() * 1e4).round() / 1e4,
        idle_s = (r.idle_latency() * 1e3).round() / 1e3,
        "request finished"
    );
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use pace_scheduler::slo::{idle_latency, WindowStats};
    use rand::{Rng, SeedableRng};

    /// The gauges kept from per-request summaries equal the full computation over the records
    /// (finished ones in and out of the window, every outcome) and over the live streams.
    #[test]
    fn the_summary_gauges_equal_the_full_computation() {
        let params = SloParams { binary: pace_scheduler::BinarySlo { ttft: Some(1.0), tpot: Some(0.2), ..Default::default() }, ..SloParams::default() };
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let w = Window::new(params, 30.0);
            let (mut records, mut lives) = (vec![], vec![]);
            for id in 0..60u64 {
                let arrival = rng.random_range(0.0..100.0);
                let class = SloClass::new(rng.random_range(2.0..20.0), rng.random_range(0.0..1.0));
                let live = w.start(id, arrival, class);
                let mut t = arrival + rng.random_range(0.05..3.0);
                for _ in 0..rng.random_range(0..40) {
                    live.lock().unwrap().deliver(1, t);
                    t += rng.random_range(0.01..0.5);
                }
                if rng.random_bool(0.2) {
                    lives.push(live);
                    continue;
                }
                let outcome = [Outcome::Completed, Outcome::Aborted, Outcome::Rejected, Outcome::Failed][rng.random_range(0..4)];
                let token_times = live.lock().unwrap().token_times.clone();
                let end = token_times.last().copied().unwrap_or(arrival) + rng.random_range(0.0..1.0);
                let r = RequestRecord { arrival, token_times, outcome, end, class };
                let reason = match outcome {
                    Outcome::Completed => FinishReason::Stop,
                    Outcome::Aborted => FinishReason::Abort,
                    Outcome::Rejected => FinishReason::Rejected,
                    _ => FinishReason::Error,
                };
                w.finish(id, "r", r.clone(), 1, reason, None);
                records.push(r);
            }
            let now = 120.0;
            let full = WindowStats::compute(&records, now - 30.0, now, &params);
            let idle = lives.iter().map(|l| l.lock().unwrap()).map(|l| idle_latency(l.arrival, &l.token_times, l.class, Some(now))).fold(0.0f64, f64::max);
            let g = w.gauges(now).unwrap();
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + b.abs());
            assert!(close(g.request_goodput, full.request_goodput) && close(g.token_goodput, full.token_goodput), "seed {seed}: {g:?} {full:?}");
            assert!(close(g.smooth_goodput, full.smooth_goodput) && close(g.attainment, full.attainment), "seed {seed}: {g:?} {full:?}");
            assert!(close(g.max_idle_in_flight, idle), "seed {seed}: {} against {idle}", g.max_idle_in_flight);
        }
    }
}
