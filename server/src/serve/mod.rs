//! `pace serve`: the OpenAI-compatible server.
//!
//! Start-up binds the port first and answers `/health` with 503 while the model loads on another
//! thread; then the engine thread starts and the phase becomes `Ready`. SIGTERM or SIGINT moves
//! to `Draining`: new requests get 503, in-flight ones run to completion for up to
//! `--drain-timeout` seconds, and the process exits 0; a second signal exits 1 at once. A panic
//! while loading, one that ends the engine thread or the accept loop, or an engine step stuck
//! for `--engine-step-timeout` exits 1 (after the open requests have been answered with errors),
//! so that an orchestrator restarts the process rather than keep a server that cannot serve.

pub mod api;
pub mod engine_thread;
pub mod gen_config;
pub mod kv_events;
pub mod listen;
pub mod metrics;
pub mod state;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pace_models::loader::ModelSource;
use pace_scheduler::slo::{BinarySlo, SloClass, SloParams};

use crate::cli::EngineArgs;
use state::{AppState, Loaded, Phase, ServeConfig};

/// Arguments of `pace serve`. Every flag can also come from the environment variable `--help`
/// names (`PACE_` and the flag's name; a flag on the command line wins), and vLLM's spellings
/// of the same knobs are accepted: `--scheduling-policy`, `--max-num-batched-tokens`,
/// `--num-gpu-blocks-override`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Name the model is served under (repeat for aliases); default: from the model file.
    #[arg(long = "served-model-name", value_delimiter = ',', env = "PACE_SERVED_MODEL_NAME")]
    pub served_model_name: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "PACE_HOST")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000, env = "PACE_PORT")]
    pub port: u16,
    /// Scheduling policy: smooth, fcfs (vLLM-style) or drop-late; for A/B runs, smooth with some of
    /// its configuration set: smooth:KEY=VALUE[:...] with KEY one of door, start, chunk, order (0
    /// switches that rule off), max_loss, window_s (docs/scheduler.md).
    #[arg(long, visible_alias = "scheduling-policy", default_value = "smooth", value_parser = pace_scheduler::policy::parse_name, env = "PACE_SCHEDULER")]
    pub scheduler: String,
    /// Binary SLO (drop-late, attainment and goodput gauges; default `ttft:2000 tpot:100`) and the
    /// smooth-goodput parameters, as pace bench and pace sim take them.
    #[command(flatten)]
    pub slo: pace_scheduler::slo_args::SloArgs,
    /// Default priority of requests that send none (vLLM's meaning: lower is served first). A
    /// request of priority p weighs 2^-p in smooth goodput and in the smooth scheduler.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(-10..=10), allow_negative_numbers = true, env = "PACE_DEFAULT_PRIORITY")]
    pub default_priority: i64,
    /// The reading rates (tokens per second) a request may ask for with `reading_rate`, as
    /// MIN,MAX: a rate outside is clamped into it, so one client cannot take capacity from the
    /// others by claiming a reader faster than any person (smooth feeds each stream at its rate).
    #[arg(long, default_value = "1,50", value_parser = parse_rate_range, env = "PACE_READING_RATE_RANGE")]
    pub reading_rate_range: (f64, f64),
    /// The priorities a request may claim, `MIN,MAX` within -10..10 (vLLM's meaning: lower is
    /// served first); a request's own is clamped into it. The default lets a client lower its
    /// priority but not raise it over others; `-10,10` trusts clients as vLLM does.
    #[arg(long, default_value = "0,10", value_parser = parse_priority_range, allow_hyphen_values = true, env = "PACE_PRIORITY_RANGE")]
    pub priority_range: (i64, i64),
    /// Most requests waiting for admission; beyond it new requests get 429.
    #[arg(long, default_value_t = 512, env = "PACE_MAX_QUEUE_REQUESTS")]
    pub max_queue_requests: usize,
    /// Most requests waiting for or in preparation (tokenizing, chat templates, grammars) at
    /// once; beyond it new requests get 429 with Retry-After. Eight are prepared at a time; one
    /// whose client leaves while it waits is dropped without being prepared.
    #[arg(long, default_value_t = 512, env = "PACE_MAX_PREPARING")]
    pub max_preparing: usize,
    /// Most prompt tokens waiting for admission; beyond it new requests get 429.
    #[arg(long, default_value_t = 1 << 19, env = "PACE_MAX_QUEUE_TOKENS")]
    pub max_queue_tokens: usize,
    /// API key required on inference routes (repeatable; also PACE_API_KEY, comma separated).
    #[arg(long = "api-key", env = "PACE_API_KEY", value_delimiter = ',', hide_env_values = true)]
    pub api_key: Vec<Secret>,
    /// Whose cached prompt prefixes a request may reuse: `none` (requests of the same
    /// `cache_salt` share) or `api-key` (and of the same bearer token: tenants with different
    /// keys never reuse, nor time, each other's prompts).
    #[arg(long, value_enum, default_value = "none", env = "PACE_PREFIX_CACHE_ISOLATION")]
    pub prefix_cache_isolation: CacheIsolation,
    /// The shape of `GET /get_load` for the router in front (docs/fleet.md): `sglang` (SGLang's
    /// model gateway, `[{"num_tokens", ...}]`) or `vllm` (vLLM's router, `{"load": N}`); the two
    /// routers poll the same path with the same headers and read different shapes. A request's
    /// `?format=` overrides it.
    #[arg(long, value_enum, default_value = "sglang", env = "PACE_LOAD_FORMAT")]
    pub load_format: LoadFormat,
    /// Host names (comma separated; `*.example.com` for any subdomain) that inference requests
    /// may name in `Host` or the HTTP/2 authority; any other is a 400. Guards a server on
    /// 127.0.0.1 against DNS rebinding from a browser. `/health`, `/metrics` and `/version` are
    /// exempt, for probes that address the server by IP. Default: any host.
    #[arg(long, value_delimiter = ',', env = "PACE_ALLOWED_HOSTS")]
    pub allowed_hosts: Vec<String>,
    /// Window of the goodput and attainment gauges, seconds.
    #[arg(long, default_value_t = 60.0, value_parser = parse_positive, env = "PACE_METRICS_WINDOW")]
    pub metrics_window: f64,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, default_value_t = 30.0, value_parser = parse_non_negative, env = "PACE_DRAIN_TIMEOUT")]
    pub drain_timeout: f64,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 4 << 20, env = "PACE_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Seconds a connection has to send a request's headers, counted from its opening or from
    /// the request's first byte.
    #[arg(long, default_value_t = 15.0, value_parser = parse_positive, env = "PACE_HEADER_TIMEOUT")]
    pub header_timeout: f64,
    /// Seconds a connection may stay silent after a response before it is closed; longer than
    /// clients' pools keep idle connections, so the client closes first.
    #[arg(long, default_value_t = 120.0, value_parser = parse_positive, env = "PACE_KEEP_ALIVE_TIMEOUT")]
    pub keep_alive_timeout: f64,
    /// Seconds a request has to send its body once the headers are in; then 408.
    #[arg(long, default_value_t = 30.0, value_parser = parse_positive, env = "PACE_BODY_TIMEOUT")]
    pub body_timeout: f64,
    /// Most open connections (default: the open-file limit, raised at start-up to what the
    /// system allows, less 272, between 64 and 65,536). When all are open, the one idle longest
    /// is closed to make room; a new one is refused only while every connection has a request
    /// in flight (16 more then answer /health, /metrics and /version only).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), env = "PACE_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// Seconds of silence after which a stream gets an SSE comment (`: keep-alive`), so proxies
    /// do not cut a stream whose request waits in the queue; 0 sends none.
    #[arg(long, default_value_t = 10.0, value_parser = parse_non_negative, env = "PACE_SSE_KEEPALIVE")]
    pub sse_keepalive: f64,
    /// Largest `n` (choices per prompt).
    #[arg(long, default_value_t = 16, env = "PACE_MAX_N")]
    pub max_n: usize,
    /// Most top logprobs per token.
    #[arg(long, default_value_t = 20, env = "PACE_MAX_LOGPROBS")]
    pub max_logprobs: usize,
    /// Bounds JSON outputs get where their schema sets none, so a looping model must close the
    /// value: `max_length=N` (string characters), `max_items=N` (array items, object keys);
    /// integers stay within 10^18 (docs/api.md).
    #[arg(long, default_value = "max_length=4096,max_items=1024", value_parser = parse_json_bounds, env = "PACE_JSON_BOUNDS")]
    pub json_bounds: pace_models::constraint::JsonBounds,
    /// Most output tokens one request may ask for over all its choices (n x prompts x
    /// max_tokens): more is a 400 naming max_tokens; a request that sends no max_tokens has its
    /// default (the room left in the context) cut to fit. Bounds what one request can make the
    /// server generate and hold.
    #[arg(long, default_value_t = 1 << 18, env = "PACE_MAX_REQUEST_OUTPUT_TOKENS")]
    pub max_request_output_tokens: usize,
    /// Seed for requests that send none (vLLM's `--seed`): they draw theirs, in the order they
    /// are admitted, from the sequence this starts, so a restarted server given the same
    /// requests in the same order samples the same answers. Default: random.
    #[arg(long, env = "PACE_SEED")]
    pub seed: Option<u64>,
    /// Log level of pace's own lines: error, warn, info, debug or trace (RUST_LOG, when set,
    /// is a full filter and wins).
    #[arg(long, value_enum, default_value_t = LogLevel::Info, env = "PACE_LOG_LEVEL")]
    pub log_level: LogLevel,
    /// Log lines as text, or as JSON: one object per line (timestamp, level, target, message
    /// and the event's fields at the top level, `request_id` on every line about a request).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "PACE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The chat template, as vLLM's flag: a file holding a Jinja template, or the template
    /// itself; default: the model's own (ChatML when it has none).
    #[arg(long, env = "PACE_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Default sampling parameters, as vLLM's flag: auto (the model's generation_config.json,
    /// next to a .gguf file or in a Hugging Face directory, when it has one), vllm (the API's
    /// neutral defaults), or a directory or file holding a generation_config.json. A request
    /// that sends temperature, top_p, top_k, min_p, repetition_penalty or max_tokens wins.
    #[arg(long, default_value = "auto", env = "PACE_GENERATION_CONFIG")]
    pub generation_config: String,
    /// JSON object of default sampling parameters applied over --generation-config, e.g.
    /// '{"temperature": 0.2, "top_p": 0.9}' (vLLM's flag).
    #[arg(long, env = "PACE_OVERRIDE_GENERATION_CONFIG")]
    pub override_generation_config: Option<String>,
    /// Leave out the one line per finished request (`pace::request`), as vLLM's flag does.
    #[arg(long, env = "PACE_DISABLE_LOG_REQUESTS")]
    pub disable_log_requests: bool,
    /// Seconds one engine step may run before the server counts the engine as hung (a
    /// deadlocked kernel, an infinite loop): `/health` turns 503, every open request ends with
    /// an error, and the process exits 1 for its orchestrator to restart it. 0: never (vLLM's
    /// VLLM_ENGINE_ITERATION_TIMEOUT_S, 60 s, plays this part there).
    #[arg(long, default_value_t = 60.0, value_parser = parse_non_negative, env = "PACE_ENGINE_STEP_TIMEOUT")]
    pub engine_step_timeout: f64,
    /// Test hook: any engine step that feeds this token id panics inside the model step, to
    /// exercise failure handling end to end.
    #[arg(long, hide = true)]
    pub debug_fail_on_token: Option<u32>,
    /// Test hook: any engine step that feeds this token id panics in the engine loop, outside
    /// the model step's guard, to exercise the engine thread's supervision.
    #[arg(long, hide = true)]
    pub debug_panic_on_token: Option<u32>,
    /// Test hook, `ID:SECS`: any engine step that feeds this token id first sleeps SECS seconds,
    /// to make a stall the metrics must show while it happens.
    #[arg(long, hide = true, value_parser = parse_stall)]
    pub debug_stall_on_token: Option<(u32, f64)>,
    /// Test hook: every request's preparation first sleeps this many seconds on its thread, to
    /// make a queue of preparations.
    #[arg(long, hide = true, value_parser = parse_positive)]
    pub debug_prepare_stall: Option<f64>,
    /// Test hook: the logits of any slice that feeds this token id are NaN, to exercise the
    /// broken-logits path end to end.
    #[arg(long, hide = true)]
    pub debug_nan_on_token: Option<u32>,
    /// Append one JSON line per engine step (its shape, the cost model's prediction and the
    /// measured seconds) to this file, for studying the step-cost model offline.
    #[arg(long, hide = true, env = "PACE_STEP_TRACE")]
    pub step_trace: Option<std::path::PathBuf>,
    /// Publish prefix-cache changes over ZeroMQ for KV-aware routers (vLLM's flag and JSON, e.g.
    /// '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557"}'; docs/fleet.md).
    #[arg(long, env = "PACE_KV_EVENTS_CONFIG")]
    pub kv_events_config: Option<String>,
}

