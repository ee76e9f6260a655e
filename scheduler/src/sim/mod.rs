//! The discrete-event simulator behind `pace sim`.
//!
//! It drives the real [`Scheduler`] and policies with a virtual clock, and measures them as
//! `../shared/docs/evaluation.md` says a scheduler must be measured:
//!
//! - **Steady state with a measurement window.** Arrivals continue for the whole run; only the
//!   requests that arrive inside `[T_warmup, T_end]` (fractions of the arrival span) are
//!   counted, and the run lasts until every counted request has ended. Smooth goodput is the
//!   counted benefit over the window's length, the same denominator for every policy. A closed
//!   loop (`clients`) counts requests by their place in the sequence instead, and is scored per
//!   request sent.
//! - **No length oracle.** A request's true output length is an end-of-sequence token the
//!   scheduler cannot foresee; the client sends `max_tokens` by its own rule ([`ClientModel`]).
//! - **Clients with patience.** A client leaves when its idle latency reaches its patience: an
//!   abort at that moment (`d_{n+1} + patience`), seen by the scheduler at the next step
//!   boundary, as a server sees a disconnect. Tokens of the step during which it left are lost.
//! - **Noisy steps and a wrong prior.** Each step lasts what the preset's true cost model says
//!   for the plan's [`StepShape`], times log-normal noise; the scheduler starts from a prior whose
//!   coefficients are off by seeded factors, and refits on the measured (noisy) durations.
//!
//! - **Replicas behind a router** ([`Fleet`], [`run_fleet`]): each replica is its own scheduler
//!   with its own step clock; the router picks one for each request (and each retry) as the
//!   replicas stand when it arrives ([`Router`]: round-robin, least-queue, predicted-wait).
//!
//! Metrics are [`crate::slo`]'s.

mod fleet;
pub mod preset;
pub mod replay;
pub mod workload;

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

use crate::cost::{CostCoeffs, StepShape};
use crate::plan::{SampledToken, StepOutput};
use crate::policy::Policy;
use crate::request::{Event, FinishReason, NewRequest};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
use crate::slo::{
    ceiling, ceiling_fraction, delivered_rate, mean_ci95, measurement_window, weighted_ceiling, Outcome, RequestRecord, SloClass, SloParams, WindowStats,
};
pub use fleet::{Fleet, Router};
use fleet::{Replica, RouterState};
pub use preset::{preset, presets, Preset, PRESET_NAMES};
pub use workload::{Arrivals, ClientModel, LengthSource, Lengths, PriorityMix, Retries, Retry, Sharing, SimRequest, Turn, WorkloadSpec};
use workload::{IMMEDIATE_RETRY_S, MAX_RETRY_AFTER_S};

/// The token id simulated outputs end with.
const EOS: u32 = 2;

/// How a simulation runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// The scheduler's configuration (its `cost_prior` is what the prior error scales).
    pub sched: SchedulerConfig,
    /// True step cost.
    pub true_cost: CostCoeffs,
    /// Relative standard deviation of step durations (log-normal, mean 1); 0 for none.
    pub noise: f64,
    /// Step durations replayed from measured steps instead of `true_cost` and `noise`.
    pub replay: Option<std::sync::Arc<replay::StepTable>>,
    /// Each coefficient of the scheduler's prior is scaled by `(1 + prior_error)^u`, `u` uniform
    /// in `[-1, 1]` from the seed; 0 leaves the prior as configured.
    pub prior_error: f64,
    /// Seed of the noise and of the prior's error.
    pub seed: u64,
    /// Start of the measurement window, fraction of the arrival span (or of the requests of a
    /// closed loop).
    pub warmup_fraction: f64,
    /// End of the measurement window, same unit.
    pub window_end_fraction: f64,
    /// Replicas and their router ([`sweep`] runs `fleet.replicas` of each policy; [`run`]
    /// one).
    pub fleet: Fleet,
}

impl SimConfig {
    /// The preset's configuration: the standard window (10% to 80%), no noise, the true prior.
    pub fn from_preset(p: &Preset) -> Self {
        Self {
            sched: p.config.clone(),
            true_cost: p.true_cost,
            noise: 0.0,
            replay: None,
            prior_error: 0.0,
            seed: 0,
            warmup_fraction: 0.1,
            window_end_fraction: 0.8,
            fleet: Fleet::default(),
        }
    }

    /// The preset with evaluation.md's noise (point 5): 5% step noise on the preset's cost
    /// model and a prior 30% off. (`pace sim` replays measured steps by default instead,
    /// `--step-times`; the tests keep the model, whose behaviour they can reason about.)
    pub fn published(p: &Preset) -> Self {
        Self { noise: 0.05, prior_error: 0.3, ..Self::from_preset(p) }
    }

    /// The cost model the scheduler starts from: the configured prior, each coefficient scaled
    /// by a seeded factor in `[1 / (1 + e), 1 + e]`.
    pub fn scheduler_prior(&self) -> CostCoeffs {
        let c = self.sched.cost_prior;
        if self.prior_error <= 0.0 {
            return c;
        }
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x9a10_e77e_0000_0003);
        let mut f = || (1.0 + self.prior_error).powf(rng.random_range(-1.0..=1.0));
        CostCoeffs {
            base_s: c.base_s * f(),
            per_prefill_token_s: c.per_prefill_token_s * f(),
            per_decode_seq_s: c.per_decode_seq_s * f(),
            per_kv_token_s: c.per_kv_token_s * f(),
            per_attn_pair_s: c.per_attn_pair_s * f(),
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// At the requests' own arrival times.
    Open,
    /// A fixed population of clients: each sends its next request the moment its last one ends
    /// (completed, rejected, dropped or abandoned). The requests' arrival fields are ignored.
    Closed {
        /// Clients.
        clients: usize,
    },
}

/// What a simulation produced.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// One record per request sent, in request order (requests the run stopped before sending
    /// have none). Requests still unfinished when the run stopped (after the last counted request
    /// ended) are `Aborted` at the stop time; none is counted.
    pub records: Vec<RequestRecord>,
    /// The requests sent (closed loops: with the arrival times the clients sent them at).
    pub requests: Vec<SimRequest>,
    /// Tokens fed to the model for each request (prefill chunks, decodes, recomputes).
    pub work: Vec<usize>,
    /// The replica each request was last routed to (all 0 for one server).
    pub replica: Vec<usize>,
    /// Counted requests: indices `counted.0..counted.1`.
    pub counted: (usize, usize),
    /// The measurement window, seconds: arrivals in it are counted (open loop); closed loops and
    /// runs too small for a window: the first counted send to the last counted end.
    pub window: (f64, f64),
    /// The scheduler's counters at the end.
    pub stats: SchedulerStats,
    /// Steps run.
    pub steps: u64,
    /// First arrival.
    pub start: f64,
    /// When the run stopped.
    pub end: f64,
}

