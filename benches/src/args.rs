//! The flags of `pace bench serve`, `sweep` and `ab` (the workload, the load, the servers to
//! start, the tool that drives the load), and what they resolve to where it needs no network.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::launch::ServeConfig;

/// The benchmark tool that drives the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// NVIDIA AIPerf (`pip install aiperf`).
    Aiperf,
    /// GuideLLM (`pip install guidellm`).
    Guidellm,
    /// `vllm bench serve` (`pip install vllm`).
    Vllm,
}

impl Client {
    /// Its executable's name.
    pub fn exe(self) -> &'static str {
        match self {
            Client::Aiperf => "aiperf",
            Client::Guidellm => "guidellm",
            Client::Vllm => "vllm",
        }
    }
}

/// Workload, SLO and limit flags shared by every `pace bench` command.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Model name sent with each request; default: the first model the server lists on /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// Tokenizer that counts prompt tokens: a .gguf file, a Hugging Face model directory or a
    /// tokenizer.json, or dummy:NAME for `--model dummy:NAME` servers. Default: pace's default
    /// model (SmolLM2-135M-Instruct).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// API endpoint; chat sends the prompt as one user message.
    #[arg(long, default_value = "/v1/completions", value_parser = ["/v1/completions", "/v1/chat/completions"])]
    pub endpoint: String,
    /// Prompt source. `random` prompts are exactly --random-input-len tokens and always ignore EOS.
    #[arg(long, default_value = "random", value_parser = ["random", "sharegpt", "jsonl"])]
    pub dataset_name: String,
    /// File for sharegpt (ShareGPT JSON) or jsonl (`{"prompt": ..., "output_len": N}` per line).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Prompt tokens of random prompts.
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    /// Output tokens of random prompts (and of jsonl lines without `output_len`).
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Random lengths are uniform in [len * (1 - r), len * (1 + r)]; r in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Output tokens of ShareGPT prompts instead of each reply's length.
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    /// Requests per run.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Gamma shape of arrival gaps: 1 is Poisson, below 1 burstier, above 1 more regular.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight (default: unbounded, open loop).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Seed of prompts and arrivals; default: a fresh one each run (printed and saved).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Binary SLO and smooth-goodput parameters (the same flags and units as pace serve and pace sim).
    #[command(flatten)]
    pub slo: pace_scheduler::slo_args::SloArgs,
    /// Send `ignore_eos: true` so every output reaches its max tokens (always on for random).
    #[arg(long)]
    pub ignore_eos: bool,
    /// What each request sends as max_tokens, from the prompt's true output length (the
    /// dataset's output_len): exact, cap:N (N, or the server's room if smaller) or scale:K.
    /// Published comparisons use cap:1024 on a dataset whose outputs end by themselves.
    #[arg(long, default_value = "exact")]
    pub max_tokens_rule: String,
    /// How long each client waits: none, exp:MEAN_S, lognormal:MEDIAN_S,SIGMA or fixed:S. A
    /// client closes its connection when its idle latency (reading rate, grace) reaches its
    /// patience, judged from its own frame times. Seeded per request: every target sees the
    /// same clients.
    #[arg(long, default_value = "none")]
    pub patience: String,
    /// Send vLLM's `priority` field with every request: FRACTION:PRIORITY, e.g. 0.2:-2 (a fifth
    /// of the requests at priority -2, the rest at 0), drawn per request from the seed exactly
    /// as `pace sim --priority-mix` draws them. A request's benefit weighs `2^-priority`
    /// (docs/metrics.md), the ceiling is the weighted one (the heaviest served first), and the
    /// report gets a "By priority" table. Not with --max-concurrencies. (vLLM refuses a
    /// priority other than 0 unless it runs with `--scheduling-policy priority`.)
    #[arg(long)]
    pub priority_mix: Option<String>,
    /// Requests scheduled before this fraction of the arrival span are not counted (closed
    /// loops: this fraction of the requests).
    #[arg(long, default_value_t = 0.1)]
    pub warmup_fraction: f64,
    /// Requests scheduled after this fraction of the arrival span are not counted; they keep
    /// the load on until every counted request has ended, and then the run stops.
    #[arg(long, default_value_t = 0.8)]
    pub window_end_fraction: f64,
    /// Do not ask for the usage chunk; count one token per content frame.
    #[arg(long)]
    pub no_usage: bool,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// JSON object merged into every request body, e.g. '{"top_k": 1}'.
    #[arg(long)]
    pub extra_body: Option<String>,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Stop sending new requests after this many seconds (each run).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Hard cap on requests per run: a larger --num-prompts is an error.
    #[arg(long, default_value_t = 10_000)]
    pub max_requests: usize,
    /// Hard cap on each run's wall time, seconds: requests still running are cut (aborted).
    #[arg(long, default_value_t = 1800.0)]
    pub time_limit: f64,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}