/// A value that must never reach a log line: `Debug` prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value itself, for the one place that compares it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

/// `--log-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The tracing filter: `RUST_LOG` when set, else `--log-level`; with `--disable-log-requests`,
/// without the per-request lines either way.
pub fn log_filter(rust_log: Option<&str>, level: LogLevel, disable_log_requests: bool) -> String {
    let base = match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => s.to_string(),
        None => match level {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
        .to_string(),
    };
    if disable_log_requests {
        format!("{base},pace::request=off")
    } else {
        base
    }
}

/// The binary SLO of `pace serve` without `--slo`.
pub const DEFAULT_SLO: &str = "ttft:2000 tpot:100";

fn parse_stall(s: &str) -> Result<(u32, f64), String> {
    let (id, secs) = s.split_once(':').ok_or_else(|| format!("'{s}': expected ID:SECS"))?;
    let id = id.parse::<u32>().map_err(|e| format!("'{id}': {e}"))?;
    Ok((id, parse_positive(secs)?))
}

use pace_scheduler::slo_args::{non_negative as parse_non_negative, positive as parse_positive};

/// `--json-bounds`: `max_length=N,max_items=N`, a key left out keeps its default.
fn parse_json_bounds(s: &str) -> Result<pace_models::constraint::JsonBounds, String> {
    let mut b = pace_models::constraint::JsonBounds::default();
    for kv in s.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("'{kv}' is not KEY=N"))?;
        let n: u64 = v.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| format!("{k}: '{v}' is not a positive integer"))?;
        match k.trim() {
            "max_length" => b.max_length = n,
            "max_items" => b.max_items = n,
            other => return Err(format!("unknown key '{other}' (max_length, max_items)")),
        }
    }
    Ok(b)
}

