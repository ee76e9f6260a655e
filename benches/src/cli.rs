//! `pace bench serve | sweep | ab | soak | hostile`: flags (named as `vllm bench serve` names them where the
//! concept is the same) and the three commands.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use pace_scheduler::sim::workload::PriorityMix;
use pace_scheduler::slo::{check_window_fractions, MaxTokensRule, Patience, SloClass};
use serde_json::{Map, Value};

use crate::arrivals::ArrivalProcess;
use crate::client::{first_model, http_client, Api, RequestOptions, Target};
use crate::dataset::{load_prompts, load_tokenizer, DatasetSpec, Prompt};
use crate::launch::{ServeConfig, ServeProcess};
use crate::load::{run_load, LoadOptions, Workload};
use crate::report::{summarize, table, utc_stamp, RunInfo};
use crate::sweep::{resumed_series, run_series, write_report, Axis, Load, PointSummary, SweepSpec};

/// `pace bench` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Drive one OpenAI-compatible server at one offered load and print vLLM-style results.
    Serve(ServeArgs),
    /// Run one server at several offered loads; write a report directory with plots.
    Sweep(SweepArgs),
    /// Run the identical seeded sweep against several servers (URLs, or `pace serve` per
    /// scheduler policy) and write one report with their curves overlaid.
    Ab(AbArgs),
    /// A long, hostile run against one pace server (overload, clients that leave, slow
    /// connections), judged by pass/fail checks; writes report.md and soak.json.
    Soak(crate::soak::SoakArgs),
    /// Polite users' TTFT, TPOT and /health latency, calm and under hostile clients (idle and
    /// slow-header floods, costly bodies, clients that hang up); writes report.md and hostile.json.
    Hostile(crate::hostile::HostileArgs),
    /// Score per-request exports of AIPerf, `vllm bench serve`, GuideLLM, inference-perf or pace
    /// itself: binary and smooth goodput and benefit per request sent, per run and load level.
    Score(crate::score::ScoreArgs),
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
    pub slo: crate::slo_args::SloArgs,
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
    pub client: Option<crate::third_party::Client>,
    /// The --client tool's executable (default: its name on PATH).
    #[arg(long)]
    pub client_bin: Option<String>,
    #[command(flatten)]
    pub loads: LoadArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Everything a run needs besides the target and the load, resolved from the flags.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The prompts, identical for every target and load.
    pub prompts: Vec<Prompt>,
    /// Seed of prompts and arrivals.
    pub seed: u64,
    /// Run options (bounds, body options, reading class).
    pub options: LoadOptions,
    /// Recorded with each result (label, URL, model and load are filled per run).
    pub info: RunInfo,
    /// What clients send as max_tokens.
    pub max_tokens_rule: MaxTokensRule,
    /// Each request's patience, seconds, in prompt order.
    pub patience: Vec<f64>,
    /// Each request's priority (`--priority-mix`; empty: none).
    pub priority: Vec<i64>,
    /// One line describing the workload.
    pub desc: String,
}

fn positive(name: &str, v: f64) -> Result<()> {
    if !(v > 0.0 && v.is_finite()) {
        bail!("{name} must be positive and finite, got {v}");
    }
    Ok(())
}

