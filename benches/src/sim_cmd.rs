//! `pace sim`: the discrete-event simulator's command line, tables, JSON and plots.
//!
//! Runs are measured as `../shared/docs/evaluation.md` says (see [`pace_scheduler::sim`]): a
//! steady-state measurement window, clients with patience and their own `max_tokens` rule,
//! noisy steps and a wrong prior, several seeds with 95% intervals, and the ceiling. Every
//! policy runs on the same seeded workload at every load; the preset's saturation on that
//! workload is estimated first (fcfs under a backlog), so loads can be given as multiples of it
//! and its output rate is the ceiling's `Theta`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser};
use pace_scheduler::sim::workload::sharegpt_pairs;
use pace_scheduler::sim::{
    preset, presets, saturation, sweep, Arrivals, ClientModel, Fleet, LengthSource, Lengths, Load, PriorityMix, Retries, Router, Saturation, Sharing,
    SimConfig, SweepPoint, SweepSpec,
};
use pace_scheduler::slo::{check_window_fractions, BinarySlo, MaxTokensRule, Patience};
use serde::Serialize;

use crate::plots::{write_chart, write_grid, Chart, Line};
use crate::provenance::{self, Provenance};

/// Options of `pace sim`. The defaults are evaluation.md's standard for published comparisons.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Cost-model preset (machine and model).
    #[arg(long, default_value = "h200-llama3-8b", value_parser = preset_parser())]
    pub preset: String,
    /// Policies to compare, comma separated: smooth, fcfs, drop-late, and
    /// `smooth:KEY=VALUE[:KEY=VALUE...]`, smooth with some of its configuration set (door, start,
    /// chunk and order: 0 switches the rule off, for an ablation; max_loss; window_s;
    /// docs/scheduler.md).
    #[arg(long, value_delimiter = ',', default_value = "smooth,fcfs,drop-late", value_parser = pace_scheduler::policy::parse_name)]
    pub policies: Vec<String>,
    /// Offered loads as multiples of the preset's estimated saturation rate on the workload.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,1.5,2", conflicts_with_all = ["rates", "clients"])]
    pub load_factors: Vec<f64>,
    /// Offered loads in requests per second (instead of --load-factors).
    #[arg(long, value_delimiter = ',', conflicts_with = "clients")]
    pub rates: Option<Vec<f64>>,
    /// Closed loops instead of open-loop rates: this many clients, each sending its next
    /// request the moment its last one ends or is refused (comma separated: one run each).
    #[arg(long, value_delimiter = ',')]
    pub clients: Option<Vec<usize>>,
    /// Requests per run (arrivals keep coming for the whole run).
    #[arg(long, default_value_t = 10_000)]
    pub num_requests: usize,
    /// Seeds: every point runs once per seed (workload, patience, step noise and prior error),
    /// and the tables give the mean and a 95% interval.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5", conflicts_with = "seed")]
    pub seeds: Vec<u64>,
    /// One seed instead of --seeds.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Requests that arrive before this fraction of the arrival span are not counted (the
    /// queue is still filling).
    #[arg(long, default_value_t = 0.1)]
    pub warmup_fraction: f64,
    /// Requests that arrive after this fraction of the arrival span are not counted (they keep
    /// the load on while the counted ones finish).
    #[arg(long, default_value_t = 0.8)]
    pub window_end_fraction: f64,
    /// How long clients wait: none, exp:MEAN_S, lognormal:MEDIAN_S,SIGMA or fixed:S. A client
    /// leaves when its idle latency reaches its patience.
    #[arg(long, default_value = "exp:20")]
    pub patience: String,
    /// What clients send as max_tokens: exact (the true length, an oracle), cap:N, scale:K.
    #[arg(long, default_value = "cap:1024")]
    pub max_tokens_rule: String,
    /// Each request declares a reading rate drawn uniformly from MIN,MAX tokens per second
    /// (scheduled and scored at it); `none`: every request at the SLO's --reading-rate.
    #[arg(long, default_value = "3,15")]
    pub reading_rates: String,
    /// Share of readers who stop partway through an answer (a "stop" button, not impatience):
    /// each after a uniform share of the tokens it would be served.
    #[arg(long, default_value_t = 0.1)]
    pub stop_fraction: f64,
    /// Retries after a refusal: none, or MAX:HONOUR (each request retries up to MAX times; a
    /// share HONOUR of the clients waits the announced Retry-After, capped at 60 s, the rest
    /// comes back at once).
    #[arg(long, default_value = "2:0.5")]
    pub retries: String,
    /// Relative standard deviation of simulated step times (log-normal), where they come from
    /// the preset's cost model.
    #[arg(long, default_value_t = 0.05)]
    pub noise: f64,
    /// Where step times come from: `replay` draws measured engine steps of the preset's
    /// committed trace (the CPU preset has one; a preset without one uses its model), `model`
    /// the preset's linear cost model times --noise.
    #[arg(long, default_value = "replay", value_parser = ["replay", "model"])]
    pub step_times: String,
    /// The scheduler's cost prior is off by up to this factor per coefficient (seeded); it
    /// learns the truth online from the noisy steps.
    #[arg(long, default_value_t = 0.3)]
    pub prior_error: f64,
    /// Identical replicas behind a router, each with its own scheduler and step clock (a
    /// refused request is retried through the router); the saturation estimate, and so the
    /// load factors, scale with them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub replicas: u16,
    /// How the router picks a replica for each request, comma separated to compare them (every
    /// policy runs behind each): round-robin, least-queue (fewest requests running or
    /// waiting), predicted-wait (pace's `/get_load` `predicted_wait_s`: the shortest predicted
    /// wait before a new request starts, ties by the fewest requests) or least-tokens
    /// (`/get_load`'s `num_tokens`, what SGLang's `power_of_two` compares).
    #[arg(long, value_delimiter = ',', default_value = "round-robin", value_parser = Router::parse)]
    pub routers: Vec<Router>,
    /// Seconds between the router's polls of the replicas' load; between polls it routes by
    /// what it saw last, as real routers do (0: it sees them exactly at every request).
    #[arg(long, default_value_t = 0.0)]
    pub router_poll: f64,
    /// Write sweep.json, summary.jsonl, report.md and one SVG per metric here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON object per (policy, load) line instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Binary SLO and smooth-goodput parameters (the same flags and units as pace serve and
    /// pace bench); without `--slo`, the preset's SLO.
    #[command(flatten)]
    pub slo: pace_scheduler::slo_args::SloArgs,
    /// Prompt tokens: N or LO:HI (uniform); default: the preset's.
    #[arg(long)]
    pub input_len: Option<String>,
    /// True output tokens (where end-of-sequence comes): N or LO:HI (uniform); default: the
    /// preset's.
    #[arg(long)]
    pub output_len: Option<String>,
    /// Draw (prompt, output) lengths from a ShareGPT-format JSON file (about 4 characters a token).
    #[arg(long, conflicts_with_all = ["input_len", "output_len"])]
    pub sharegpt: Option<PathBuf>,
    /// Arrival process: poisson or gamma:CV (CV the gaps' coefficient of variation; above 1 is
    /// burstier than Poisson).
    #[arg(long, default_value = "gamma:1.5")]
    pub arrivals: String,
    /// Send a share of the requests at another vLLM `priority` (weight 2^-priority):
    /// FRACTION:PRIORITY, e.g. 0.2:-2. Per-priority results are reported beside the totals, and
    /// the ceiling serves the heaviest requests first.
    #[arg(long)]
    pub priority_mix: Option<String>,
    /// KV-cache blocks (including the null block) instead of the preset's: fewer make memory
    /// bind before step time does, so streams are preempted and recomputed.
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    pub kv_cache_blocks: Option<u32>,
    /// Every prompt starts with the same system prompt of this many tokens.
    #[arg(long, default_value_t = 0)]
    pub system_prompt: usize,
    /// Requests are turns of conversations this long: each turn re-sends the system prompt, the
    /// earlier questions and answers, and a new question of the preset's (or --input-len's)
    /// prompt length.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub turns: u32,
    /// Mean seconds a user thinks after reading an answer (at the reading rate) before sending
    /// the next turn (exponential).
    #[arg(long, default_value_t = 10.0)]
    pub think_time: f64,
    /// Reuse the KV blocks of prefixes earlier requests computed (on by default, as in pace
    /// serve; `--enable-prefix-caching false` or `--no-enable-prefix-caching` turns it off).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
}