/// Runs the server until SIGTERM/SIGINT and a drain.
pub fn run(args: &ServeArgs) -> Result<()> {
    let (state, slo) = prepare(args)?;
    // Two async workers; request preparation (tokenizing, templates) runs on a small blocking
    // pool beside them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(state::PREPARE_THREADS)
        .thread_name("pace-http")
        .enable_all()
        .build()?;
    rt.block_on(serve(args.clone(), state, slo))
}

/// The server without a socket: the state with the model loaded and the engine thread running,
/// ready for [`api::app`] (tests drive it with `tower::ServiceExt::oneshot`). Blocks while the
/// model loads; the engine stops when the returned state's engine is shut down or the process
/// ends.
pub fn in_process(args: &ServeArgs) -> Result<Arc<AppState>> {
    let (state, slo) = prepare(args)?;
    load(args, &state, slo, None, None)?;
    Ok(state)
}

/// `--priority-range MIN,MAX`: integers, -10 <= MIN <= MAX <= 10.
fn parse_priority_range(s: &str) -> Result<(i64, i64), String> {
    let (a, b) = s.split_once(',').ok_or("expected MIN,MAX")?;
    match (a.trim().parse::<i64>(), b.trim().parse::<i64>()) {
        (Ok(lo), Ok(hi)) if -10 <= lo && lo <= hi && hi <= 10 => Ok((lo, hi)),
        _ => Err(format!("`{s}`: expected MIN,MAX with -10 <= MIN <= MAX <= 10")),
    }
}