/// The counted requests of one run, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Every aggregate over the counted requests and the window.
    pub stats: WindowStats,
    /// Output tokens the counted requests would produce if served to the end, per second of
    /// the window: the offered output rate.
    pub offered_output_tps: f64,
    /// Mean of `min(true length, max_tokens)` over the counted requests.
    pub mean_served_len: f64,
    /// Output tokens delivered to any request during the window, per second: the engine's
    /// actual output rate ([`crate::slo::delivered_rate`]).
    pub delivered_tps: f64,
    /// Work (tokens fed) spent on counted requests whose client left, over the work spent on
    /// all counted requests.
    pub wasted_tokens_frac: f64,
    /// Preemptions in the whole run.
    pub preempted: u64,
    /// Arrivals smooth's door took for clients answering a refusal (not new demand), whole run
    /// (0 for a policy without a door).
    #[serde(default)]
    pub door_returns: u64,
    /// Arrivals smooth's door judged under sustained overload over the arrivals it judged,
    /// whole run (0 as above).
    #[serde(default)]
    pub overloaded_frac: f64,
    /// Steps in the whole run.
    pub steps: u64,
    /// The offered output rate by class weight, heaviest first: (weight, output tokens per
    /// second of the window). One entry when every request weighs the same.
    #[serde(default)]
    pub offered_by_weight: Vec<(f64, f64)>,
    /// The counted requests of each priority over the same window, when they do not all have
    /// the same one (a priority mix): (priority, stats), most important first.
    #[serde(default)]
    pub by_priority: Vec<(i64, WindowStats)>,
    /// Mean prompt tokens of the counted requests (system prompt and history included).
    #[serde(default)]
    pub mean_prompt_len: f64,
    /// Prompt tokens found in the prefix cache over prompt tokens looked up, whole run (0
    /// with caching off).
    #[serde(default)]
    pub prefix_cache_hit_frac: f64,
}

impl SimResult {
    /// Metrics over the whole run (first arrival to last end, every request), as `vllm bench
    /// serve` measures a run: for tests of the metric itself, never for comparing policies.
    pub fn whole_run(&self, cfg: &SchedulerConfig) -> WindowStats {
        WindowStats::compute(&self.records, self.start, self.end, &cfg.slo)
    }