impl SimArgs {
    /// Whether the scheduler reuses cached prefixes (`--enable-prefix-caching`, unless
    /// `--no-enable-prefix-caching`).
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching && !self.no_enable_prefix_caching
    }
}

fn preset_parser() -> PossibleValuesParser {
    PossibleValuesParser::new(presets().into_iter().map(|p| PossibleValue::new(p.name).help(p.description)))
}

fn parse_lengths(s: &str) -> Result<Lengths> {
    let n = |v: &str| v.trim().parse::<usize>().with_context(|| format!("length `{s}`: expected N or LO:HI"));
    Ok(match s.split_once(':') {
        Some((lo, hi)) => {
            let (lo, hi) = (n(lo)?, n(hi)?);
            if lo == 0 || hi < lo {
                bail!("length `{s}`: need 1 <= LO <= HI");
            }
            Lengths::Uniform(lo, hi)
        }
        None => match n(s)? {
            0 => bail!("length `{s}` must be at least 1"),
            v => Lengths::Fixed(v),
        },
    })
}

fn parse_reading_rates(s: &str) -> Result<Option<(f64, f64)>> {
    if s == "none" {
        return Ok(None);
    }
    let bad = || anyhow::anyhow!("reading rates `{s}`: expected none or MIN,MAX tokens per second with 0 < MIN <= MAX");
    let (lo, hi) = s.split_once(',').ok_or_else(bad)?;
    let (lo, hi) = (lo.trim().parse::<f64>().map_err(|_| bad())?, hi.trim().parse::<f64>().map_err(|_| bad())?);
    if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
        return Err(bad());
    }
    Ok(Some((lo, hi)))
}

fn parse_arrivals(s: &str) -> Result<Arrivals> {
    if s == "poisson" {
        return Ok(Arrivals::Poisson);
    }
    let cv = s
        .strip_prefix("gamma:")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .with_context(|| format!("arrivals `{s}`: expected poisson or gamma:CV with CV > 0"))?;
    Ok(Arrivals::Gamma { cv })
}