/// `--reading-rate-range MIN,MAX`: positive, finite, MIN <= MAX.
fn parse_rate_range(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s.split_once(',').ok_or("expected MIN,MAX (tokens per second)")?;
    let parse = |v: &str| v.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0);
    match (parse(a), parse(b)) {
        (Some(lo), Some(hi)) if lo <= hi => Ok((lo, hi)),
        _ => Err(format!("`{s}`: expected MIN,MAX with 0 < MIN <= MAX (tokens per second)")),
    }
}

/// `--prefix-cache-isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheIsolation {
    // Requests of the same `cache_salt` (or none) share cached prefixes (doc comments on
    // the variants would make clap's --help long).
    None,
    // Only requests with the same bearer token (and salt) share.
    ApiKey,
}

/// `--load-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    // `[{"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens", "predicted_wait_s"}]`.
    Sglang,
    // `{"load": N}`, N the requests running and waiting.
    Vllm,
}

/// Checks the flags and builds the shared state (phase `Loading`) and the metrics recorder.
fn prepare(args: &ServeArgs) -> Result<(Arc<AppState>, SloParams)> {
    let source = ModelSource::parse(args.engine.model.as_deref())?;
    let names = if args.served_model_name.is_empty() { vec![source.default_name()] } else { args.served_model_name.clone() };
    if args.api_key.iter().any(|k| k.expose().is_empty()) {
        bail!("--api-key must not be empty");
    }
    let binary = match args.slo.binary()? {
        Some(b) => b,
        None => DEFAULT_SLO.parse::<BinarySlo>().map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    let mut slo = args.slo.params(binary);
    slo.default_class.weight = SloClass::priority_weight(args.default_priority);
    let (sampling, sampling_from) = gen_config::resolve(&source, &args.generation_config, args.override_generation_config.as_deref())?;
    if let Some(from) = sampling_from {
        tracing::info!("default sampling parameters from {from}: {}", sampling.describe());
    }
    let handle = metrics::install(&names[0], &args.scheduler, &slo)?;
    let config = ServeConfig {
        served_model_names: names,
        allowed_hosts: args
            .allowed_hosts
            .iter()
            .map(|h| h.trim().trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect(),
        api_key_digests: args.api_key.iter().map(|k| <sha2::Sha256 as sha2::Digest>::digest(k.expose().as_bytes()).into()).collect(),
        cache_per_key: args.prefix_cache_isolation == CacheIsolation::ApiKey,
        load_format: args.load_format,
        max_body_bytes: args.max_body_bytes,
        body_timeout_s: args.body_timeout,
        sse_keepalive_s: args.sse_keepalive,
        max_n: args.max_n.max(1),
        max_stop: 16,
        max_stop_bytes: 1024,
        max_request_output_tokens: args.max_request_output_tokens.max(1),
        max_logprobs: args.max_logprobs,
        max_prompts: 64,
        default_class: slo.default_class,
        reading_rate_range: args.reading_rate_range,
        priority_range: args.priority_range,
        max_queue_requests: args.max_queue_requests.max(1),
        max_preparing: args.max_preparing.max(1),
        prepare_stall_s: args.debug_prepare_stall.unwrap_or(0.0),
        drain_timeout_s: args.drain_timeout,
        unhealthy_after_failures: 3,
        seed: args.seed,
        sampling,
    };
    let state = Arc::new(AppState::new(config, metrics::Window::new(slo, args.metrics_window), handle));
    Ok((state, slo))
}

async fn serve(args: ServeArgs, state: Arc<AppState>, slo: SloParams) -> Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.host, args.port).parse().with_context(|| format!("--host {} --port {}", args.host, args.port))?;
    let listener = listen::bind(addr).with_context(|| format!("binding {addr}"))?;
    tracing::info!("listening on http://{addr} (/health answers 503 until the model is loaded)");

    // The engine thread's death (a panic) wakes this task, which answers what it can and exits.
    let fatal = Arc::new(tokio::sync::Notify::new());
    let on_fatal: engine_thread::OnFatal = {
        let fatal = fatal.clone();
        Box::new(move |_msg| fatal.notify_one())
    };
    let limits = listen::ConnLimits {
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        keep_alive: Duration::from_secs_f64(args.keep_alive_timeout),
        max_connections: match args.max_connections {
            Some(n) => n as usize,
            None => listen::default_max_connections(),
        },
    };
    let kv_events = match args.kv_events_config.as_deref().map(kv_events::KvEventsConfig::parse).transpose()?.flatten() {
        Some(c) => Some(kv_events::start(&c).await?),
        None => None,
    };
    let loader_state = state.clone();
    std::thread::Builder::new().name("pace-loader".into()).spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(&args, &loader_state, slo, Some(on_fatal), kv_events)));
        let err = match result {
            Ok(Ok(())) => return,
            Ok(Err(e)) => format!("{e:#}"),
            Err(panic) => format!("panic: {}", crate::engine::panic_message(panic.as_ref())),
        };
        tracing::error!("loading failed: {err}");
        loader_state.set_phase(Phase::Failed);
        // A server that cannot serve should not look alive to an orchestrator.
        std::process::exit(1);
    })?;

    let gauges_state = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if let Some(l) = gauges_state.loaded.get() {
                gauges_state.window.update_gauges(l.engine.now());
            }
        }
    });

    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown_state = state.clone();
    let shutdown = async move {
        drain(&shutdown_state).await;
        let _ = drained_tx.send(());
    };
    let mut server = tokio::spawn(listen::serve(listener, api::app(state.clone()), limits, shutdown, Duration::from_secs(2)));
    tokio::select! {
        biased;
        // Once drained, give open connections a moment to close, then leave.
        _ = drained_rx => {
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut server).await;
        }
        // The engine died (a panic, or a step the watchdog found stuck): every open request has
        // been ended with an error; give their handlers a moment to write it, then exit non-zero.
        _ = fatal.notified() => {
            let deadline = Instant::now() + Duration::from_secs(2);
            while state.inflight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            bail!("the engine failed (see the error above); exiting so that the process is restarted");
        }
        // The accept loop ends only after a drain; ending before one (a panic in it) leaves a
        // process that accepts nobody, so it must not look alive.
        ended = &mut server => {
            if state.phase() != Phase::Draining {
                let why = match ended {
                    Err(e) if e.is_panic() => format!("panicked: {}", crate::engine::panic_message(e.into_panic().as_ref())),
                    Err(e) => e.to_string(),
                    Ok(()) => "ended".to_string(),
                };
                bail!("the accept loop {why}; exiting so that the process is restarted");
            }
        }
    }
    if let Some(l) = state.loaded.get() {
        l.engine.shutdown();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Every SIGTERM and SIGINT from now on, one message each. One listener per signal for the
/// process's life: a listener made after a signal could take that signal for a new one.
fn shutdown_signals() -> tokio::sync::mpsc::UnboundedReceiver<()> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    #[cfg(unix)]
    for kind in [tokio::signal::unix::SignalKind::terminate(), tokio::signal::unix::SignalKind::interrupt()] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            let tx = tx.clone();
            tokio::spawn(async move { while s.recv().await.is_some() && tx.send(()).is_ok() {} });
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move { while tokio::signal::ctrl_c().await.is_ok() && tx.send(()).is_ok() {} });
    rx
}