    /// The counted requests over the measurement window.
    pub fn evaluate(&self, params: &SloParams) -> Evaluation {
        let (lo, hi) = self.counted;
        let window_s = (self.window.1 - self.window.0).max(0.0);
        let stats = WindowStats::aggregate(&self.records[lo..hi], window_s, params);
        let served: usize = self.requests[lo..hi].iter().map(SimRequest::served_len).sum();
        let work_all: usize = self.work[lo..hi].iter().sum();
        let work_left: usize = (lo..hi).filter(|&i| self.records[i].outcome == Outcome::Abandoned).map(|i| self.work[i]).sum();
        let per_s = |tokens: usize| if window_s > 0.0 { tokens as f64 / window_s } else { 0.0 };
        let mut priorities: Vec<i64> = self.requests[lo..hi].iter().map(|r| r.priority).collect();
        priorities.sort_unstable();
        priorities.dedup();
        let mut offered_by_weight: Vec<(f64, f64)> = priorities
            .iter()
            .map(|&p| {
                let tokens = (lo..hi).filter(|&i| self.requests[i].priority == p).map(|i| self.requests[i].served_len()).sum();
                (params.default_class.weight * SloClass::priority_weight(p), per_s(tokens))
            })
            .collect();
        offered_by_weight.sort_by(|a, b| b.0.total_cmp(&a.0));
        let by_priority = if priorities.len() > 1 {
            priorities
                .iter()
                .map(|&p| {
                    let recs: Vec<RequestRecord> = (lo..hi).filter(|&i| self.requests[i].priority == p).map(|i| self.records[i].clone()).collect();
                    (p, WindowStats::aggregate(&recs, window_s, params))
                })
                .collect()
        } else {
            Vec::new()
        };
        Evaluation {
            stats,
            offered_output_tps: per_s(served),
            mean_served_len: served as f64 / (hi - lo).max(1) as f64,
            delivered_tps: delivered_rate(&self.records, self.window.0, self.window.1),
            wasted_tokens_frac: if work_all > 0 { work_left as f64 / work_all as f64 } else { 0.0 },
            preempted: self.stats.preemptions,
            door_returns: self.stats.door.map_or(0, |b| b.returns),
            overloaded_frac: self.stats.door.map_or(0.0, |b| b.overloaded_arrivals as f64 / b.arrivals.max(1) as f64),
            steps: self.steps,
            offered_by_weight,
            by_priority,
            mean_prompt_len: self.requests[lo..hi].iter().map(|r| r.prompt_len as f64).sum::<f64>() / (hi - lo).max(1) as f64,
            prefix_cache_hit_frac: if self.stats.prefix_cache_queries > 0 {
                self.stats.prefix_cache_hits as f64 / self.stats.prefix_cache_queries as f64
            } else {
                0.0
            },
        }
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

/// An `f64` time with a total order, for heaps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct At(f64);

impl Eq for At {}

impl PartialOrd for At {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for At {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Simulate `requests` (sorted by arrival) under `policy`, open loop.
pub fn simulate(cfg: &SimConfig, policy: Box<dyn Policy>, requests: &[SimRequest]) -> Result<SimResult, Stalled> {
    run(cfg, policy, requests, Mode::Open)
}

/// Per-request bookkeeping of a run.
struct Book {
    records: Vec<RequestRecord>,
    ended: Vec<bool>,
    delivered: Vec<usize>,
    /// The replica each request was last routed to.
    home: Vec<usize>,
    /// Departures of impatient clients: (time, request, tokens delivered when it was set).
    departures: BinaryHeap<Reverse<(At, usize, usize)>>,
    /// Readers who stop on time ([`SimRequest::stop_after`]): (time, request).
    stops: BinaryHeap<Reverse<(At, usize)>>,
    /// Refused requests that their clients send again: (time, request).
    retries: BinaryHeap<Reverse<(At, usize)>>,
    /// Retries each request has used.
    attempts: Vec<u32>,
    /// Each request's idle latency so far (its largest lateness), seconds.
    late: Vec<f64>,
    /// Closed loop: when each client is next free to send.
    free: BinaryHeap<Reverse<At>>,
    counted: (usize, usize),
    counted_left: usize,
    closed: bool,
}

impl Book {
    /// Ends request `i` at `time`; in a closed loop its client sends again then.
    fn end(&mut self, i: usize, outcome: Outcome, time: f64) {
        if self.ended[i] {
            return;
        }
        self.ended[i] = true;
        self.records[i].outcome = outcome;
        self.records[i].end = time;
        if (self.counted.0..self.counted.1).contains(&i) {
            self.counted_left -= 1;
        }
        if self.closed {
            self.free.push(Reverse(At(time)));
        }
    }

    /// Applies a step's events: tokens extend the timelines (and move the client's departure),
    /// and finishes end their requests.
    fn apply(&mut self, events: &[Event], reqs: &[SimRequest]) {
        for e in events {
            match *e {
                Event::Token { id, time, .. } => {
                    let i = id as usize;
                    self.records[i].token_times.push(time);
                    self.delivered[i] += 1;
                    let class = self.records[i].class;
                    let n = self.delivered[i];
                    self.late[i] = self.late[i].max(time - class.deadline(reqs[i].arrival, n));
                    if reqs[i].stop_after == Some(n) {
                        // The reader stops once it has read the n-th token: at its deadline, or
                        // as late as it has been kept waiting.
                        self.stops.push(Reverse((At(time.max(class.deadline(reqs[i].arrival, n) + self.late[i])), i)));
                    }
                    let p = reqs[i].patience;
                    if p.is_finite() {
                        let at = self.records[i].class.departure(reqs[i].arrival, self.delivered[i], p);
                        self.departures.push(Reverse((At(at), i, self.delivered[i])));
                    }
                }
                Event::Finished { id, reason, time, .. } => {
                    let outcome = match reason {
                        FinishReason::Stop | FinishReason::Length => Outcome::Completed,
                        // The simulator's only aborts are clients that left (see `leave`).
                        FinishReason::Abort => Outcome::Abandoned,
                        FinishReason::Dropped => Outcome::Dropped,
                        FinishReason::Rejected => Outcome::Rejected,
                        FinishReason::Error => Outcome::Failed,
                    };
                    self.end(id as usize, outcome, time);
                }
            }
        }
    }

    /// Aborts every request whose client left by `now`, at the moment it left.
    fn leave(&mut self, reps: &mut [Replica], now: f64) {
        while let Some(&Reverse((At(at), i, n))) = self.departures.peek() {
            if at > now {
                break;
            }
            self.departures.pop();
            if self.ended[i] || self.delivered[i] != n {
                continue;
            }
            if reps[self.home[i]].sched.abort(i as u64, at).is_some() {
                self.end(i, Outcome::Abandoned, at);
            }
        }
    }

    /// Aborts every stream whose reader stopped by `now` (on time: it ends as completed, with
    /// what it got).
    fn stop(&mut self, reps: &mut [Replica], now: f64) {
        while let Some(&Reverse((At(at), i))) = self.stops.peek() {
            if at > now {
                break;
            }
            self.stops.pop();
            if !self.ended[i] && reps[self.home[i]].sched.abort(i as u64, at).is_some() {
                self.end(i, Outcome::Completed, at);
            }
        }
    }

    /// The next moment a client leaves or a reader stops.
    fn next_departure(&self) -> Option<f64> {
        let leave = self.departures.peek().map(|d| d.0 .0 .0);
        let stop = self.stops.peek().map(|d| d.0 .0 .0);
        leave.into_iter().chain(stop).reduce(f64::min)
    }

    /// Whether every counted request has ended (and every one before it was sent).
    fn done(&self, sent: usize) -> bool {
        self.counted_left == 0 && sent >= self.counted.1
    }

    /// A closed loop's or a burst's window: from the first counted send to the last counted end
    /// (the sends of the counted requests and of the next one can all fall at time 0 when there
    /// are more clients than counted requests).
    fn span_window(&self, now: f64) -> (f64, f64) {
        let (lo, hi) = self.counted;
        let first = self.records[lo..hi].iter().map(|r| r.arrival).fold(f64::INFINITY, f64::min);
        let last = self.records[lo..hi].iter().map(|r| r.end).fold(f64::NEG_INFINITY, f64::max);
        if hi > lo {
            (first, last.max(first))
        } else {
            (now, now)
        }
    }

    fn next_retry(&self) -> Option<f64> {
        self.retries.peek().map(|d| d.0 .0 .0)
    }

    /// Sends request `i` at `at` (its first time or a retry; the user's clock runs from its first
    /// arrival): a refusal is retried as its client does, or ends it.
    fn send(&mut self, sched: &mut Scheduler, reqs: &[SimRequest], i: usize, at: f64) {
        let r = &reqs[i];
        let class = self.records[i].class;
        let req = NewRequest {
            id: i as u64,
            prompt: r.prompt_tokens(i),
            max_tokens: r.max_tokens,
            min_tokens: 0,
            stop_token_ids: vec![EOS],
            arrival: at,
            class: (r.priority != 0 || r.reading_rate.is_some()).then_some(class),
            cache_salt: None,
        };
        let give_up = if r.patience.is_finite() { class.departure(r.arrival, 0, r.patience) } else { f64::INFINITY };
        match sched.add(req, at) {
            Err(rej) => {
                let wait = if r.retry.honours_retry_after { rej.retry_after_s.clamp(0.0, MAX_RETRY_AFTER_S) } else { IMMEDIATE_RETRY_S };
                if self.attempts[i] < r.retry.max && at + wait < give_up {
                    self.attempts[i] += 1;
                    self.retries.push(Reverse((At(at + wait), i)));
                } else {
                    self.end(i, Outcome::Rejected, at);
                }
            }
            Ok(()) if give_up.is_finite() => self.departures.push(Reverse((At(give_up), i, 0))),
            Ok(()) => {}
        }
    }
}

/// Simulate `requests` under `policy` with the arrivals `mode` says, on one replica.
pub fn run(cfg: &SimConfig, policy: Box<dyn Policy>, requests: &[SimRequest], mode: Mode) -> Result<SimResult, Stalled> {
    run_fleet(cfg, vec![policy], requests, mode)
}

/// Simulate `requests` with the arrivals `mode` says on one replica per policy (each its own
/// scheduler, cost model and step clock), behind `cfg.fleet.router`. Clients see one server:
/// a refused request is retried through the router, so it may land elsewhere.
pub fn run_fleet(cfg: &SimConfig, policies: Vec<Box<dyn Policy>>, requests: &[SimRequest], mode: Mode) -> Result<SimResult, Stalled> {
    let mut sched_cfg = cfg.sched.clone();
    sched_cfg.cost_prior = cfg.scheduler_prior();
    let mut reps: Vec<Replica> = policies
        .into_iter()
        .map(|p| Replica {
            sched: Scheduler::new(sched_cfg.clone(), p),
            next: f64::INFINITY,
            plan: crate::plan::BatchPlan::default(),
            step: None,
            retries_in: Vec::new(),
            arrivals_in: Vec::new(),
        })
        .collect();
    assert!(!reps.is_empty(), "a run needs at least one replica");
    let class = cfg.sched.slo.default_class;
    // A request's class: the default, weighed by its priority as the server does, at the reading
    // rate its client declares.
    let class_of = |r: &SimRequest| SloClass {
        weight: class.weight * SloClass::priority_weight(r.priority),
        reading_rate: r.reading_rate.unwrap_or(class.reading_rate),
        ..class
    };
    let m = requests.len();
    let mut reqs = requests.to_vec();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let noise = (cfg.noise > 0.0).then(|| {
        let sigma = (1.0 + cfg.noise * cfg.noise).ln().sqrt();
        LogNormal::new(-sigma * sigma / 2.0, sigma).expect("finite sigma")
    });

    // What is counted: an index range. Open loop: the arrivals inside the window (requests are
    // sorted by arrival). Closed loop: a share of the sequence of requests.
    // A window that holds no request (a handful of requests, all arriving at once) counts them
    // all, from the first arrival to the last end, as a burst is measured.
    let frac_index = |f: f64| ((f * m as f64).floor() as usize).min(m);
    let (mut counted, mut window) = match mode {
        Mode::Open => {
            let (first, last) = (reqs.first().map_or(0.0, |r| r.arrival), reqs.last().map_or(0.0, |r| r.arrival));
            let (w0, w1) = measurement_window(first, last, cfg.warmup_fraction, cfg.window_end_fraction);
            let lo = reqs.partition_point(|r| r.arrival < w0);
            let hi = reqs.partition_point(|r| r.arrival <= w1);
            ((lo, hi.max(lo)), (w0, w1))
        }
        Mode::Closed { .. } => ((frac_index(cfg.warmup_fraction), frac_index(cfg.window_end_fraction)), (0.0, 0.0)),
    };
    let burst = counted.1 <= counted.0 || (mode == Mode::Open && window.1 <= window.0);
    if burst {
        counted = (0, m);
    }
    let mut book = Book {
        records: reqs
            .iter()
            .map(|r| RequestRecord { arrival: r.arrival, token_times: Vec::new(), outcome: Outcome::Completed, end: r.arrival, class: class_of(r) })
            .collect(),
        ended: vec![false; m],
        delivered: vec![0; m],
        home: vec![0; m],
        departures: BinaryHeap::new(),
        stops: BinaryHeap::new(),
        retries: BinaryHeap::new(),
        attempts: vec![0; m],
        late: vec![0.0; m],
        free: BinaryHeap::new(),
        counted,
        counted_left: counted.1 - counted.0,
        closed: matches!(mode, Mode::Closed { .. }),
    };
    if let Mode::Closed { clients } = mode {
        for _ in 0..clients.max(1) {
            book.free.push(Reverse(At(0.0)));
        }
    }
    let mut work = vec![0usize; m];
    let mut t = match mode {
        Mode::Open => reqs.first().map_or(0.0, |r| r.arrival),
        Mode::Closed { .. } => 0.0,
    };
    let start = t;
    let mut next = 0;
    let mut steps = 0;
    let mut router = RouterState { fleet: cfg.fleet, turn: 0, next_poll: f64::NEG_INFINITY, seen: Vec::new() };
    let mut out = StepOutput::default();
    let upcoming = |book: &Book, next: usize, reqs: &[SimRequest]| -> Option<f64> {
        match mode {
            Mode::Open => reqs.get(next).map(|r| r.arrival),
            Mode::Closed { .. } => book.free.peek().filter(|_| next < m).map(|r| r.0 .0),
        }
    };

    loop {
        if book.done(next) {
            break;
        }
        // The next thing to happen: a request reaches the router (routed at once, as the
        // replicas stand then), or a replica acts.
        let (r, at_replica) = reps.iter().enumerate().map(|(r, rep)| (r, rep.next)).min_by(|a, b| a.1.total_cmp(&b.1)).expect("a replica");
        let at_router = upcoming(&book, next, &reqs).into_iter().chain(book.next_retry()).reduce(f64::min);
        match at_router {
            Some(at) if at <= at_replica => {
                t = t.max(at);
                let retry = book.next_retry().is_some_and(|x| x <= at);
                let i = if retry {
                    book.retries.pop().map(|x| x.0 .1).expect("a retry")
                } else {
                    if book.closed {
                        book.free.pop();
                    }
                    next += 1;
                    reqs[next - 1].arrival = at;
                    book.records[next - 1].arrival = at;
                    book.records[next - 1].end = at;
                    next - 1
                };
                let to = router.route(t, &reps, &reqs);
                book.home[i] = to;
                reps[to].receive(i, at, retry, t);
                continue;
            }
            None if at_replica.is_infinite() => {
                if reps.iter().any(|rep| rep.sched.has_unfinished()) {
                    let unfinished = reps.iter().map(|rep| rep.sched.num_running() + rep.sched.num_waiting()).sum();
                    return Err(Stalled { time: t, unfinished });
                }
                break;
            }
            _ => {}
        }
        // Replica `r` acts: its step in flight ends, then what was routed to it is added, then
        // it plans its next step.
        t = t.max(at_replica);
        // Clients who left or stopped during the step never see its tokens.
        book.leave(&mut reps, t);
        book.stop(&mut reps, t);
        if let Some((shape, dur)) = reps[r].step.take() {
            let rep = &mut reps[r];
            out.sampled.clear();
            out.sampled.extend(rep.plan.seqs.iter().filter(|s| s.sample).map(|s| {
                let i = s.id as usize;
                let n = book.delivered[i];
                let token = if n + 1 >= reqs[i].output_len { EOS } else { reqs[i].output_token(i, n) };
                SampledToken { id: s.id, token, logprob: None, top_logprobs: Vec::new() }
            }));
            let events = rep.sched.update(&rep.plan, &out, t);
            rep.sched.observe_step(&shape, dur);
            book.apply(&events, &reqs);
        }
        let rep = &mut reps[r];
        for (i, at) in std::mem::take(&mut rep.retries_in).into_iter().chain(std::mem::take(&mut rep.arrivals_in)) {
            book.send(&mut rep.sched, &reqs, i, at);
        }
        // A client whose patience ran out before the request was even looked at leaves now.
        book.leave(&mut reps, t);
        book.stop(&mut reps, t);
        if book.done(next) {
            break;
        }
        let rep = &mut reps[r];
        rep.next = f64::INFINITY;
        if !rep.sched.has_unfinished() {
            continue;
        }
        rep.sched.schedule_into(t, &mut rep.plan);
        if rep.plan.is_empty() {
            let events = rep.sched.update(&rep.plan, &StepOutput::default(), t);
            book.apply(&events, &reqs);
            // Nothing to run now: look again when something happens.
            let wake = upcoming(&book, next, &reqs).into_iter().chain(book.next_departure()).chain(book.next_retry()).reduce(f64::min);
            reps[r].next = wake.map_or(f64::INFINITY, |w| w.max(t));
            continue;
        }
        let shape = StepShape::of(&rep.plan);
        let dur = match &cfg.replay {
            Some(table) => table.sample(&shape, &mut rng),
            None => cfg.true_cost.predict(&shape) * noise.as_ref().map_or(1.0, |n| n.sample(&mut rng)),
        };
        for s in &rep.plan.seqs {
            work[s.id as usize] += s.tokens.len();
        }
        rep.step = Some((shape, dur));
        rep.next = t + dur;
        steps += 1;
    }
    if book.done(next) && (book.closed || burst) {
        window = book.span_window(t);
    }
    // Requests never sent have no record; those still unfinished are cut at the stop.
    let mut records = book.records;
    records.truncate(next);
    reqs.truncate(next);
    work.truncate(next);
    let mut replica = book.home;
    replica.truncate(next);
    for (i, r) in records.iter_mut().enumerate() {
        if !book.ended[i] {
            r.outcome = Outcome::Aborted;
            r.end = t;
        }
    }
    let end = records.iter().map(|r| r.end).fold(start, f64::max);
    let mut stats = reps[0].sched.stats();
    for rep in &reps[1..] {
        stats.absorb(&rep.sched.stats());
    }
    Ok(SimResult { records, requests: reqs, work, replica, counted, window, stats, steps, start, end })
}

/// The engine's saturated throughput on a workload (evaluation.md, point 7's `Theta`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Saturation {
    /// Completed requests per second.
    pub rate: f64,
    /// Output tokens per second.
    pub output_tps: f64,
}

/// What a preset sustains on a workload under fcfs, in two runs. First `num` requests (at
/// least four batches' worth) arrive at once and the completions between the first and the
/// third quartile give a rough rate. Then `4 * num` requests arrive open-loop at twice that
/// rate, clients never leave, and the completions and output tokens delivered between 40% and
/// 90% of the arrival span (the batch full and turning over, the queue growing) give the rates.
/// The second run is the steady state the sweep's overloaded points live in; a backlog that
/// arrives at once is not (every stream starts together), and neither is the ramp while the
/// first full batch is still decoding (no prefill, so more tokens per second than later).
pub fn saturation(cfg: &SimConfig, workload: &WorkloadSpec, client: &ClientModel, num: usize, seed: u64) -> Saturation {
    let num = num.max(4 * cfg.sched.max_num_seqs).max(500);
    let client = ClientModel { patience: crate::slo::Patience::None, ..*client };
    let mut sat_cfg = cfg.clone();
    sat_cfg.sched.max_queue_requests = usize::MAX;
    sat_cfg.sched.max_queue_tokens = usize::MAX;
    sat_cfg.seed = seed;
    let fcfs = || crate::policy::by_name("fcfs").expect("fcfs exists");
    let zero = Saturation { rate: 0.0, output_tps: 0.0 };

    let mut backlog = workload.generate(f64::INFINITY, num, seed);
    client.apply(&mut backlog, seed, cfg.sched.max_model_len);
    let all = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..sat_cfg.clone() };
    let Ok(res) = simulate(&all, fcfs(), &backlog) else { return zero };
    let mut ends: Vec<f64> = res.records.iter().map(|r| r.end).collect();
    ends.sort_unstable_by(f64::total_cmp);
    let (lo, hi) = (ends.len() / 4, ends.len() * 3 / 4);
    let rough = (hi - lo) as f64 / (ends[hi] - ends[lo]).max(1e-9);

    let mut reqs = workload.generate(2.0 * rough, 4 * num, seed);
    client.apply(&mut reqs, seed, cfg.sched.max_model_len);
    let (first, last) = (reqs[0].arrival, reqs[4 * num - 1].arrival);
    let (t0, t1) = measurement_window(first, last, 0.4, 0.9);
    // The run lasts until the requests that arrived by the end of the measurement have ended, so
    // the engine is busy throughout it.
    let mid = SimConfig { warmup_fraction: 0.0, window_end_fraction: 0.9, ..sat_cfg };
    let Ok(res) = simulate(&mid, fcfs(), &reqs) else { return zero };
    let span = (t1 - t0).max(1e-9);
    let tokens: usize = res.records.iter().map(|r| r.token_times.iter().filter(|&&x| x > t0 && x <= t1).count()).sum();
    let done = res.records.iter().filter(|r| r.outcome == Outcome::Completed && r.end > t0 && r.end <= t1).count();
    Saturation { rate: done as f64 / span, output_tps: tokens as f64 / span }
}

/// The request rate a preset sustains on a workload under fcfs, with the true lengths as
/// `max_tokens` ([`saturation`]'s rate).
pub fn saturation_rate(cfg: &SimConfig, workload: &WorkloadSpec, num: usize, seed: u64) -> f64 {
    saturation(cfg, workload, &ClientModel::default(), num, seed).rate
}

/// One load of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// Open loop at this many requests per second.
    Rate(f64),
    /// A closed loop of this many clients.
    Clients(usize),
}

/// One run of a sweep point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedRun {
    /// Seed of the workload, the clients, the noise and the prior.
    pub seed: u64,
    /// The counted requests, measured.
    pub eval: Evaluation,
    /// Ceiling of this run: output tokens per second (open loop), or benefit per request
    /// (closed loop, [`closed_loop_ceiling`]).
    pub ceiling: f64,
    /// Smooth goodput (open loop) or benefit per request (closed loop) over the ceiling.
    pub ceiling_fraction: f64,
}