/// One line of `--json` output: one (policy, load), every number the mean over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryLine {
    /// Preset name.
    pub preset: String,
    /// Policy name.
    pub policy: String,
    /// Offered request rate, per second (0 for a closed loop).
    pub rate: f64,
    /// Offered rate over saturation rate (0 for a closed loop).
    pub load_factor: f64,
    /// Clients of a closed loop (null for open-loop rates).
    pub clients: Option<usize>,
    /// Estimated saturation request rate of the preset on this workload.
    pub saturation_rate: f64,
    /// Estimated saturated output throughput, tokens per second.
    pub saturation_output_tps: f64,
    /// The ceiling's `Theta`: the larger of the estimate and the best mean output throughput of
    /// any policy at the highest offered rate.
    pub theta: f64,
    /// The seeds run.
    pub seeds: Vec<u64>,
    /// First of `seeds`.
    pub seed: u64,
    /// Measurement window, seconds.
    pub window_s: f64,
    /// Counted requests (arrived in the window).
    pub counted: f64,
    /// Completed counted requests per second of the window.
    pub request_throughput: f64,
    /// Output tokens delivered to counted requests per second of the window.
    pub output_throughput: f64,
    /// Binary-SLO-passing requests per second.
    pub request_goodput: f64,
    /// Output tokens of passing requests per second.
    pub token_goodput: f64,
    /// Smooth goodput: counted benefit over the window.
    pub smooth_goodput: f64,
    /// Half-width of its 95% interval over seeds.
    pub smooth_goodput_ci95: f64,
    /// Counted benefit per counted request (closed loops: per request sent).
    pub benefit_per_request: f64,
    /// Half-width of its 95% interval over seeds.
    pub benefit_per_request_ci95: f64,
    /// The ceiling: `min(offered output tok/s, Theta)` (closed loops: best benefit per request).
    pub ceiling: f64,
    /// Smooth goodput over the ceiling (closed loops: benefit per request over it).
    pub ceiling_fraction: f64,
    /// Half-width of its 95% interval over seeds.
    pub ceiling_fraction_ci95: f64,
    /// Passed over completed.
    pub attainment: f64,
    /// Passed over counted.
    pub attainment_offered: f64,
    /// Seconds, requests with a token.
    pub ttft_p50: f64,
    /// Seconds, requests with a token.
    pub ttft_p99: f64,
    /// Seconds, completed requests.
    pub ttft_p99_served: f64,
    /// Seconds, every counted request (those without a token count their whole wait).
    pub ttft_p99_all: f64,
    /// Seconds, requests with two tokens or more.
    pub tpot_p50: f64,
    /// Seconds, requests with two tokens or more.
    pub tpot_p99: f64,
    /// Seconds, completed requests.
    pub tpot_p50_served: f64,
    /// Seconds, requests not rejected.
    pub idle_p50: f64,
    /// Seconds, requests not rejected.
    pub idle_p99: f64,
    /// Seconds, requests not rejected.
    pub idle_mean: f64,
    /// Seconds, completed requests.
    pub idle_p99_served: f64,
    /// Seconds, every counted request (a rejected one counts its wait until the refusal).
    pub idle_p99_all: f64,
    /// Completed counted requests.
    pub completed: f64,
    /// Rejected at admission.
    pub rejected: f64,
    /// Dropped after admission.
    pub dropped: f64,
    /// Clients that left.
    pub abandoned: f64,
    /// rejected / counted.
    pub rejected_frac: f64,
    /// dropped / counted.
    pub dropped_frac: f64,
    /// abandoned / counted.
    pub abandoned_frac: f64,
    /// Work (tokens fed) spent on counted requests whose client left, over all work on counted
    /// requests.
    pub wasted_tokens_frac: f64,
    /// Preemptions per run.
    pub preempted: f64,
    /// Arrivals smooth's door took for clients answering a refusal per run (0 for other
    /// policies).
    pub door_returns: f64,
    /// Arrivals smooth's door judged under sustained overload, over those it judged.
    pub overloaded_frac: f64,
    /// Requests per run.
    pub num_requests: usize,
    /// Patience of clients.
    pub patience: String,
    /// Clients' max_tokens rule.
    pub max_tokens_rule: String,
    /// Step-time noise (where step times come from the cost model).
    pub noise: f64,
    /// `replay` (measured steps) or `model`.
    pub step_times: String,
    /// Clients' declared reading rates, `MIN,MAX` or `none`.
    pub reading_rates: String,
    /// Share of readers who stop partway.
    pub stop_fraction: f64,
    /// Retries after a refusal, `MAX:HONOUR` or `none`.
    pub retries: String,
    /// Arrival process.
    pub arrivals: String,
    /// Prior error.
    pub prior_error: f64,
    /// The priority mix clients send (`FRACTION:PRIORITY`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_mix: Option<String>,
    /// The counted requests of each priority, most important first, when there is a mix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_priority: Vec<PrioritySummary>,
    /// Mean prompt tokens of the counted requests (system prompt and history included).
    pub mean_prompt_len: f64,
    /// Tokens of the shared system prompt (0: none).
    pub system_prompt: usize,
    /// Turns per conversation (1: single requests).
    pub turns: u32,
    /// Whether the scheduler reused cached prefixes.
    pub prefix_caching: bool,
    /// Prompt tokens found cached over prompt tokens looked up.
    pub prefix_cache_hit_rate: f64,
}

/// The counted requests of one priority (means over seeds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrioritySummary {
    /// vLLM's priority (lower is more important).
    pub priority: i64,
    /// Counted requests of this priority per run.
    pub counted: f64,
    /// Their benefit per request (weighted by their class) and its 95% half-width.
    pub benefit_per_request: f64,
    /// 95% half-width of `benefit_per_request`.
    pub benefit_per_request_ci95: f64,
    /// Rejected at the door, share of this priority's requests.
    pub rejected_frac: f64,
    /// Clients who left, share.
    pub abandoned_frac: f64,
    /// Time to first token p99 over every request of this priority (a request that never got
    /// one counts at its end).
    pub ttft_p99_all: f64,
    /// TPOT p50 of this priority's served requests, seconds.
    pub tpot_p50_served: f64,
}

