//! State shared by the HTTP handlers: configuration, serving phase, the loaded model's text side
//! and engine handle (once loading finishes), the metrics window, and the in-flight count.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;
use pace_models::chat::ChatTemplate;
use pace_models::tokenizer::Tokenizer;
use pace_scheduler::slo::SloClass;

use super::engine_thread::EngineHandle;
use super::metrics::Window;

/// Limits and names the handlers apply.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Name(s) the model is served under (`model` must be one of them, when given).
    pub served_model_names: Vec<String>,
    /// SHA-256 digests of the accepted API keys; empty means no authentication.
    pub api_key_digests: Vec<[u8; 32]>,
    /// `--prefix-cache-isolation api-key`: the bearer token joins the prefix-cache salt.
    pub cache_per_key: bool,
    /// The shape of `/get_load`.
    pub load_format: super::LoadFormat,
    /// Host names inference requests may name (`--allowed-hosts`, lower case); empty: any.
    pub allowed_hosts: Vec<String>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Seconds a client has to send a request's body once its headers are in.
    pub body_timeout_s: f64,
    /// Seconds of silence before a stream gets an SSE keep-alive comment (0: never).
    pub sse_keepalive_s: f64,
    /// Largest `n`.
    pub max_n: usize,
    /// Most stop strings per request.
    pub max_stop: usize,
    /// Longest stop string, bytes.
    pub max_stop_bytes: usize,
    /// Most output tokens one request may ask for, over all its choices (`n` times the prompts
    /// times `max_tokens`); a request that sends no `max_tokens` has its default cut to fit.
    pub max_request_output_tokens: usize,
    /// Most top logprobs per token.
    pub max_logprobs: usize,
    /// Most prompts in one completions request.
    pub max_prompts: usize,
    /// Default reading class.
    pub default_class: SloClass,
    /// The reading rates a request may set (`--reading-rate-range`); others are clamped into it.
    pub reading_rate_range: (f64, f64),
    /// The priorities a request may claim (`--priority-range`); others are clamped into it.
    pub priority_range: (i64, i64),
    /// Queue bounds, checked before tokenizing (cheap pre-check; the scheduler checks again).
    pub max_queue_requests: usize,
    /// Most requests waiting for or in preparation (tokenizing, templates, grammars) at once;
    /// more get 503 with Retry-After (`--max-preparing`).
    pub max_preparing: usize,
    /// Test hook: seconds each preparation sleeps first (`--debug-prepare-stall`; 0: none).
    pub prepare_stall_s: f64,
    /// Seconds to wait for in-flight requests after SIGTERM.
    pub drain_timeout_s: f64,
    /// Consecutive failed steps after which `/health` reports unhealthy.
    pub unhealthy_after_failures: u32,
    /// `--seed`: requests that send no seed draw theirs from a sequence this starts, in the
    /// order they are admitted; `None`: at random.
    pub seed: Option<u64>,
    /// Sampling parameters of requests that send none (`--generation-config`).
    pub sampling: super::gen_config::SamplingDefaults,
}

/// Serving phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The model is loading: inference routes answer 503.
    Loading = 0,
    /// Serving.
    Ready = 1,
    /// SIGTERM received: new requests get 503, in-flight ones finish.
    Draining = 2,
    /// Loading failed.
    Failed = 3,
}

/// The loaded model's parts the handlers need.
pub struct Loaded {
    /// Tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat template.
    pub template: ChatTemplate,
    /// Engine thread.
    pub engine: EngineHandle,
    /// Longest sequence.
    pub max_model_len: usize,
    /// Scheduler policy name.
    pub scheduler: String,
    /// The engine's shape, as `/server_info` reports it to routers.
    pub shape: EngineShape,
    /// The grammar engine for structured outputs (None if the model has no end-of-generation
    /// token to end a constrained output with).
    pub grammars: Option<Arc<pace_models::constraint::Grammars>>,
}

/// The engine's shape, fixed at load.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineShape {
    /// What `--model` named (the default model's name when it was not given).
    pub model_path: String,
    /// Tokens per KV-cache block.
    pub block_size: usize,
    /// KV-cache blocks.
    pub num_blocks: usize,
    /// Most requests in a step.
    pub max_num_seqs: usize,
    /// Most tokens in a step.
    pub max_batch_tokens: usize,
}

/// Everything the handlers share.
pub struct AppState {
    /// Limits and names.
    pub config: ServeConfig,
    phase: AtomicU8,
    /// Set once the model is loaded.
    pub loaded: OnceLock<Loaded>,
    /// Metrics window and live requests.
    pub window: Window,
    /// Prometheus exporter.
    pub metrics: PrometheusHandle,
    /// Inference requests being served right now.
    pub inflight: AtomicUsize,
    /// Unix time the server started.
    pub created: u64,
    /// Unseeded requests so far (the position in the `--seed` sequence).
    unseeded: std::sync::atomic::AtomicU64,
    /// Places for requests waiting for or in preparation (`max_preparing` of them).
    pub preparing: Arc<tokio::sync::Semaphore>,
    /// Preparations running at once: one per thread of the blocking pool, so that the queue is
    /// here, where a request whose client has left simply drops out of it.
    pub preparing_now: Arc<tokio::sync::Semaphore>,
    /// Requests prepared so far (this server's share of `pace_request_preparation_seconds`).
    pub prepared: std::sync::atomic::AtomicU64,
}

/// Threads of the blocking pool that prepares requests, and preparations run at once.
pub const PREPARE_THREADS: usize = 8;

impl AppState {
    /// New state in the `Loading` phase.
    pub fn new(config: ServeConfig, window: Window, metrics: PrometheusHandle) -> Self {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let preparing = Arc::new(tokio::sync::Semaphore::new(config.max_preparing.max(1)));
        Self {
            config,
            phase: AtomicU8::new(Phase::Loading as u8),
            loaded: OnceLock::new(),
            window,
            metrics,
            inflight: AtomicUsize::new(0),
            created,
            unseeded: std::sync::atomic::AtomicU64::new(0),
            preparing,
            preparing_now: Arc::new(tokio::sync::Semaphore::new(PREPARE_THREADS)),
            prepared: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The seed of the next request that sent none: the `k`-th of the `--seed` sequence
    /// ([`seed_sequence`]), or `None` without `--seed`.
    pub fn next_unseeded(&self) -> Option<u64> {
        let s = self.config.seed?;
        Some(seed_sequence(s, self.unseeded.fetch_add(1, Ordering::Relaxed)))
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            2 => Phase::Draining,
            _ => Phase::Failed,
        }
    }

    /// Moves to `p`.
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    /// Loading → Ready; a drain that began during loading stays a drain.
    pub fn set_ready(&self) {
        let _ = self.phase.compare_exchange(Phase::Loading as u8, Phase::Ready as u8, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The name used in responses.
    pub fn model_name(&self) -> &str {
        self.config.served_model_names.first().map(String::as_str).unwrap_or("model")
    }
}

/// Counts an inference request in flight for as long as it lives (the drain waits for zero).
pub struct InflightGuard(Arc<AppState>);

impl InflightGuard {
    /// Starts counting.
    pub fn new(state: &Arc<AppState>) -> Self {
        state.inflight.fetch_add(1, Ordering::AcqRel);
        Self(state.clone())
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The `k`-th seed of the sequence `seed` starts (SplitMix64: distinct, well mixed seeds for
/// consecutive `k`).
pub fn seed_sequence(seed: u64, k: u64) -> u64 {
    let mut z = seed.wrapping_add(k.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
