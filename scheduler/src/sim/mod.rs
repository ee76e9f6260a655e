//! The discrete-event simulator behind `pace sim`.
//!
//! It drives the real [`Scheduler`] and policies with a virtual clock: arrivals are added at
//! their arrival time, each planned step lasts what the preset's "true" cost model (plus optional
//! log-normal noise) says for the plan's [`StepShape`], the step's sampled tokens are delivered at
//! its end, and the measured duration is fed back to the scheduler's own cost model. The model
//! never produces a stop token: every request generates its `output_len` tokens (`ignore_eos`).
//!
//! Metrics are [`crate::slo`]'s, over the whole run: from the first arrival to the last request's
//! end, as `vllm bench serve` measures a run.

pub mod preset;
pub mod workload;

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

use crate::cost::{CostCoeffs, StepShape};
use crate::plan::{SampledToken, StepOutput};
use crate::policy::Policy;
use crate::request::{Event, FinishReason, NewRequest};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
use crate::slo::{Outcome, RequestRecord, WindowStats};
pub use preset::{preset, presets, Preset, PRESET_NAMES};
pub use workload::{Arrivals, LengthSource, Lengths, SimRequest, WorkloadSpec};

/// How a simulation runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// The scheduler's configuration.
    pub sched: SchedulerConfig,
    /// True step cost.
    pub true_cost: CostCoeffs,
    /// Relative standard deviation of step durations (log-normal, mean 1); 0 for none.
    pub noise: f64,
    /// Seed of the noise.
    pub seed: u64,
}

impl SimConfig {
    /// The preset's configuration, no noise.
    pub fn from_preset(p: &Preset) -> Self {
        Self { sched: p.config.clone(), true_cost: p.true_cost, noise: 0.0, seed: 0 }
    }
}

/// What a simulation produced.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// One record per request, in request order (rejected ones included).
    pub records: Vec<RequestRecord>,
    /// The scheduler's counters at the end.
    pub stats: SchedulerStats,
    /// Steps run.
    pub steps: u64,
    /// First arrival.
    pub start: f64,
    /// Last request's end.
    pub end: f64,
}

impl SimResult {
    /// Metrics over the whole run.
    pub fn window(&self, cfg: &SchedulerConfig) -> WindowStats {
        WindowStats::compute(&self.records, self.start, self.end, &cfg.slo)
    }
}

/// A simulation stopped because nothing could run and nothing would arrive.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("simulation stalled at t={time:.3}s with {unfinished} unfinished requests and an empty plan")]
pub struct Stalled {
    /// Virtual time.
    pub time: f64,
    /// Requests still waiting or running.
    pub unfinished: usize,
}

/// Simulate `requests` (sorted by arrival) under `policy`.
pub fn simulate(cfg: &SimConfig, policy: Box<dyn Policy>, requests: &[SimRequest]) -> Result<SimResult, Stalled> {
    let mut sched = Scheduler::new(cfg.sched.clone(), policy);
    let class = cfg.sched.slo.default_class;
    let mut records: Vec<RequestRecord> = requests
        .iter()
        .map(|r| RequestRecord { arrival: r.arrival, token_times: Vec::new(), outcome: Outcome::Completed, end: r.arrival, class })
        .collect();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let noise = (cfg.noise > 0.0).then(|| {
        let sigma = (1.0 + cfg.noise * cfg.noise).ln().sqrt();
        LogNormal::new(-sigma * sigma / 2.0, sigma).expect("finite sigma")
    });
    let mut t = requests.first().map_or(0.0, |r| r.arrival);
    let mut next = 0;
    let mut steps = 0;
    let mut plan = crate::plan::BatchPlan::default();
    let mut out = StepOutput::default();
    loop {
        while next < requests.len() && requests[next].arrival <= t {
            let r = &requests[next];
            let req = NewRequest {
                id: next as u64,
                prompt: vec![1; r.prompt_len],
                max_tokens: r.output_len,
                min_tokens: 0,
                stop_token_ids: Vec::new(),
                arrival: r.arrival,
                class: None,
            };
            if sched.add(req, r.arrival).is_err() {
                records[next].outcome = Outcome::Rejected;
            }
            next += 1;
        }
        if !sched.has_unfinished() {
            match requests.get(next) {
                Some(r) => {
                    t = r.arrival;
                    continue;
                }
                None => break,
            }
        }
        sched.schedule_into(t, &mut plan);
        if plan.is_empty() {
            let events = sched.update(&plan, &StepOutput::default(), t);
            record(&mut records, &events);
            match requests.get(next) {
                Some(r) => t = t.max(r.arrival),
                None if sched.has_unfinished() => {
                    let s = sched.stats();
                    return Err(Stalled { time: t, unfinished: s.running + s.waiting });
                }
                None => {}
            }
            continue;
        }
        let shape = StepShape::of(&plan);
        let mut dur = cfg.true_cost.predict(&shape);
        if let Some(n) = &noise {
            dur *= n.sample(&mut rng);
        }
        t += dur;
        steps += 1;
        out.sampled.clear();
        out.sampled.extend(
            plan.seqs
                .iter()
                .filter(|s| s.sample)
                .map(|s| SampledToken { id: s.id, token: 1, logprob: None, top_logprobs: Vec::new() }),
        );
        let events = sched.update(&plan, &out, t);
        sched.observe_step(&shape, dur);
        record(&mut records, &events);
    }
    let start = records.iter().map(|r| r.arrival).fold(f64::INFINITY, f64::min);
    let end = records.iter().map(|r| r.end).fold(f64::NEG_INFINITY, f64::max);
    Ok(SimResult { records, stats: sched.stats(), steps, start: start.min(end), end })
}