fn summary(p: &SweepPoint, preset: &str, args: &SimArgs, seeds: &[u64]) -> SummaryLine {
    let m = |f: &dyn Fn(&pace_scheduler::sim::SeedRun) -> f64| p.mean(f);
    let (sg, sg_ci) = p.mean_ci(|r| r.eval.stats.smooth_goodput);
    let (bpr, bpr_ci) = p.mean_ci(|r| r.eval.stats.benefit_per_request);
    let (cf, cf_ci) = p.mean_ci(|r| r.ceiling_fraction);
    SummaryLine {
        preset: preset.to_string(),
        policy: if args.replicas > 1 || args.routers.len() > 1 { format!("{} @ {}", p.policy, p.router.name()) } else { p.policy.clone() },
        rate: p.rate,
        load_factor: p.load_factor,
        clients: match p.load {
            Load::Clients(n) => Some(n),
            Load::Rate(_) => None,
        },
        saturation_rate: p.saturation.rate,
        saturation_output_tps: p.saturation.output_tps,
        theta: p.theta,
        seeds: seeds.to_vec(),
        seed: seeds.first().copied().unwrap_or(0),
        window_s: m(&|r| r.eval.stats.window_s),
        counted: m(&|r| r.eval.stats.offered as f64),
        request_throughput: m(&|r| r.eval.stats.request_throughput),
        output_throughput: m(&|r| r.eval.stats.output_throughput),
        request_goodput: m(&|r| r.eval.stats.request_goodput),
        token_goodput: m(&|r| r.eval.stats.token_goodput),
        smooth_goodput: sg,
        smooth_goodput_ci95: sg_ci,
        benefit_per_request: bpr,
        benefit_per_request_ci95: bpr_ci,
        ceiling: m(&|r| r.ceiling),
        ceiling_fraction: cf,
        ceiling_fraction_ci95: cf_ci,
        attainment: m(&|r| r.eval.stats.attainment),
        attainment_offered: m(&|r| r.eval.stats.attainment_offered),
        ttft_p50: m(&|r| r.eval.stats.ttft.p50),
        ttft_p99: m(&|r| r.eval.stats.ttft.p99),
        ttft_p99_served: m(&|r| r.eval.stats.ttft_served.p99),
        ttft_p99_all: m(&|r| r.eval.stats.ttft_all.p99),
        tpot_p50: m(&|r| r.eval.stats.tpot.p50),
        tpot_p99: m(&|r| r.eval.stats.tpot.p99),
        tpot_p50_served: m(&|r| r.eval.stats.tpot_served.p50),
        idle_p50: m(&|r| r.eval.stats.idle.p50),
        idle_p99: m(&|r| r.eval.stats.idle.p99),
        idle_mean: m(&|r| r.eval.stats.idle.mean),
        idle_p99_served: m(&|r| r.eval.stats.idle_served.p99),
        idle_p99_all: m(&|r| r.eval.stats.idle_all.p99),
        completed: m(&|r| r.eval.stats.completed as f64),
        rejected: m(&|r| r.eval.stats.rejected as f64),
        dropped: m(&|r| r.eval.stats.dropped as f64),
        abandoned: m(&|r| r.eval.stats.abandoned as f64),
        rejected_frac: m(&|r| r.eval.stats.rejected_frac),
        dropped_frac: m(&|r| r.eval.stats.dropped_frac),
        abandoned_frac: m(&|r| r.eval.stats.abandoned_frac),
        wasted_tokens_frac: m(&|r| r.eval.wasted_tokens_frac),
        preempted: m(&|r| r.eval.preempted as f64),
        door_returns: m(&|r| r.eval.door_returns as f64),
        overloaded_frac: m(&|r| r.eval.overloaded_frac),
        num_requests: args.num_requests,
        patience: args.patience.clone(),
        max_tokens_rule: args.max_tokens_rule.clone(),
        noise: args.noise,
        step_times: args.step_times.clone(),
        reading_rates: args.reading_rates.clone(),
        stop_fraction: args.stop_fraction,
        retries: args.retries.clone(),
        arrivals: args.arrivals.clone(),
        prior_error: args.prior_error,
        priority_mix: args.priority_mix.clone(),
        by_priority: by_priority(p),
        mean_prompt_len: m(&|r| r.eval.mean_prompt_len),
        system_prompt: args.system_prompt,
        turns: args.turns,
        prefix_caching: args.prefix_caching(),
        prefix_cache_hit_rate: m(&|r| r.eval.prefix_cache_hit_frac),
    }
}

/// Per-priority means over seeds (empty unless the runs had a priority mix).
fn by_priority(p: &SweepPoint) -> Vec<PrioritySummary> {
    let Some(first) = p.runs.first() else { return Vec::new() };
    first
        .eval
        .by_priority
        .iter()
        .map(|&(prio, _)| {
            let of = |f: &dyn Fn(&pace_scheduler::slo::WindowStats) -> f64| {
                p.mean_ci(|r| r.eval.by_priority.iter().find(|(q, _)| *q == prio).map_or(0.0, |(_, s)| f(s)))
            };
            let (bpr, bpr_ci) = of(&|s| s.benefit_per_request);
            PrioritySummary {
                priority: prio,
                counted: of(&|s| s.offered as f64).0,
                benefit_per_request: bpr,
                benefit_per_request_ci95: bpr_ci,
                rejected_frac: of(&|s| s.rejected_frac).0,
                abandoned_frac: of(&|s| s.abandoned_frac).0,
                ttft_p99_all: of(&|s| s.ttft_all.p99).0,
                tpot_p50_served: of(&|s| s.tpot_served.p50).0,
            }
        })
        .collect()
}

/// Everything `pace sim` resolved from its flags.
struct Setup {
    preset: &'static str,
    cfg: SimConfig,
    workload: pace_scheduler::sim::WorkloadSpec,
    client: ClientModel,
    seeds: Vec<u64>,
}

fn setup(args: &SimArgs) -> Result<Setup> {
    let p = preset(&args.preset).with_context(|| format!("unknown preset `{}`", args.preset))?;
    if args.num_requests == 0 {
        bail!("--num-requests must be at least 1");
    }
    if !(args.noise >= 0.0 && args.noise.is_finite() && args.prior_error >= 0.0 && args.prior_error.is_finite()) {
        bail!("--noise and --prior-error must be finite and >= 0");
    }
    check_window_fractions(args.warmup_fraction, args.window_end_fraction)?;
    let seeds = match args.seed {
        Some(s) => vec![s],
        None => args.seeds.clone(),
    };
    if seeds.is_empty() {
        bail!("--seeds needs at least one seed");
    }
    let mut cfg = SimConfig::from_preset(&p);
    cfg.noise = args.noise;
    cfg.replay = if args.step_times == "replay" { p.step_table().map(std::sync::Arc::new) } else { None };
    cfg.prior_error = args.prior_error;
    cfg.seed = seeds[0];
    cfg.warmup_fraction = args.warmup_fraction;
    cfg.window_end_fraction = args.window_end_fraction;
    if let Some(blocks) = args.kv_cache_blocks {
        cfg.sched.num_kv_blocks = blocks as usize;
    }
    let binary = match args.slo.binary()? {
        Some(b) => b,
        None => p.goodput.parse::<BinarySlo>()?,
    };
    cfg.sched.slo = args.slo.params(binary);
    let mut workload = p.workload.clone();
    workload.arrivals = parse_arrivals(&args.arrivals)?;
    if let Some(path) = &args.sharegpt {
        workload.lengths = LengthSource::Pairs(sharegpt_pairs(path)?);
    } else if args.input_len.is_some() || args.output_len.is_some() {
        if let LengthSource::Synthetic { input, output } = &mut workload.lengths {
            if let Some(s) = &args.input_len {
                *input = parse_lengths(s)?;
            }
            if let Some(s) = &args.output_len {
                *output = parse_lengths(s)?;
            }
        } else {
            let (Some(i), Some(o)) = (&args.input_len, &args.output_len) else {
                bail!("preset {} draws prompt and output lengths in pairs from its prompt set: give both --input-len and --output-len", p.name);
            };
            workload.lengths = LengthSource::Synthetic { input: parse_lengths(i)?, output: parse_lengths(o)? };
        }
    }
    if !(args.think_time >= 0.0 && args.think_time.is_finite()) {
        bail!("--think-time must be finite and >= 0");
    }
    workload.sharing = Sharing { system: args.system_prompt, turns: args.turns as usize, think_s: args.think_time, read_tps: args.slo.reading_rate };
    cfg.sched.enable_prefix_caching = args.prefix_caching();
    let priority_mix = match &args.priority_mix {
        Some(m) => m.parse::<PriorityMix>().map_err(anyhow::Error::msg)?,
        None => PriorityMix::default(),
    };
    if !(0.0..=1.0).contains(&args.stop_fraction) {
        bail!("--stop-fraction must be in [0, 1]");
    }
    let client = ClientModel {
        max_tokens: args.max_tokens_rule.parse::<MaxTokensRule>()?,
        patience: args.patience.parse::<Patience>()?,
        priority_mix,
        reading_rates: parse_reading_rates(&args.reading_rates)?,
        stop_fraction: args.stop_fraction,
        retries: args.retries.parse::<Retries>().map_err(anyhow::Error::msg)?,
    };
    Ok(Setup { preset: p.name, cfg, workload, client, seeds })
}