/// Checks the flags, loads the tokenizer and builds the prompts.
pub fn prepare(w: &WorkloadArgs, endpoint_api: Api) -> Result<Prepared> {
    if w.num_prompts == 0 {
        bail!("--num-prompts must be at least 1");
    }
    if w.num_prompts > w.max_requests {
        bail!("--num-prompts {} exceeds the hard cap --max-requests {}", w.num_prompts, w.max_requests);
    }
    positive("--time-limit", w.time_limit)?;
    if let Some(d) = w.duration {
        positive("--duration", d)?;
    }
    if w.max_concurrency == Some(0) {
        bail!("--max-concurrency must be at least 1");
    }
    ArrivalProcess::new(1.0, w.burstiness)?;
    check_window_fractions(w.warmup_fraction, w.window_end_fraction)?;
    let max_tokens_rule: MaxTokensRule = w.max_tokens_rule.parse()?;
    let patience_dist: Patience = w.patience.parse()?;
    let priority_mix = match &w.priority_mix {
        Some(m) => Some(m.parse::<PriorityMix>().map_err(anyhow::Error::msg)?).filter(|m| !m.is_none()),
        None => None,
    };
    let binary = w.slo.binary()?;
    let extra_body: Map<String, Value> = match &w.extra_body {
        Some(s) => match serde_json::from_str(s).context("--extra-body is not JSON")? {
            Value::Object(m) => m,
            _ => bail!("--extra-body must be a JSON object"),
        },
        None => Map::new(),
    };
    let seed = w.seed.unwrap_or_else(rand::random);
    let spec = match w.dataset_name.as_str() {
        "random" => DatasetSpec::Random { input_len: w.random_input_len, output_len: w.random_output_len, range_ratio: w.random_range_ratio },
        "sharegpt" => {
            DatasetSpec::ShareGpt { path: w.dataset_path.clone().context("--dataset-name sharegpt needs --dataset-path")?, output_len: w.sharegpt_output_len }
        }
        _ => DatasetSpec::Jsonl { path: w.dataset_path.clone().context("--dataset-name jsonl needs --dataset-path")?, default_output_len: w.random_output_len },
    };
    let tokenizer = load_tokenizer(w.tokenizer.as_deref())?;
    let tokenizer_id = w.tokenizer.as_ref().map_or("default model (SmolLM2-135M-Instruct)".to_string(), |p| p.display().to_string());
    let prompts = load_prompts(&spec, &tokenizer, w.num_prompts, seed)?;
    let class = w.slo.class();
    let params = w.slo.params(binary.unwrap_or_default());
    let ignore_eos = w.ignore_eos || w.dataset_name == "random";
    let options = LoadOptions {
        max_concurrency: w.max_concurrency,
        duration: w.duration,
        time_limit: w.time_limit,
        request: RequestOptions { ignore_eos, include_usage: !w.no_usage, temperature: w.temperature, extra_body },
        class,
        warmup_fraction: w.warmup_fraction,
        window_end_fraction: w.window_end_fraction,
        progress: !w.disable_tqdm,
    };
    let patience = patience_dist.draw(prompts.len(), seed);
    let priority = priority_mix.map_or_else(Vec::new, |m| m.draw(prompts.len(), seed));
    let mean = |f: fn(&Prompt) -> usize| prompts.iter().map(f).sum::<usize>() as f64 / prompts.len() as f64;
    let desc = format!(
        "{} requests, dataset {}, {} endpoint, mean prompt {:.0} tokens, mean true output {:.0} tokens{}, max_tokens {max_tokens_rule}, \
         patience {patience_dist}, temperature {}{}, arrivals gamma(burstiness {}), window {}..{} of the arrival span, seed {seed}{}",
        prompts.len(),
        w.dataset_name,
        w.endpoint,
        mean(|p| p.prompt_len),
        mean(|p| p.output_len),
        if ignore_eos { " (ignore_eos)" } else { " (the model ends its outputs)" },
        w.temperature,
        w.extra_body.as_deref().map_or(String::new(), |e| format!(", extra body {e}")),
        w.burstiness,
        w.warmup_fraction,
        w.window_end_fraction,
        priority_mix.map_or(String::new(), |m| format!(
            ", priority mix {m} ({} of {} requests at priority {}, weight {})",
            priority.iter().filter(|&&p| p != 0).count(),
            priority.len(),
            m.priority,
            SloClass::priority_weight(m.priority)
        )),
    );
    let info = RunInfo {
        label: String::new(),
        backend: match endpoint_api {
            Api::Completions => "openai".into(),
            Api::Chat => "openai-chat".into(),
        },
        url: String::new(),
        model_id: String::new(),
        tokenizer_id,
        num_prompts: w.num_prompts,
        request_rate: f64::INFINITY,
        burstiness: w.burstiness,
        max_concurrency: w.max_concurrency,
        seed,
        params,
        has_slo: binary.is_some(),
        priority_mix: priority_mix.map(|m| m.to_string()),
    };
    Ok(Prepared { prompts, seed, options, info, desc, max_tokens_rule, patience, priority })
}

fn api_of(endpoint: &str) -> Api {
    Target { label: String::new(), base_url: String::new(), endpoint: endpoint.into(), model: String::new(), api_key: None, max_model_len: None }.api()
}

async fn target(client: &reqwest::Client, label: &str, base_url: &str, w: &WorkloadArgs) -> Result<Target> {
    let listed = first_model(client, base_url, w.api_key.as_deref()).await;
    let (model, max_model_len) = match (&w.model, listed) {
        (Some(m), Ok((_, len))) => (m.clone(), len),
        (Some(m), Err(_)) => (m.clone(), None),
        (None, listed) => listed?,
    };
    Ok(Target { label: label.into(), base_url: base_url.into(), endpoint: w.endpoint.clone(), model, api_key: w.api_key.clone(), max_model_len })
}

/// Template tokens a chat endpoint may add around a prompt, kept free when `max_tokens` is cut
/// to the server's room.
const TEMPLATE_MARGIN: usize = 64;