/// Waits for SIGTERM or SIGINT, then drains: new requests get 503 while in-flight ones finish,
/// for at most `--drain-timeout` seconds. A second signal during the drain exits at once (1):
/// an operator pressing Ctrl-C twice, or an orchestrator that has stopped waiting.
async fn drain(state: &Arc<AppState>) {
    let mut signals = shutdown_signals();
    if signals.recv().await.is_none() {
        // No signal can be listened to: run until killed.
        std::future::pending::<()>().await;
    }
    tokio::spawn(async move {
        if signals.recv().await.is_some() {
            tracing::warn!("second shutdown signal: exiting now, without waiting for the drain");
            std::process::exit(1);
        }
    });
    state.set_phase(Phase::Draining);
    let n = state.inflight.load(Ordering::Acquire);
    tracing::info!("shutting down: draining {n} in-flight requests (up to {} s)", state.config.drain_timeout_s);
    let deadline = Instant::now() + Duration::from_secs_f64(state.config.drain_timeout_s);
    while state.inflight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = state.inflight.load(Ordering::Acquire);
    if left > 0 {
        tracing::warn!("drain timeout: {left} requests still in flight are cut off");
    }
}

/// The text of `--chat-template`: the file it names, or the value itself when it is a template
/// (it holds `{{` or `{%`), as vLLM reads it.
pub fn chat_template_source(value: &str) -> Result<String> {
    let path = std::path::Path::new(value);
    if path.is_file() {
        return std::fs::read_to_string(path).with_context(|| format!("--chat-template: reading {value}"));
    }
    if value.contains("{{") || value.contains("{%") {
        return Ok(value.to_string());
    }
    bail!("--chat-template: '{value}' is neither a file nor a Jinja template")
}