/// Run `pace sim`.
pub fn run(args: &SimArgs) -> Result<()> {
    let prov = provenance::collect();
    let Setup { preset: name, mut cfg, workload, client, seeds } = setup(args)?;
    let one = saturation(&cfg, &workload, &client, 0, seeds[0]);
    let n = f64::from(args.replicas);
    let sat = Saturation { rate: one.rate * n, output_tps: one.output_tps * n };
    if !(args.router_poll >= 0.0 && args.router_poll.is_finite()) {
        bail!("--router-poll must be a finite number of seconds >= 0");
    }
    cfg.fleet = Fleet { replicas: usize::from(args.replicas), router: args.routers.first().copied().unwrap_or_default(), poll_s: args.router_poll };
    let loads: Vec<Load> = match (&args.clients, &args.rates) {
        (Some(c), _) => {
            if c.contains(&0) {
                bail!("--clients must be at least 1");
            }
            c.iter().map(|&n| Load::Clients(n)).collect()
        }
        (None, Some(r)) => r.iter().map(|&x| Load::Rate(x)).collect(),
        (None, None) => args.load_factors.iter().map(|f| Load::Rate(f * sat.rate)).collect(),
    };
    if loads.iter().any(|l| matches!(l, Load::Rate(r) if !(*r > 0.0 && r.is_finite()))) {
        bail!("offered rates must be positive");
    }
    let policies: Vec<&str> = args.policies.iter().map(|s| s.as_str()).collect();
    let spec =
        SweepSpec { policies: &policies, routers: &args.routers, loads: &loads, num_requests: args.num_requests, seeds: &seeds, client, saturation: sat };
    let points = sweep(&cfg, &workload, &spec)?;
    let lines: Vec<SummaryLine> = points.iter().map(|x| summary(x, name, args, &seeds)).collect();
    if args.json {
        for l in &lines {
            println!("{}", serde_json::to_string(l)?);
        }
    } else {
        println!("{}", describe(name, args, &cfg, &workload, sat, &seeds));
        print!("{}", tables(&lines, false));
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, &prov, &describe(name, args, &cfg, &workload, sat, &seeds), &lines, &points, &cfg, sat)?;
        if !args.json {
            println!("wrote {}", dir.display());
        }
    }
    Ok(())
}

fn describe(name: &str, args: &SimArgs, cfg: &SimConfig, workload: &pace_scheduler::sim::WorkloadSpec, sat: Saturation, seeds: &[u64]) -> String {
    let steps = match &cfg.replay {
        Some(t) => format!("replayed from {} measured steps", t.len()),
        None => format!("cost model with noise {}", args.noise),
    };
    let (mean_in, mean_out) = workload.mean_lengths();
    let slo = &cfg.sched.slo;
    format!(
        "preset {name}{} | saturation ~{:.2} req/s, {:.0} output tok/s | {} requests per run, seeds {:?}, window {}..{} of the arrivals | \
         mean {} {mean_in:.0}, mean true output {mean_out:.0} tokens, max_tokens {}, patience {}, reading rates {}, stop fraction {}, retries {}, arrivals {} | step times {}, prior error {} | \
         q={} tok/s g={} ms alpha={} f={} | goodput SLO \"{}\"{} | {} KV blocks of {} tokens{}",
        if args.replicas > 1 {
            let poll = if args.router_poll > 0.0 { format!(", polled every {} s", args.router_poll) } else { String::new() };
            format!(" x {} replicas behind a router{poll} (saturation scaled)", args.replicas)
        } else {
            String::new()
        },
        sat.rate,
        sat.output_tps,
        args.num_requests,
        seeds,
        args.warmup_fraction,
        args.window_end_fraction,
        if workload.sharing.is_none() { "prompt" } else { "question" },
        args.max_tokens_rule,
        args.patience,
        args.reading_rates,
        args.stop_fraction,
        args.retries,
        args.arrivals,
        steps,
        args.prior_error,
        args.slo.reading_rate,
        args.slo.ttft_grace,
        slo.alpha,
        slo.penalty,
        slo.binary,
        args.priority_mix.as_ref().map_or(String::new(), |m| format!(" | priority mix {m}")),
        cfg.sched.num_kv_blocks,
        cfg.sched.block_size,
        sharing(workload, cfg),
    )
}