/// The workload of one run: `prompts` on `schedule`, `max_tokens` by `rule` within the target's
/// room, and the clients' patience.
pub fn workload_for(target: &Target, prompts: &[Prompt], schedule: Vec<f64>, rule: MaxTokensRule, patience: &[f64], priority: &[i64]) -> Workload {
    let max_tokens = prompts
        .iter()
        .map(|p| {
            let room = target.max_model_len.map_or(usize::MAX, |len| len.saturating_sub(p.prompt_len + TEMPLATE_MARGIN).max(1));
            rule.max_tokens(p.output_len, room)
        })
        .collect();
    Workload { prompts: prompts.to_vec(), schedule, max_tokens, patience: patience.to_vec(), priority: priority.to_vec() }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

fn date() -> String {
    utc_stamp(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// Runs a `pace bench` command.
pub fn run(cmd: &BenchCommand) -> Result<()> {
    if let BenchCommand::Score(a) = cmd {
        return crate::score::run(a);
    }
    let rt = runtime()?;
    match cmd {
        BenchCommand::Serve(a) => rt.block_on(serve(a)).map(|_| ()),
        BenchCommand::Sweep(a) => rt.block_on(sweep(a)),
        BenchCommand::Ab(a) => rt.block_on(ab(a)),
        BenchCommand::Soak(a) => rt.block_on(crate::soak::soak(a)).map(|_| ()),
        BenchCommand::Hostile(a) => rt.block_on(crate::hostile::hostile(a)).map(|_| ()),
        BenchCommand::Score(a) => crate::score::run(a),
    }
}

/// `pace bench serve`; returns the result (also printed, and saved with --save-result).
pub async fn serve(a: &ServeArgs) -> Result<crate::report::BenchResult> {
    let w = &a.workload;
    let p = prepare(w, api_of(&w.endpoint))?;
    let process = ArrivalProcess::new(a.request_rate, w.burstiness)?;
    let client = http_client(w.max_concurrency.unwrap_or(256))?;
    let t = target(&client, &a.label, &a.base_url, w).await?;
    eprintln!("{}; offered {} req/s", p.desc, a.request_rate);
    let workload = workload_for(&t, &p.prompts, process.schedule(p.prompts.len(), p.seed), p.max_tokens_rule, &p.patience, &p.priority);
    let run = run_load(&client, &t, &workload, &p.options).await;
    let info = RunInfo { label: t.label.clone(), url: t.url(), model_id: t.model.clone(), request_rate: a.request_rate, ..p.info };
    let result = summarize(&run, &info);
    print!("{}", table(&result));
    if a.save_result {
        let name = a.result_filename.clone().unwrap_or_else(|| {
            let conc = w.max_concurrency.map_or(String::new(), |c| format!("-concurrency{c}"));
            let model = t.model.rsplit('/').next().unwrap_or("model");
            format!("{}-{}qps{conc}-{model}-{}.json", a.label, a.request_rate, result.date)
        });
        std::fs::create_dir_all(&a.result_dir)?;
        let path = a.result_dir.join(name);
        std::fs::write(&path, serde_json::to_string(&result)?).with_context(|| format!("writing {}", path.display()))?;
        println!("saved {}", path.display());
    }
    Ok(result)
}

fn sweep_spec(l: &LoadArgs, p: Prepared) -> Result<SweepSpec> {
    let (axis, loads) = if l.max_concurrencies.is_empty() {
        for r in &l.request_rates {
            positive("--request-rates", *r)?;
        }
        (Axis::RequestRate, l.request_rates.iter().map(|&rate| Load { rate, max_concurrency: None }).collect::<Vec<_>>())
    } else {
        if l.max_concurrencies.contains(&0) {
            bail!("--max-concurrencies must be at least 1");
        }
        ArrivalProcess::new(l.request_rate, 1.0)?;
        (Axis::Concurrency, l.max_concurrencies.iter().map(|&c| Load { rate: l.request_rate, max_concurrency: Some(c) }).collect())
    };
    if loads.is_empty() {
        bail!("give --request-rates or --max-concurrencies");
    }
    if axis == Axis::Concurrency && p.info.priority_mix.is_some() {
        bail!("--priority-mix is for open loops (--request-rates), not --max-concurrencies");
    }
    Ok(SweepSpec {
        prompts: p.prompts,
        max_tokens_rule: p.max_tokens_rule,
        patience: p.patience,
        priority: p.priority,
        seed: p.seed,
        burstiness: p.info.burstiness,
        options: p.options,
        info: p.info,
        axis,
        loads,
        workload_desc: p.desc,
        resume: l.resume,
    })
}

/// `pace bench sweep`.
pub async fn sweep(a: &SweepArgs) -> Result<()> {
    let prov = crate::provenance::collect();
    let w = &a.workload;
    let spec = sweep_spec(&a.loads, prepare(w, api_of(&w.endpoint))?)?;
    let dir = a.loads.result_dir.clone().unwrap_or_else(|| PathBuf::from(format!("pace-bench-{}", date())));
    let client = http_client(256)?;
    let t = target(&client, &a.label, &a.base_url, w).await?;
    let points = run_series(&client, &t, &spec, &dir).await?;
    let mut series = vec![(t.label.clone(), points)];
    write_report(&dir, &format!("pace bench sweep: {} ({})", t.label, t.base_url), &spec, &mut series, &prov)?;
    println!("wrote {}", dir.join("report.md").display());
    Ok(())
}

/// `pace bench ab`.
pub async fn ab(a: &AbArgs) -> Result<()> {
    if let Some(client) = a.client {
        return crate::third_party::ab(a, client).await;
    }
    let prov = crate::provenance::collect();
    let w = &a.workload;
    if !a.labels.is_empty() && a.labels.len() != a.base_urls.len() {
        bail!("--labels needs one label per --base-urls entry");
    }
    if !a.serve_cpus.is_empty() && a.serve_cpus.len() != a.scheduler.len() {
        bail!("--serve-cpus needs one CPU set per --scheduler entry ({} sets for {} policies)", a.serve_cpus.len(), a.scheduler.len());
    }
    if a.side_by_side && a.loads.resume {
        bail!("--resume reruns a missing point alone, which a --side-by-side comparison cannot: rerun the whole A/B");
    }
    if a.side_by_side && a.base_urls.len() + a.scheduler.len() < 2 {
        bail!("--side-by-side needs at least two targets");
    }
    let dir = a.loads.result_dir.clone().unwrap_or_else(|| PathBuf::from(format!("pace-bench-ab-{}", date())));
    if a.repeats == 1 {
        let (spec, mut series, _) = ab_once(a, w, &dir, 0).await?;
        write_report(&dir, &ab_title(&series), &spec, &mut series, &prov)?;
        println!("wrote {}", dir.join("report.md").display());
        return Ok(());
    }
    let base = w.seed.unwrap_or_else(rand::random);
    let mut runs = Vec::new();
    for r in 0..u64::from(a.repeats) {
        let seed = base.wrapping_add(r);
        eprintln!("repeat {} of {} (seed {seed})", r + 1, a.repeats);
        let w = WorkloadArgs { seed: Some(seed), ..w.clone() };
        let sub = dir.join(format!("seed-{seed}"));
        let (spec, mut series, order) = ab_once(a, &w, &sub, r as usize).await?;
        write_report(&sub, &ab_title(&series), &spec, &mut series, &prov)?;
        runs.push(crate::repeats::Repeat { seed, dir: format!("seed-{seed}"), spec, series, order, side_by_side: a.side_by_side });
    }
    let title = format!("{} ({} repeats)", ab_title(&runs[0].series), runs.len());
    crate::repeats::write_report(&dir, &title, &runs, &prov)?;
    println!("wrote {}", dir.join("report.md").display());
    Ok(())
}

fn ab_title(series: &[(String, Vec<PointSummary>)]) -> String {
    format!("pace bench ab: {}", series.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>().join(" vs "))
}

/// One A/B over every load into `dir` (its points and server logs); the report is the caller's.
/// The targets run one after another (URLs in `--base-urls` order, then the policies), starting
/// `rotate` places into that list and wrapping round, so that repeats can counterbalance the
/// order: a machine whose speed drifts over a repeat would otherwise always favour the same
/// target. The series come back in the listed order, with the labels in the order they ran.
async fn ab_once(a: &AbArgs, w: &WorkloadArgs, dir: &std::path::Path, rotate: usize) -> Result<(SweepSpec, Vec<(String, Vec<PointSummary>)>, Vec<String>)> {
    let spec = sweep_spec(&a.loads, prepare(w, api_of(&w.endpoint))?)?;
    let client = http_client(256)?;
    let cfg = serve_config(a, dir)?;
    if a.side_by_side {
        let mut spec = spec;
        spec.workload_desc.push_str("; the targets ran side by side (at the same time, each with its own copy of this workload)");
        let (series, order) = side_by_side(a, w, dir, rotate, &spec, &client, cfg.as_ref()).await?;
        return Ok((spec, series, order));
    }
    let urls = a.base_urls.len();
    let n = urls + a.scheduler.len();
    let mut done: Vec<Option<(String, Vec<PointSummary>)>> = vec![None; n];
    let mut order = Vec::with_capacity(n);
    for k in 0..n {
        let j = (k + rotate) % n;
        let ran = if j < urls {
            let url = &a.base_urls[j];
            let label = a.labels.get(j).cloned().unwrap_or_else(|| url.clone());
            let t = target(&client, &label, url, w).await?;
            (label, run_series(&client, &t, &spec, dir).await?)
        } else {
            let policy = &a.scheduler[j - urls];
            let cfg = cfg.as_ref().context("a policy target without a server configuration")?;
            if let Some(points) = resumed_series(&spec, dir, policy)? {
                eprintln!("[{policy}] every point is in {}: reused", dir.display());
                (policy.clone(), points)
            } else {
                let (server, t) = start_policy(&client, cfg, w, policy, cpus_for(a, j - urls, rotate)).await?;
                let points = run_series(&client, &t, &spec, dir).await?;
                stop_policy(policy, server).await?;
                (policy.clone(), points)
            }
        };
        order.push(ran.0.clone());
        done[j] = Some(ran);
    }
    let series = done.into_iter().flatten().collect();
    Ok((spec, series, order))
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

/// The CPUs of started server `i` (in --scheduler order) in repeat `rotate` (empty: unpinned).
fn cpus_for(a: &AbArgs, i: usize, rotate: usize) -> &[usize] {
    if a.serve_cpus.is_empty() {
        &[]
    } else {
        &a.serve_cpus[(i + rotate) % a.serve_cpus.len()]
    }
}

/// Starts `pace serve --scheduler policy` on `cpus` and waits until it is ready.
async fn start_policy(client: &reqwest::Client, cfg: &ServeConfig, w: &WorkloadArgs, policy: &str, cpus: &[usize]) -> Result<(ServeProcess, Target)> {
    eprintln!("starting pace serve --scheduler {policy}{}", on_cpus(cpus));
    let mut server = ServeProcess::spawn_on(cfg, policy, cpus)?;
    server.wait_ready(client, cfg.start_timeout).await?;
    let t = target(client, policy, &server.base_url, w).await?;
    Ok((server, t))
}

/// Stops a server [`start_policy`] started, warning when it did not exit cleanly.
async fn stop_policy(policy: &str, server: ServeProcess) -> Result<()> {
    let status = server.stop().await?;
    if !status.success() {
        eprintln!("warning: pace serve --scheduler {policy} exited with {status}");
    }
    Ok(())
}

fn on_cpus(cpus: &[usize]) -> String {
    if cpus.is_empty() {
        String::new()
    } else {
        format!(" on CPUs {}", cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","))
    }
}

/// [`ab_once`] with `--side-by-side`: every target up first (the URLs, then a started server per
/// policy, each on its CPUs), then each load for all of them at once; the next load starts when
/// every target's counted requests have ended. The order entries name each policy's CPUs.
async fn side_by_side(
    a: &AbArgs,
    w: &WorkloadArgs,
    dir: &std::path::Path,
    rotate: usize,
    spec: &SweepSpec,
    client: &reqwest::Client,
    cfg: Option<&ServeConfig>,
) -> Result<(Vec<(String, Vec<PointSummary>)>, Vec<String>)> {
    let mut targets = Vec::new();
    let mut order = Vec::new();
    for (j, url) in a.base_urls.iter().enumerate() {
        let label = a.labels.get(j).cloned().unwrap_or_else(|| url.clone());
        targets.push(target(client, &label, url, w).await?);
        order.push(label);
    }
    let mut servers = Vec::new();
    for (i, policy) in a.scheduler.iter().enumerate() {
        let cfg = cfg.context("a policy target without a server configuration")?;
        let cpus = cpus_for(a, i, rotate);
        let (server, t) = start_policy(client, cfg, w, policy, cpus).await?;
        targets.push(t);
        order.push(format!("{policy}{}", on_cpus(cpus)));
        servers.push((policy, server));
    }
    let mut points: Vec<Vec<PointSummary>> = vec![Vec::new(); targets.len()];
    for load in &spec.loads {
        let one = SweepSpec { loads: vec![*load], ..spec.clone() };
        let runs = futures_util::future::join_all(targets.iter().map(|t| run_series(client, t, &one, dir))).await;
        for (k, run) in runs.into_iter().enumerate() {
            points[k].extend(run?);
        }
    }
    for (policy, server) in servers {
        stop_policy(policy, server).await?;
    }
    let series = targets.iter().map(|t| t.label.clone()).zip(points).collect();
    Ok((series, order))
}