/// One point of a sweep: a policy at a load, every seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Policy name.
    pub policy: String,
    /// The router in front of the replicas (`cfg.fleet.replicas` of them).
    #[serde(default)]
    pub router: Router,
    /// The load.
    pub load: Load,
    /// Offered request rate, per second (0 for a closed loop).
    pub rate: f64,
    /// `rate / saturation rate` (0 for a closed loop).
    pub load_factor: f64,
    /// The preset's estimated saturation on this workload.
    pub saturation: Saturation,
    /// The ceiling's `Theta`, output tokens per second: the larger of the saturation estimate
    /// and the largest mean (over seeds) delivered output rate of any policy at the sweep's
    /// highest offered rate.
    pub theta: f64,
    /// One run per seed.
    pub runs: Vec<SeedRun>,
}

impl SweepPoint {
    /// Mean over seeds of `f`, and its 95% interval's half-width.
    pub fn mean_ci(&self, f: impl Fn(&SeedRun) -> f64) -> (f64, f64) {
        mean_ci95(&self.runs.iter().map(f).collect::<Vec<_>>())
    }

    /// Mean over seeds of `f`.
    pub fn mean(&self, f: impl Fn(&SeedRun) -> f64) -> f64 {
        self.mean_ci(f).0
    }
}

/// The closed-loop ceiling per request sent, from a fluid model: `clients` users who each send
/// again as soon as an answer of `mean_len` tokens ends, an engine that produces `theta` output
/// tokens per second. While `clients * q <= theta` every reader can be fed at its reading rate
/// and the best benefit is `mean_len`. Beyond that, the cycle of a client is at least
/// `clients * mean_len / theta` seconds while reading takes `mean_len / q`; the difference is
/// waiting no schedule avoids (queued before the first token or spread over the stream), so
/// the best benefit per request is `mean_len - alpha f(wait)`, and never below 0, since a
/// refusal scores 0. It ignores prefill time and the spread of lengths, so it is an upper bound
/// for the mean length, not a tight one.
pub fn closed_loop_ceiling(clients: usize, mean_len: f64, theta: f64, params: &SloParams) -> f64 {
    let q = params.default_class.reading_rate;
    let wait = (clients as f64 * mean_len / theta.max(f64::MIN_POSITIVE) - mean_len / q).max(0.0);
    (mean_len - params.alpha * params.penalty.apply(wait)).max(0.0)
}