/// The prompts' sharing and the prefix cache, for the description.
fn sharing(workload: &pace_scheduler::sim::WorkloadSpec, cfg: &SimConfig) -> String {
    let s = workload.sharing;
    let mut out = String::new();
    if s.system > 0 {
        let _ = write!(out, " | shared system prompt of {} tokens", s.system);
    }
    if s.turns > 1 {
        let _ = write!(out, " | conversations of {} turns, think time exp:{}s", s.turns, s.think_s);
    }
    let _ = write!(out, " | prefix caching {}", if cfg.sched.enable_prefix_caching { "on" } else { "off" });
    out
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// Tables, one per load (plain text, or Markdown).
pub fn tables(lines: &[SummaryLine], markdown: bool) -> String {
    let head = [
        "policy",
        "smooth goodput (95% CI)",
        "of ceiling",
        "benefit/req",
        "rejected",
        "dropped",
        "abandoned",
        "wasted work",
        "out tok/s",
        "goodput req/s",
        "TTFT p99 served/all",
        "TPOT p50 served",
        "idle p99 served/all",
        "preempted",
    ];
    let mut out = String::new();
    let mut keys: Vec<(f64, Option<usize>)> = lines.iter().map(|l| (l.rate, l.clients)).collect();
    keys.dedup();
    for key in keys {
        let rows: Vec<&SummaryLine> = lines.iter().filter(|l| (l.rate, l.clients) == key).collect();
        let Some(first) = rows.first() else { continue };
        let title = match first.clients {
            Some(n) => format!(
                "closed loop, {n} clients: benefit per request sent (ceiling {:.1} per request, fluid model with Theta {:.1} tok/s); counted {:.0} requests",
                first.ceiling, first.theta, first.counted
            ),
            None => format!(
                "offered {:.2} req/s ({:.2}x saturation): ceiling {:.1} tok/s (Theta {:.1}); window {:.0} s, counted {:.0} requests",
                first.rate, first.load_factor, first.ceiling, first.theta, first.window_s, first.counted
            ),
        };
        let cache = if first.prefix_caching { format!(", {} of prompt tokens cached", pct(first.prefix_cache_hit_rate)) } else { String::new() };
        let _ = writeln!(out, "{}{title}; mean prompt {:.0} tokens{cache}", if markdown { "\n#### " } else { "\n" }, first.mean_prompt_len);
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|l| {
                vec![
                    l.policy.clone(),
                    format!("{:.1} ± {:.1}", l.smooth_goodput, l.smooth_goodput_ci95),
                    format!("{} ± {}", pct(l.ceiling_fraction), pct(l.ceiling_fraction_ci95)),
                    format!("{:.1} ± {:.1}", l.benefit_per_request, l.benefit_per_request_ci95),
                    pct(l.rejected_frac),
                    pct(l.dropped_frac),
                    pct(l.abandoned_frac),
                    pct(l.wasted_tokens_frac),
                    format!("{:.0}", l.output_throughput),
                    format!("{:.2}", l.request_goodput),
                    format!("{:.2}s / {:.2}s", l.ttft_p99_served, l.ttft_p99_all),
                    format!("{:.0}ms", l.tpot_p50_served * 1e3),
                    format!("{:.2}s / {:.2}s", l.idle_p99_served, l.idle_p99_all),
                    format!("{:.0}", l.preempted),
                ]
            })
            .collect();
        if markdown {
            out.push('\n');
        }
        write_table(&mut out, &head, &cells, markdown);
        out.push_str(&priority_table(&rows, markdown));
    }
    out
}

