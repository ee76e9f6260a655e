//! `pace bench serve | sweep | ab | soak | hostile`: flags (named as `vllm bench serve` names them where the
//! concept is the same) and the three commands.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use pace_scheduler::sim::workload::PriorityMix;
use pace_scheduler::slo::{check_window_fractions, MaxTokensRule, Patience, SloClass};
use serde_json::{Map, Value};

use crate::args::serve_config;
pub use crate::args::{AbArgs, LoadArgs, ServeArgs, SweepArgs, WorkloadArgs};
use crate::arrivals::ArrivalProcess;
use crate::client::{first_model, http_client, Api, RequestOptions, Target};
use crate::dataset::{load_prompts, load_tokenizer, DatasetSpec, Prompt};
use crate::launch::{ServeConfig, ServeProcess};
use crate::load::{run_load, workload_for, LoadOptions};
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