/// Loads the model, builds the engine and marks the server ready. `on_fatal` runs if a panic
/// ends the engine thread.
fn load(args: &ServeArgs, state: &Arc<AppState>, slo: SloParams, on_fatal: Option<engine_thread::OnFatal>, kv_events: Option<kv_events::Sink>) -> Result<()> {
    let mut loaded = args.engine.load()?;
    if let Some(t) = &args.chat_template {
        let source = chat_template_source(t)?;
        loaded.chat_template = pace_models::chat::ChatTemplate::new(&source, loaded.tokenizer.bos_token(), loaded.tokenizer.eos_token())
            .map_err(|e| anyhow::anyhow!("--chat-template: {e}"))?;
    }
    let tokenizer = Arc::new(loaded.tokenizer);
    let t = Instant::now();
    let grammars = match pace_models::constraint::Grammars::new(&tokenizer, loaded.model.config().vocab_size) {
        Ok(g) => {
            tracing::info!(secs = t.elapsed().as_secs_f64(), "structured outputs ready");
            Some(Arc::new(g.with_json_bounds(args.json_bounds)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "structured outputs are not available for this model");
            None
        }
    };
    let origin = Instant::now();
    let queue = (args.max_queue_requests, args.max_queue_tokens);
    let kv_dtype = args.engine.kv_dtype(&loaded.model);
    let core = crate::engine_setup::build_engine_with(&args.engine, loaded.model, loaded.max_model_len, &args.scheduler, |c| {
        c.slo = slo;
        c.max_queue_requests = queue.0.max(1);
        c.max_queue_tokens = queue.1.max(1);
    })?;
    let sc = core.scheduler().config();
    let (sc_block_size, on_gpu) = (sc.block_size, !core.runner_device_is_cpu());
    metrics::publish_cache_config(&metrics::CacheConfig {
        block_size: sc.block_size,
        num_blocks: sc.num_kv_blocks,
        cache_dtype: format!("{kv_dtype:?}").to_lowercase(),
        enable_prefix_caching: sc.enable_prefix_caching,
    });
    let shape = crate::serve::state::EngineShape {
        model_path: args.engine.model.clone().unwrap_or_else(|| state.model_name().to_string()),
        block_size: sc.block_size,
        num_blocks: sc.num_kv_blocks,
        max_num_seqs: sc.max_num_seqs,
        max_batch_tokens: sc.max_batch_tokens,
    };
    let trace = match &args.step_trace {
        Some(p) => Some(std::fs::OpenOptions::new().create(true).append(true).open(p).with_context(|| format!("opening --step-trace {}", p.display()))?),
        None => None,
    };
    let core = core
        .with_origin(origin)
        .fail_on_token(args.debug_fail_on_token)
        .panic_on_token(args.debug_panic_on_token)
        .stall_on_token(args.debug_stall_on_token)
        .nan_on_token(args.debug_nan_on_token)
        .step_trace(trace);
    let core = match kv_events {
        Some(sink) => {
            let (bs, medium) = (sc_block_size, if on_gpu { "GPU" } else { "CPU" });
            core.kv_events(Box::new(move |events| sink.send(kv_events::Batch::now(events, bs, medium))))
        }
        None => core,
    };
    let step_timeout = (args.engine_step_timeout > 0.0).then(|| Duration::from_secs_f64(args.engine_step_timeout));
    let engine = engine_thread::spawn(core, origin, on_fatal, step_timeout)?;
    let ok = state
        .loaded
        .set(Loaded {
            tokenizer,
            template: loaded.chat_template,
            engine,
            max_model_len: loaded.max_model_len,
            scheduler: args.scheduler.clone(),
            shape,
            grammars,
        })
        .is_ok();
    if !ok {
        bail!("model loaded twice");
    }
    state.set_ready();
    tracing::info!("ready: serving {} with the {} scheduler", state.model_name(), args.scheduler);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ServeArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    /// `--json-bounds`: either key alone keeps the other's default; anything else is refused.
    #[test]
    fn json_bounds_parse_by_key() {
        let parse = |v: &str| Cli::try_parse_from(["serve", "--json-bounds", v]).map(|c| c.serve.json_bounds);
        let d = pace_models::constraint::JsonBounds::default();
        assert_eq!(Cli::try_parse_from(["serve"]).unwrap().serve.json_bounds, d);
        assert_eq!(parse("max_items=7").unwrap(), pace_models::constraint::JsonBounds { max_items: 7, ..d });
        assert_eq!(parse(" max_length=9 , max_items=2").unwrap(), pace_models::constraint::JsonBounds { max_length: 9, max_items: 2 });
        for bad in ["max_items=0", "max_items=-1", "depth=3", "max_length", "max_length=1e3"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// An API key reaches no `Debug` output (a log line of the arguments, a panic message).
    #[test]
    fn api_keys_never_print() {
        let a = Cli::try_parse_from(["serve", "--api-key", "sk-very-secret,other-key"]).unwrap().serve;
        assert_eq!(a.api_key.iter().map(|k| k.expose()).collect::<Vec<_>>(), ["sk-very-secret", "other-key"]);
        let shown = format!("{a:?}");
        assert!(!shown.contains("very-secret") && !shown.contains("other-key"), "{shown}");
    }

    /// vLLM's spellings of the same knobs, and the environment (a flag on the command line wins).
    #[test]
    fn vllm_spellings_and_the_environment_set_the_same_knobs() {
        let a =
            Cli::try_parse_from(["serve", "--scheduling-policy", "fcfs", "--max-num-batched-tokens", "128", "--num-gpu-blocks-override", "64"]).unwrap().serve;
        assert_eq!((a.scheduler.as_str(), a.engine.max_batch_tokens, a.engine.kv_cache_blocks), ("fcfs", Some(128), Some(64)));
        // SAFETY: no other test of this binary reads or writes these variables.
        unsafe {
            std::env::set_var("PACE_MAX_LOGPROBS", "7");
            std::env::set_var("PACE_SERVED_MODEL_NAME", "a,b");
            std::env::set_var("PACE_SLO", "ttft:700 tpot:70");
            std::env::set_var("PACE_TTFT_GRACE", "1500");
        }
        let from_env = Cli::try_parse_from(["serve"]).unwrap().serve;
        let flag_wins = Cli::try_parse_from(["serve", "--max-logprobs", "3"]).unwrap().serve;
        unsafe {
            std::env::remove_var("PACE_MAX_LOGPROBS");
            std::env::remove_var("PACE_SERVED_MODEL_NAME");
            std::env::remove_var("PACE_SLO");
            std::env::remove_var("PACE_TTFT_GRACE");
        }
        // The SLO group: from the environment, in milliseconds, as pace bench and pace sim read it.
        let slo = from_env.slo.binary().unwrap().unwrap();
        assert_eq!((slo.ttft, slo.tpot, from_env.slo.class().grace), (Some(0.7), Some(0.07), 1.5));
        let a = Cli::try_parse_from(["serve", "--goodput", "ttft:100", "e2el:9000", "--penalty", "quadratic"]).unwrap().serve;
        assert_eq!(a.slo.binary().unwrap().unwrap().e2el, Some(9.0));
        assert!(Cli::try_parse_from(["serve"]).unwrap().serve.slo.binary().unwrap().is_none(), "serve applies DEFAULT_SLO itself");
        assert_eq!(from_env.max_logprobs, 7);
        assert_eq!(from_env.served_model_name, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(flag_wins.max_logprobs, 3);
        assert!(Cli::try_parse_from(["serve", "--scheduling-policy", "priority"]).is_err());
        // vLLM's --dtype values and aliases, --tokenizer, --log-format.
        use crate::cli::ModelDtype;
        for (v, want) in [
            ("auto", ModelDtype::Auto),
            ("half", ModelDtype::Float16),
            ("float16", ModelDtype::Float16),
            ("bfloat16", ModelDtype::Bfloat16),
            ("float", ModelDtype::Float32),
        ] {
            assert_eq!(Cli::try_parse_from(["serve", "--dtype", v]).unwrap().serve.engine.dtype, want, "{v}");
        }
        assert!(Cli::try_parse_from(["serve", "--dtype", "int3"]).is_err());
        let a = Cli::try_parse_from(["serve", "--tokenizer", "/m/tokenizer.json", "--log-format", "json"]).unwrap().serve;
        assert_eq!(a.engine.tokenizer.as_deref(), Some(std::path::Path::new("/m/tokenizer.json")));
        assert_eq!(a.log_format, super::LogFormat::Json);
        assert!(Cli::try_parse_from(["serve", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn the_log_filter_takes_rust_log_or_the_level_and_can_drop_request_lines() {
        use super::{log_filter, LogLevel};
        assert_eq!(log_filter(None, LogLevel::Warn, false), "warn");
        assert_eq!(log_filter(Some("pace=debug"), LogLevel::Warn, false), "pace=debug");
        assert_eq!(log_filter(Some(" "), LogLevel::Info, true), "info,pace::request=off");
        for f in [log_filter(None, LogLevel::Trace, true), log_filter(Some("info,hyper=warn"), LogLevel::Info, true)] {
            assert!(tracing_subscriber::EnvFilter::try_new(&f).is_ok(), "{f}");
        }
        let a = Cli::try_parse_from(["serve", "--log-level", "debug", "--disable-log-requests"]).unwrap().serve;
        assert_eq!((a.log_level, a.disable_log_requests), (LogLevel::Debug, true));
        assert!(Cli::try_parse_from(["serve", "--log-level", "loud"]).is_err());
    }
}

#[cfg(test)]
mod reading_rate_range_tests {
    use super::parse_rate_range;

    #[test]
    fn the_range_is_positive_finite_and_ordered() {
        assert_eq!(parse_rate_range("1,50"), Ok((1.0, 50.0)));
        assert_eq!(parse_rate_range(" 2.5 , 2.5 "), Ok((2.5, 2.5)));
        for bad in ["", "5", "0,5", "-1,5", "5,1", "1,inf", "1,nan", "a,b"] {
            assert!(parse_rate_range(bad).is_err(), "{bad}");
        }
    }
}