/// One table: Markdown, or plain text with right-aligned columns.
fn write_table(out: &mut String, head: &[&str], cells: &[Vec<String>], markdown: bool) {
    if markdown {
        let _ = writeln!(out, "| {} |", head.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
        for c in cells {
            let _ = writeln!(out, "| {} |", c.join(" | "));
        }
        return;
    }
    let widths: Vec<usize> = (0..head.len()).map(|i| cells.iter().map(|c| c[i].chars().count()).chain([head[i].len()]).max().unwrap_or(0)).collect();
    let row = |c: &[String]| c.iter().zip(&widths).map(|(v, w)| format!("{v:>w$}", w = *w + v.len() - v.chars().count())).collect::<Vec<_>>().join("  ");
    let _ = writeln!(out, "{}", row(&head.iter().map(|h| h.to_string()).collect::<Vec<_>>()));
    for c in cells {
        let _ = writeln!(out, "{}", row(c));
    }
}

/// The per-priority rows of one load's policies (nothing without a priority mix).
fn priority_table(rows: &[&SummaryLine], markdown: bool) -> String {
    let mut out = String::new();
    if rows.iter().all(|l| l.by_priority.is_empty()) {
        return out;
    }
    let head = ["policy", "priority", "counted", "benefit/req (weighted)", "rejected", "abandoned", "TTFT p99 all", "TPOT p50 served"];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .flat_map(|l| {
            l.by_priority.iter().map(|p| {
                vec![
                    l.policy.clone(),
                    p.priority.to_string(),
                    format!("{:.0}", p.counted),
                    format!("{:.1} ± {:.1}", p.benefit_per_request, p.benefit_per_request_ci95),
                    pct(p.rejected_frac),
                    pct(p.abandoned_frac),
                    format!("{:.2}s", p.ttft_p99_all),
                    format!("{:.0}ms", p.tpot_p50_served * 1e3),
                ]
            })
        })
        .collect();
    let _ = writeln!(out, "{}", if markdown { "\nBy priority:\n" } else { "by priority:" });
    write_table(&mut out, &head, &cells, markdown);
    out
}

/// A metric to plot: file stem, title, axis label, value, 95% half-width.
type Metric = (&'static str, &'static str, &'static str, fn(&SummaryLine) -> f64, Option<fn(&SummaryLine) -> f64>);

const METRICS: [Metric; 16] = [
    ("smooth_goodput", "Smooth goodput (window-normalised)", "benefit / s", |l| l.smooth_goodput, Some(|l| l.smooth_goodput_ci95)),
    ("ceiling_fraction", "Smooth goodput / ceiling", "fraction of the ceiling", |l| l.ceiling_fraction, Some(|l| l.ceiling_fraction_ci95)),
    ("benefit_per_request", "Benefit per counted request", "benefit / request", |l| l.benefit_per_request, Some(|l| l.benefit_per_request_ci95)),
    ("token_goodput", "Token goodput (binary SLO)", "tokens / s", |l| l.token_goodput, None),
    ("request_goodput", "Request goodput (binary SLO)", "requests / s", |l| l.request_goodput, None),
    ("output_throughput", "Output token throughput (counted)", "tokens / s", |l| l.output_throughput, None),
    ("attainment", "SLO attainment (of counted)", "fraction", |l| l.attainment_offered, None),
    ("ttft_p99", "TTFT p99 of served requests", "seconds", |l| l.ttft_p99_served, None),
    ("ttft_p99_all", "TTFT p99 over every counted request", "seconds", |l| l.ttft_p99_all, None),
    ("tpot_p50", "TPOT p50 of served requests", "seconds", |l| l.tpot_p50_served, None),
    ("idle_p99", "User idle latency p99 (served)", "seconds", |l| l.idle_p99_served, None),
    ("idle_p99_all", "User idle latency p99 over every counted request", "seconds", |l| l.idle_p99_all, None),
    ("rejected", "Rejected at admission", "share of counted", |l| l.rejected_frac, None),
    ("abandoned", "Clients who left", "share of counted", |l| l.abandoned_frac, None),
    ("wasted", "Work on clients who left", "share of work", |l| l.wasted_tokens_frac, None),
    ("preempted", "Preemptions", "count per run", |l| l.preempted, None),
];

fn chart(m: &Metric, lines: &[SummaryLine]) -> Chart {
    let (name, title, unit, value, ci) = *m;
    let closed = lines.iter().any(|l| l.clients.is_some());
    let by_load = lines.iter().all(|l| l.load_factor > 0.0);
    let x_of = |l: &SummaryLine| match l.clients {
        Some(n) => n as f64,
        None if by_load => l.load_factor,
        None => l.rate,
    };
    let mut policies: Vec<&str> = vec![];
    for l in lines {
        if !policies.contains(&l.policy.as_str()) {
            policies.push(&l.policy);
        }
    }
    let series: Vec<Line> = policies
        .iter()
        .map(|p| {
            let rows: Vec<&SummaryLine> = lines.iter().filter(|l| l.policy == *p).collect();
            Line {
                label: p.to_string(),
                points: rows.iter().map(|l| (x_of(l), value(l))).collect(),
                errors: ci.map_or(vec![], |f| rows.iter().map(|l| f(l)).collect()),
            }
        })
        .collect();
    let ceiling = match name {
        "smooth_goodput" if !closed => policies
            .first()
            .map(|p| Line::new("ceiling: min(offered tok/s, saturation)", lines.iter().filter(|l| l.policy == *p).map(|l| (x_of(l), l.ceiling)).collect())),
        "benefit_per_request" if closed => {
            policies.first().map(|p| Line::new("ceiling (fluid model)", lines.iter().filter(|l| l.policy == *p).map(|l| (x_of(l), l.ceiling)).collect()))
        }
        "ceiling_fraction" => policies.first().map(|p| Line::new("ceiling", lines.iter().filter(|l| l.policy == *p).map(|l| (x_of(l), 1.0)).collect())),
        _ => None,
    };
    Chart {
        name: name.to_string(),
        title: title.to_string(),
        x_desc: if closed {
            "clients (closed loop)".into()
        } else if by_load {
            "offered load (x saturation rate)".into()
        } else {
            "offered load (requests / s)".into()
        },
        y_desc: unit.to_string(),
        lines: series,
        threshold: None,
        ceiling,
    }
}

fn write_outputs(dir: &Path, prov: &Provenance, desc: &str, lines: &[SummaryLine], points: &[SweepPoint], cfg: &SimConfig, sat: Saturation) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let jsonl: String = lines.iter().map(|l| serde_json::to_string(l).map(|s| s + "\n")).collect::<Result<_, _>>()?;
    std::fs::write(dir.join("summary.jsonl"), jsonl)?;
    let full = serde_json::json!({
        "provenance": prov,
        "saturation": sat,
        "config": cfg.sched,
        "true_cost": cfg.true_cost,
        "noise": cfg.noise,
        "prior_error": cfg.prior_error,
        "points": points,
    });
    std::fs::write(dir.join("sweep.json"), serde_json::to_string(&full)?)?;
    let charts: Vec<Chart> = METRICS.iter().map(|m| chart(m, lines)).collect();
    for c in &charts {
        write_chart(dir, c)?;
    }
    let overview: Vec<&Chart> =
        ["smooth_goodput", "ceiling_fraction", "benefit_per_request", "output_throughput", "tpot_p50", "idle_p99_all", "rejected", "abandoned", "wasted"]
            .iter()
            .filter_map(|n| charts.iter().find(|c| c.name == *n))
            .collect();
    write_grid(dir, "overview", &overview, 3)?;
    let mut md =
        format!("# `pace sim` report: {}\n\n{}\n{desc}\n\n![overview](overview.svg)\n", lines.first().map_or("", |l| l.preset.as_str()), prov.markdown());
    md.push_str(
        "\nEach cell is the mean over seeds; `±` is the half-width of the 95% interval (Student's t). Smooth goodput is the \
         counted requests' benefit over the window, one denominator for every policy; the ceiling is `min(offered output tok/s, \
         saturated output tok/s)`. Latencies are means over seeds of each run's percentile; `all` counts every counted request \
         (one that never got a token counts its whole wait).\n",
    );
    md.push_str(&tables(lines, true));
    md.push_str("\n## Plots\n\n");
    for c in &charts {
        let _ = writeln!(md, "- {}: [SVG]({n}.svg)", c.title, n = c.name);
    }
    md.push_str("\nRaw data: `summary.jsonl` (one line per policy and load, means over seeds); every seed's run in `sweep.json` when the command is rerun (too large to commit).\n");
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn parses_flags_and_writes_json_plots_and_report() {
        let dir = std::env::temp_dir().join(format!("pace-sim-test-{}", std::process::id()));
        let cli = Cli::try_parse_from([
            "sim",
            "--preset",
            "cpu-smollm2",
            "--policies",
            "smooth,fcfs,smooth:door=0",
            "--load-factors",
            "0.5,1.5",
            "--num-requests",
            "150",
            "--seeds",
            "1,2",
            "--penalty",
            "capped:5",
            "--goodput",
            "ttft:2000",
            "--input-len",
            "16:64",
            "--output-len",
            "8:64",
            "--patience",
            "exp:20",
            "--max-tokens-rule",
            "cap:1024",
            "--out",
            dir.to_str().unwrap(),
            "--json",
        ])
        .unwrap();
        run(&cli.sim).unwrap();
        let lines = std::fs::read_to_string(dir.join("summary.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 6);
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        for key in [
            "policy",
            "rate",
            "request_throughput",
            "output_throughput",
            "request_goodput",
            "token_goodput",
            "smooth_goodput",
            "attainment",
            "ttft_p50",
            "ttft_p99",
            "tpot_p50",
            "tpot_p99",
            "idle_p99",
            "rejected",
            "dropped",
            "preempted",
            "saturation_rate",
            "seeds",
            "window_s",
            "counted",
            "smooth_goodput_ci95",
            "benefit_per_request",
            "ceiling",
            "ceiling_fraction",
            "rejected_frac",
            "dropped_frac",
            "abandoned_frac",
            "wasted_tokens_frac",
            "idle_p99_served",
            "idle_p99_all",
            "ttft_p99_all",
            "tpot_p50_served",
            "door_returns",
            "overloaded_frac",
        ] {
            assert!(first.get(key).is_some(), "missing {key}");
        }
        assert_eq!(first["seeds"], serde_json::json!([1, 2]));
        let svg = std::fs::read_to_string(dir.join("smooth_goodput.svg")).unwrap();
        assert!(svg.contains("<svg") && svg.contains("smooth:door=0") && svg.contains("ceiling"));
        assert!(dir.join("overview.svg").exists() && !dir.join("overview.png").exists());
        let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(report.contains("| policy |") && report.contains("- Commit:") && report.contains("- Command:"));
        std::fs::remove_dir_all(&dir).ok();

        let closed =
            Cli::try_parse_from(["sim", "--preset", "cpu-smollm2", "--policies", "fcfs", "--clients", "2,8", "--num-requests", "60", "--seed", "3"]).unwrap();
        run(&closed.sim).unwrap();

        // A priority mix: per-priority rows in the JSON and the report; ablated constants by name.
        let dir = std::env::temp_dir().join(format!("pace-sim-test-prio-{}", std::process::id()));
        let mix = Cli::try_parse_from([
            "sim",
            "--preset",
            "cpu-smollm2",
            "--policies",
            "smooth:max_loss=0.05,fcfs",
            "--load-factors",
            "1.5",
            "--num-requests",
            "200",
            "--seed",
            "1",
            "--priority-mix",
            "0.25:-2",
            "--out",
            dir.to_str().unwrap(),
            "--json",
        ])
        .unwrap();
        run(&mix.sim).unwrap();
        let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(dir.join("summary.jsonl")).unwrap().lines().next().unwrap()).unwrap();
        assert_eq!(line["policy"], "smooth:max_loss=0.05");
        assert_eq!(line["priority_mix"], "0.25:-2");
        let prios: Vec<i64> = line["by_priority"].as_array().unwrap().iter().map(|p| p["priority"].as_i64().unwrap()).collect();
        assert_eq!(prios, vec![-2, 0]);
        let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(report.contains("By priority:") && report.contains("priority mix 0.25:-2"), "{report}");
        std::fs::remove_dir_all(&dir).ok();
        // A fleet: every policy behind every router, labelled so, and the saturation scaled.
        let dir = std::env::temp_dir().join(format!("pace-sim-test-fleet-{}", std::process::id()));
        let cli = Cli::try_parse_from([
            "sim",
            "--preset",
            "cpu-smollm2",
            "--policies",
            "fcfs",
            "--replicas",
            "3",
            "--routers",
            "round-robin,predicted-wait",
            "--load-factors",
            "1",
            "--num-requests",
            "300",
            "--seed",
            "1",
            "--out",
            dir.to_str().unwrap(),
            "--json",
        ])
        .unwrap();
        run(&cli.sim).unwrap();
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(dir.join("summary.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let names: Vec<&str> = lines.iter().map(|l| l["policy"].as_str().unwrap()).collect();
        assert_eq!(names, ["fcfs @ round-robin", "fcfs @ predicted-wait"]);
        let s = setup(&cli.sim).unwrap();
        let one = saturation(&s.cfg, &s.workload, &s.client, 0, 1).rate;
        let three = lines[0]["saturation_rate"].as_f64().unwrap();
        assert!(three > 2.5 * one && three < 3.5 * one, "{three} vs {one}");
        assert!(std::fs::read_to_string(dir.join("report.md")).unwrap().contains("x 3 replicas behind a router"));
        std::fs::remove_dir_all(&dir).ok();
        assert!(Cli::try_parse_from(["sim", "--routers", "random"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--replicas", "0"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--preset", "tpu"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--rates", "1", "--load-factors", "1"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--clients", "4", "--rates", "1"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--seed", "1", "--seeds", "1,2"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--policies", "lifo"]).is_err());
        for bad in [
            ["--patience", "exp:0"],
            ["--max-tokens-rule", "cap:0"],
            ["--warmup-fraction", "0.9"],
            ["--priority-mix", "1.5:-2"],
            ["--priority-mix", "0.2:11"],
            ["--priority-mix", "0.2"],
            ["--router-poll", "nan"],
        ] {
            let cli = Cli::try_parse_from(["sim", "--preset", "cpu-smollm2", bad[0], bad[1], "--num-requests", "10"]).unwrap();
            assert!(run(&cli.sim).is_err(), "{bad:?}");
        }
        assert!(parse_lengths("0").is_err() && parse_lengths("9:3").is_err());
        assert_eq!(parse_arrivals("gamma:2").unwrap(), Arrivals::Gamma { cv: 2.0 });
    }
}