fn record(records: &mut [RequestRecord], events: &[Event]) {
    for e in events {
        match *e {
            Event::Token { id, time, .. } => records[id as usize].token_times.push(time),
            Event::Finished { id, reason, time, .. } => {
                let r = &mut records[id as usize];
                r.end = time;
                r.outcome = match reason {
                    FinishReason::Stop | FinishReason::Length => Outcome::Completed,
                    FinishReason::Abort => Outcome::Aborted,
                    FinishReason::Dropped => Outcome::Dropped,
                    FinishReason::Rejected => Outcome::Rejected,
                    FinishReason::Error => Outcome::Failed,
                };
            }
        }
    }
}

/// The request rate a preset sustains on a workload under fcfs: `num` requests (at least four
/// batches' worth) arrive at once, and the completion rate between the first and the third
/// quartile of completions is the saturation rate, which leaves out the start-up ramp, the first
/// wave of a full batch finishing together, and the drain.
pub fn saturation_rate(cfg: &SimConfig, workload: &WorkloadSpec, num: usize, seed: u64) -> f64 {
    let num = num.max(4 * cfg.sched.max_num_seqs).max(40);
    let reqs = workload.generate(f64::INFINITY, num, seed);
    let mut sat_cfg = cfg.clone();
    sat_cfg.sched.max_queue_requests = usize::MAX;
    sat_cfg.sched.max_queue_tokens = usize::MAX;
    let policy = crate::policy::by_name("fcfs").expect("fcfs exists");
    let Ok(res) = simulate(&sat_cfg, policy, &reqs) else { return 0.0 };
    let mut ends: Vec<f64> = res.records.iter().map(|r| r.end).collect();
    ends.sort_unstable_by(f64::total_cmp);
    let (lo, hi) = (ends.len() / 4, ends.len() * 3 / 4);
    (hi - lo) as f64 / (ends[hi] - ends[lo]).max(1e-9)
}

/// One point of a sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Policy name.
    pub policy: String,
    /// Offered request rate, per second.
    pub rate: f64,
    /// `rate / saturation_rate`.
    pub load_factor: f64,
    /// The preset's estimated saturation rate.
    pub saturation_rate: f64,
    /// Metrics over the run.
    pub stats: WindowStats,
    /// Preemptions.
    pub preempted: u64,
    /// Steps simulated.
    pub steps: u64,
}

/// Run every policy at every rate on the same seeded workload.
pub fn sweep(
    cfg: &SimConfig,
    workload: &WorkloadSpec,
    policies: &[&str],
    rates: &[f64],
    num_requests: usize,
    seed: u64,
    saturation: f64,
) -> Result<Vec<SweepPoint>, Stalled> {
    let mut points = Vec::new();
    for &rate in rates {
        let reqs = workload.generate(rate, num_requests, seed);
        for name in policies {
            let Some(policy) = crate::policy::by_name(name) else { continue };
            let res = simulate(cfg, policy, &reqs)?;
            points.push(SweepPoint {
                policy: name.to_string(),
                rate,
                load_factor: if saturation > 0.0 { rate / saturation } else { 0.0 },
                saturation_rate: saturation,
                stats: res.window(&cfg.sched),
                preempted: res.stats.preemptions,
                steps: res.steps,
            });
        }
    }
    Ok(points)
}