/// What a sweep runs.
#[derive(Debug, Clone)]
pub struct SweepSpec<'a> {
    /// Policies, by name.
    pub policies: &'a [&'a str],
    /// Routers in front of `cfg.fleet.replicas` replicas: every policy runs behind each (none:
    /// `cfg.fleet.router`).
    pub routers: &'a [Router],
    /// Loads.
    pub loads: &'a [Load],
    /// Requests per run.
    pub num_requests: usize,
    /// Seeds: every point runs once per seed.
    pub seeds: &'a [u64],
    /// Clients' `max_tokens` rule and patience.
    pub client: ClientModel,
    /// The engine's saturation on the workload (its rate turns rates into load factors, its
    /// output rate is the ceiling's `Theta` unless a run went faster).
    pub saturation: Saturation,
}

/// Run every policy at every load once per seed, on the same seeded workload per seed.
pub fn sweep(cfg: &SimConfig, workload: &WorkloadSpec, spec: &SweepSpec<'_>) -> Result<Vec<SweepPoint>, Stalled> {
    let sat = spec.saturation;
    let mut points = Vec::new();
    for &load in spec.loads {
        let rate = match load {
            Load::Rate(r) => r,
            Load::Clients(_) => f64::INFINITY,
        };
        let routers = if spec.routers.is_empty() { std::slice::from_ref(&cfg.fleet.router) } else { spec.routers };
        let mut by_policy: Vec<SweepPoint> = spec
            .policies
            .iter()
            .flat_map(|p| routers.iter().map(move |&router| (p, router)))
            .map(|(p, router)| SweepPoint {
                policy: p.to_string(),
                router,
                load,
                rate: if rate.is_finite() { rate } else { 0.0 },
                load_factor: if rate.is_finite() && sat.rate > 0.0 { rate / sat.rate } else { 0.0 },
                saturation: sat,
                theta: sat.output_tps,
                runs: Vec::new(),
            })
            .collect();
        for &seed in spec.seeds {
            let mut reqs = workload.generate(rate, spec.num_requests, seed);
            spec.client.apply(&mut reqs, seed, cfg.sched.max_model_len);
            for point in &mut by_policy {
                let run_cfg = SimConfig { seed, fleet: Fleet { router: point.router, ..cfg.fleet }, ..cfg.clone() };
                let Some(policies) = (0..cfg.fleet.replicas.max(1)).map(|_| crate::policy::by_name(&point.policy)).collect() else { continue };
                let mode = match load {
                    Load::Rate(_) => Mode::Open,
                    Load::Clients(clients) => Mode::Closed { clients },
                };
                let res = run_fleet(&run_cfg, policies, &reqs, mode)?;
                let eval = res.evaluate(&cfg.sched.slo);
                point.runs.push(SeedRun { seed, eval, ceiling: 0.0, ceiling_fraction: 0.0 });
            }
        }
        points.extend(by_policy);
    }
    // Theta: the saturation estimate, unless a policy's engine delivered more during the window
    // at the highest load (mean over seeds), as evaluation.md measures it on a real server. The
    // counted tokens over the window are no measure of the engine: with an unbounded queue they
    // arrive after it.
    let top = spec.loads.iter().filter_map(|l| if let Load::Rate(r) = l { Some(*r) } else { None }).fold(f64::NAN, f64::max);
    let theta = points.iter().filter(|p| matches!(p.load, Load::Rate(r) if r == top)).map(|p| p.mean(|r| r.eval.delivered_tps)).fold(sat.output_tps, f64::max);
    for p in &mut points {
        p.theta = theta;
        for r in &mut p.runs {
            let e = &r.eval;
            (r.ceiling, r.ceiling_fraction) = match p.load {
                Load::Rate(_) => {
                    let c = if e.offered_by_weight.is_empty() { ceiling(e.offered_output_tps, theta) } else { weighted_ceiling(&e.offered_by_weight, theta) };
                    (c, ceiling_fraction(e.stats.smooth_goodput, c))
                }
                Load::Clients(n) => {
                    let c = closed_loop_ceiling(n, e.mean_served_len, theta, &cfg.sched.slo);
                    (c, ceiling_fraction(e.stats.benefit_per_request, c))
                }
            };
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slo::{MaxTokensRule, Patience};

    fn cpu() -> (SimConfig, Preset) {
        let p = preset("cpu-smollm2").unwrap();
        (SimConfig::from_preset(&p), p)
    }

    fn req(arrival: f64, prompt_len: usize, output_len: usize, max_tokens: usize, patience: f64) -> SimRequest {
        SimRequest {
            arrival,
            prompt_len,
            output_len,
            max_tokens,
            patience,
            priority: 0,
            system: 0,
            turn: None,
            reading_rate: None,
            stop_after: None,
            retry: Retry::default(),
        }
    }

    #[test]
    fn outputs_end_at_their_true_length_not_at_max_tokens() {
        let (cfg, _) = cpu();
        let reqs = [req(0.0, 32, 5, 1000, f64::INFINITY), req(0.0, 32, 50, 20, f64::INFINITY)];
        let res = simulate(&SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg }, crate::policy::by_name("fcfs").unwrap(), &reqs).unwrap();
        assert_eq!(res.records[0].num_tokens(), 5, "end of sequence at the true length");
        assert_eq!(res.records[1].num_tokens(), 20, "max_tokens first");
        assert!(res.records.iter().all(|r| r.outcome == Outcome::Completed));
        assert_eq!(res.stats.finished.stop, 1);
        assert_eq!(res.stats.finished.length, 1);
        // Work: 32 prompt tokens and one decode input per further token.
        assert_eq!(res.work, vec![32 + 4, 32 + 19]);
    }

    /// A refused client that retries comes back and is served once the queue has room; one
    /// that does not retry stays refused. Its idle latency runs from its first try.
    #[test]
    fn refused_clients_retry_as_their_model_says() {
        let (mut cfg, _) = cpu();
        cfg = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg };
        cfg.sched.max_queue_requests = 1;
        let run = |retry: Retry| {
            let reqs: Vec<SimRequest> = (0..3).map(|_| SimRequest { retry, ..req(0.0, 40, 20, 20, f64::INFINITY) }).collect();
            simulate(&cfg, crate::policy::by_name("fcfs").unwrap(), &reqs).unwrap()
        };
        let once = run(Retry::default());
        assert_eq!(once.records.iter().filter(|r| r.outcome == Outcome::Rejected).count(), 2);
        for honours_retry_after in [false, true] {
            let res = run(Retry { max: 20, honours_retry_after });
            assert!(res.records.iter().all(|r| r.outcome == Outcome::Completed && r.num_tokens() == 20), "{:?}", res.records);
            assert!(res.stats.rejected.queue_full >= 2, "{:?}", res.stats.rejected);
            assert!(res.records.iter().all(|r| r.arrival == 0.0), "the user's clock starts at the first try");
        }
    }

    /// A reader who stops partway aborts the stream once it has read that far; it ends as served
    /// (with what it got), not as a client who left, and its declared reading rate is its class.
    #[test]
    fn a_reader_who_stops_ends_early_and_is_not_impatient() {
        let (cfg, _) = cpu();
        let cfg = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg };
        let reqs =
            [SimRequest { stop_after: Some(10), reading_rate: Some(20.0), ..req(0.0, 40, 200, 200, f64::INFINITY) }, req(0.0, 40, 200, 200, f64::INFINITY)];
        let res = simulate(&cfg, crate::policy::by_name("fcfs").unwrap(), &reqs).unwrap();
        let (stopped, full) = (&res.records[0], &res.records[1]);
        assert_eq!(stopped.outcome, Outcome::Completed);
        assert_eq!(stopped.class.reading_rate, 20.0);
        assert_eq!(full.class.reading_rate, cfg.sched.slo.default_class.reading_rate);
        assert!((10..200).contains(&stopped.num_tokens()), "{} tokens", stopped.num_tokens());
        assert!(stopped.end >= stopped.class.deadline(0.0, 10), "it stops once it has read the 10th token");
        assert_eq!(full.num_tokens(), 200);
        assert_eq!(res.stats.finished.abort, 1);
    }

    /// Conversations over a shared system prompt: with prefix caching the engine computes a
    /// fraction of the prompt tokens it computes without, every request still gets its whole
    /// answer, and the tokens the model sees are the same.
    #[test]
    fn prefix_caching_saves_the_shared_prompts_work() {
        let (cfg, p) = cpu();
        let spec = WorkloadSpec { sharing: Sharing { system: 400, turns: 6, think_s: 5.0, read_tps: 20.0 }, ..p.workload.clone() };
        let mut reqs = spec.generate(0.2, 240, 9);
        ClientModel { max_tokens: MaxTokensRule::Cap(256), ..ClientModel::default() }.apply(&mut reqs, 9, 8192);
        let run = |caching: bool| {
            let mut c = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg.clone() };
            c.sched.enable_prefix_caching = caching;
            simulate(&c, crate::policy::by_name("fcfs").unwrap(), &reqs).unwrap()
        };
        let (on, off) = (run(true), run(false));
        for res in [&on, &off] {
            for r in &res.records {
                assert_eq!(r.outcome, Outcome::Completed, "{r:?}");
            }
            for (r, q) in res.records.iter().zip(&reqs) {
                assert_eq!(r.num_tokens(), q.served_len());
            }
        }
        let (w_on, w_off) = (on.work.iter().sum::<usize>(), off.work.iter().sum::<usize>());
        assert!((w_on as f64) < 0.3 * w_off as f64, "work with caching {w_on}, without {w_off}");
        let hit = on.evaluate(&cfg.sched.slo).prefix_cache_hit_frac;
        assert!(hit > 0.8, "hit rate {hit}");
        assert_eq!(off.evaluate(&cfg.sched.slo).prefix_cache_hit_frac, 0.0);
        assert!(on.records.iter().map(|r| r.ttft().unwrap()).sum::<f64>() < off.records.iter().map(|r| r.ttft().unwrap()).sum::<f64>());
    }

    #[test]
    fn an_impatient_client_leaves_at_its_deadline_plus_patience() {
        let (cfg, _) = cpu();
        let cfg = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg };
        // A long prompt ahead takes the server ~1 s; the second client waits at most 0.5 s past
        // its first deadline (0.2 s at 5 tok/s), so it leaves at 0.7 s, having got nothing.
        let reqs = [req(0.0, 500, 3, 3, f64::INFINITY), req(0.0, 400, 3, 3, 0.5)];
        let res = simulate(&cfg, crate::policy::by_name("fcfs").unwrap(), &reqs).unwrap();
        let r = &res.records[1];
        assert_eq!((r.outcome, r.num_tokens()), (Outcome::Abandoned, 0));
        assert!((r.end - 0.7).abs() < 1e-9, "left at {}", r.end);
        assert!((r.idle_latency() - 0.5).abs() < 1e-9);
        assert!(res.work[1] > 0, "its prefill had started: wasted work");
        let e = res.evaluate(&cfg.sched.slo);
        assert_eq!(e.stats.abandoned, 1);
        assert!(e.wasted_tokens_frac > 0.0 && e.wasted_tokens_frac < 1.0);
        assert!((r.benefit(&cfg.sched.slo) - (0.0 - 2.5 * 0.5)).abs() < 1e-9);
    }

    #[test]
    fn closed_loop_sends_the_next_request_when_the_last_ends() {
        let (cfg, p) = cpu();
        let mut reqs = p.workload.generate(f64::INFINITY, 60, 3);
        ClientModel { max_tokens: MaxTokensRule::Cap(1024), patience: Patience::None, ..ClientModel::default() }.apply(&mut reqs, 3, 8192);
        let res = run(&cfg, crate::policy::by_name("fcfs").unwrap(), &reqs, Mode::Closed { clients: 4 }).unwrap();
        // Never more than 4 requests live at once.
        let mut events: Vec<(f64, i32)> = res.records.iter().flat_map(|r| [(r.arrival, 1), (r.end, -1)]).collect();
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut live = 0;
        for (_, d) in events {
            live += d;
            assert!(live <= 4);
        }
        assert_eq!(res.counted, (6, 48));
        assert!(res.window.1 > res.window.0);
        // More clients than counted requests: the window still spans the counted requests.
        let many = run(&cfg, crate::policy::by_name("fcfs").unwrap(), &reqs[..20], Mode::Closed { clients: 30 }).unwrap();
        assert_eq!(many.counted, (2, 16));
        let e = many.evaluate(&cfg.sched.slo);
        assert!(e.stats.window_s > 0.5 && e.stats.smooth_goodput.is_finite() && e.stats.smooth_goodput < 1e4, "{:?}", e.stats.window_s);
        let e = res.evaluate(&cfg.sched.slo);
        assert_eq!(e.stats.offered, 42);
        assert!(e.stats.benefit_per_request > 0.0);
    }

    #[test]
    fn the_run_stops_once_every_counted_request_has_ended() {
        let (cfg, p) = cpu();
        let sat = saturation(&cfg, &p.workload, &ClientModel::default(), 0, 1);
        let mut reqs = p.workload.generate(2.0 * sat.rate, 400, 5);
        ClientModel { max_tokens: MaxTokensRule::Cap(1024), patience: Patience::Exp(20.0), ..ClientModel::default() }.apply(&mut reqs, 5, 8192);
        let res = simulate(&cfg, crate::policy::by_name("fcfs").unwrap(), &reqs).unwrap();
        let (lo, hi) = res.counted;
        assert!(res.records[lo..hi].iter().all(|r| r.outcome != Outcome::Aborted), "every counted request ended by itself");
        assert!(res.records[lo].arrival >= res.window.0 && res.records[hi - 1].arrival <= res.window.1);
        let last_counted = res.records[lo..hi].iter().map(|r| r.end).fold(0.0, f64::max);
        assert!(res.end <= last_counted + 5.0, "stopped within a step or two of the last counted end ({} vs {last_counted})", res.end);
        assert!(res.records[hi..].iter().any(|r| r.outcome == Outcome::Aborted), "the uncounted tail was cut");
    }

    #[test]
    fn the_prior_error_is_seeded_and_bounded() {
        let (cfg, _) = cpu();
        let cfg = SimConfig { prior_error: 0.3, seed: 9, ..cfg };
        let (a, b) = (cfg.scheduler_prior(), cfg.scheduler_prior());
        assert_eq!(a, b);
        let truth = cfg.sched.cost_prior;
        let ratio = a.per_prefill_token_s / truth.per_prefill_token_s;
        assert!((1.0 / 1.3..=1.3).contains(&ratio) && (ratio - 1.0).abs() > 1e-6);
        assert_ne!(SimConfig { seed: 10, ..cfg.clone() }.scheduler_prior(), a);
    }

    #[test]
    fn closed_loop_ceiling_arithmetic() {
        let params = SloParams::default(); // q = 5, alpha 2.5, linear
                                           // 8 clients x 5 tok/s = 40 <= 80: everyone fed.
        assert_eq!(closed_loop_ceiling(8, 100.0, 80.0, &params), 100.0);
        // 32 clients: cycle 32 * 100 / 80 = 40 s, reading 20 s, wait 20 s: 100 - 50.
        assert!((closed_loop_ceiling(32, 100.0, 80.0, &params) - 50.0).abs() < 1e-9);
        assert_eq!(closed_loop_ceiling(1000, 100.0, 80.0, &params), 0.0);
    }
}