/// `pace bench serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// Offered request rate, requests per second; `inf` sends everything at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Write the result JSON (vLLM field names plus per-request timelines).
    #[arg(long)]
    pub save_result: bool,
    /// Directory of the result file.
    #[arg(long, default_value = ".")]
    pub result_dir: PathBuf,
    /// Result file name (default: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json).
    #[arg(long)]
    pub result_filename: Option<String>,
    /// Name of the target in the result.
    #[arg(long, default_value = "pace-bench")]
    pub label: String,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Offered loads of a sweep.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Offered request rates to sweep, requests per second (comma separated).
    #[arg(long, value_delimiter = ',', required_unless_present = "max_concurrencies", conflicts_with = "max_concurrencies")]
    pub request_rates: Vec<f64>,
    /// Concurrency caps to sweep instead (comma separated); requests go out at --request-rate.
    #[arg(long, value_delimiter = ',')]
    pub max_concurrencies: Vec<usize>,
    /// Request rate of a concurrency sweep.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Report directory (default: pace-bench-DATE).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// Reuse every point already in --result-dir instead of running it again (a sweep cut short
    /// goes on where it stopped). A point file recorded for another workload, seed or SLO is an
    /// error, never silently reused or overwritten.
    #[arg(long)]
    pub resume: bool,
}

/// `pace bench sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// Name of the target in the report.
    #[arg(long, default_value = "target")]
    pub label: String,
    #[command(flatten)]
    pub loads: LoadArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// `pace bench ab`.
#[derive(Debug, Clone, Args)]
pub struct AbArgs {
    /// Servers to compare (comma separated base URLs). With --scheduler too, these run first
    /// (keep them idle while the started servers run: they share the machine).
    #[arg(long, value_delimiter = ',', required_unless_present = "scheduler")]
    pub base_urls: Vec<String>,
    /// Names of the --base-urls in the report (default: the URLs).
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Start `pace serve --scheduler P` for each policy in turn (comma separated) on a free
    /// 127.0.0.1 port, and stop it after its sweep (the ablations are accepted too).
    #[arg(long, value_delimiter = ',', value_parser = pace_scheduler::policy::parse_name)]
    pub scheduler: Vec<String>,
    /// The pace binary to start (default: this executable).
    #[arg(long)]
    pub pace_bin: Option<PathBuf>,
    /// `--model` of the started servers (default: pace's default model).
    #[arg(long)]
    pub serve_model: Option<String>,
    /// Extra argument for the started servers (repeatable), e.g. --serve-arg=--max-num-seqs=16.
    #[arg(long, allow_hyphen_values = true)]
    pub serve_arg: Vec<String>,
    /// Seconds to wait for a started server's /health.
    #[arg(long, default_value_t = 600.0)]
    pub server_start_timeout: f64,
    /// Seconds between SIGTERM and SIGKILL when stopping a started server.
    #[arg(long, default_value_t = 30.0)]
    pub server_stop_timeout: f64,
    /// Run the whole A/B this many times, with seeds SEED, SEED+1, ... (new prompts, arrivals
    /// and clients each time, the same for every target within a repeat). Each repeat writes a
    /// full report under `seed-S/`; `report.md` at the top gives every target's median, mean
    /// and 95% interval over the repeats, and the first target's paired difference from each
    /// other one. The run order rotates (repeat k starts with the k-th target), so a machine
    /// whose speed drifts over a repeat does not always favour the same target.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeats: u32,
    /// Run the targets at the same time instead of one after another: each load starts for
    /// every target at once, each with its own copy of the workload (the same prompts, arrivals
    /// and clients). A machine whose speed drifts then slows every target together, and the
    /// paired difference does not carry the drift. The targets share the machine: give each
    /// started server its own CPUs (--serve-cpus) and a thread count to match
    /// (--serve-arg=--threads=N).
    #[arg(long)]
    pub side_by_side: bool,
    /// CPUs of each started server, one set per --scheduler entry, the sets separated by '/'
    /// (`0/1`, `0-7/8-15`; Linux). With --repeats the sets rotate from one repeat to the next,
    /// so that no policy always gets the same CPUs. Default: unpinned.
    #[arg(long, value_delimiter = '/', value_parser = crate::launch::parse_cpus)]
    pub serve_cpus: Vec<Vec<usize>>,
    /// Drive the load with this third-party tool instead of pace's own client (installed with
    /// pip), on its own synthetic prompts of --random-input-len / --random-output-len tokens;
    /// its per-request exports are scored by `pace bench score` into report.md.
    #[arg(long, value_enum)]
    pub client: Option<Client>,
    /// The --client tool's executable (default: its name on PATH).
    #[arg(long)]
    pub client_bin: Option<String>,
    #[command(flatten)]
    pub loads: LoadArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// How to start `pace serve` for the --scheduler targets (`None` without any), logs in `dir/logs`.
pub(crate) fn serve_config(a: &AbArgs, dir: &std::path::Path) -> Result<Option<ServeConfig>> {
    if a.scheduler.is_empty() {
        return Ok(None);
    }
    let bin = match &a.pace_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("locating the pace binary; pass --pace-bin")?,
    };
    let mut args: Vec<String> = Vec::new();
    if let Some(m) = &a.serve_model {
        args.extend(["--model".to_string(), m.clone()]);
    }
    // A priority mix is meant to be honoured: pace serve clamps clients' priorities to 0..10
    // unless told to trust them (unless a --serve-arg sets the range itself).
    if a.workload.priority_mix.is_some() && !a.serve_arg.iter().any(|s| s.starts_with("--priority-range")) {
        args.push("--priority-range=-10,10".to_string());
    }
    args.extend(a.serve_arg.iter().cloned());
    Ok(Some(ServeConfig { bin, args, start_timeout: a.server_start_timeout, stop_timeout: a.server_stop_timeout, log_dir: dir.join("logs") }))
}
